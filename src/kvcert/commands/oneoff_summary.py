"""What a one-off run (``kvcert run``, :mod:`kvcert.commands.oneoff`) reports from its records: per (task,
setting) the share that passes, the mean score and the mean relative certificate ε/‖ô‖, each with a
percentile bootstrap interval over records (:data:`BOOTSTRAP`), and the kept fraction
(:func:`summary_rows`, printed by :func:`format_table`); RULER's table per setting (:func:`ruler_summary`,
:func:`ruler_tables`) and LongBench-E's scores by length bucket (:func:`longbench_e_buckets`,
:func:`longbench_e_tables`).
"""

from __future__ import annotations

import math

#: percentile bootstrap of the per-setting means: resamples of the records, level, seed
BOOTSTRAP = {"resamples": 2000, "level": 0.90, "seed": 0}


def _interval(values: list[float]) -> dict:
    """The mean of ``values`` with its percentile bootstrap interval over records (:data:`BOOTSTRAP`)."""
    import numpy as np

    x = np.asarray([v for v in values if v is not None and not math.isnan(v)], dtype=float)
    if len(x) == 0:
        return {"value": None, "ci": [None, None]}
    rng = np.random.default_rng(BOOTSTRAP["seed"])
    means = x[rng.integers(0, len(x), size=(BOOTSTRAP["resamples"], len(x)))].mean(1)
    tail = (1 - BOOTSTRAP["level"]) / 2
    return {"value": float(x.mean()), "ci": [float(np.quantile(means, tail)), float(np.quantile(means, 1 - tail))]}


def _relative_radius(record: dict) -> float | None:
    """The record's plug-in certificate relative to the output, ε/‖ô‖, mean over steps (of the mean over heads)."""
    steps = (record.get("certificate") or {}).get("relative_steps", {}).get("mean") or []
    return sum(steps) / len(steps) if steps else None


def _mean(per_layer) -> float:
    """A record's kept fraction (per layer) as one number: the mean over layers."""
    if isinstance(per_layer, (int, float)):
        return float(per_layer)
    return sum(per_layer) / len(per_layer) if per_layer else 1.0


def summary_rows(records: list[dict], pass_mark) -> list[dict]:
    """Per (task, setting): records; the share that passes (score ≥ ``pass_mark(task)``, the pass mark the
    claims use), the mean score and the mean relative certificate ε/‖ô‖, each with its bootstrap interval
    over records; the kept fraction."""
    groups: dict[tuple, list[dict]] = {}
    for r in records:
        groups.setdefault((r["task"], r["condition"], r["method"], r["budget"]), []).append(r)
    rows = []
    for (task, condition, method, budget), group in groups.items():
        scores = [r["score"] for r in group if r["score"] is not None]
        mark = pass_mark(task)
        rows.append({
            "task": task, "condition": condition, "method": method, "budget": budget, "records": len(group),
            "pass_mark": mark, "passed": _interval([float(x >= mark) for x in scores]),
            "score": _interval([float(x) for x in scores]),
            "relative_radius": _interval([_relative_radius(r) for r in group]),
            "kept": sum(_mean(r["kept_fraction"]) for r in group) / len(group),
        })
    return rows


def _cell(estimate: dict, digits: int = 3) -> str:
    if estimate["value"] is None:
        return "-"
    low, high = estimate["ci"]
    return f"{estimate['value']:.{digits}f} [{low:.{digits}f}, {high:.{digits}f}]"


def format_table(rows: list[dict]) -> str:
    """The summary as a text table: passed = share with score ≥ the task's pass mark; score = mean task
    score (F1 for LongBench QA, string match for needles, ...); ε/‖ô‖ = the plug-in certificate relative to
    the attention output; [90 % bootstrap intervals over records]."""
    head = (f"{'task':<22} {'condition':<10} {'method':<22} {'budget':>6} {'records':>7} {'passed':>21} "
            f"{'score':>21} {'ε/‖ô‖ (certificate)':>27} {'kept':>6}")
    lines = [head]
    for r in rows:
        lines.append(f"{r['task']:<22} {r['condition']:<10} {r['method']:<22} {r['budget']:>6.3g} {r['records']:>7} "
                     f"{_cell(r['passed']):>21} {_cell(r['score']):>21} {_cell(r['relative_radius'], 4):>27} "
                     f"{r['kept']:>6.3f}")
    marks = sorted({(r["task"], r["pass_mark"]) for r in rows})
    lines.append("passed: score >= the pass mark (" + ", ".join(f"{t} {m:g}" for t, m in marks)
                 + f"); [{BOOTSTRAP['level']:.0%} bootstrap intervals over records]")
    return "\n".join(lines)


def _setting(r: dict) -> str:
    return "full" if r["method"] == "full" else f"{r['method']} {r['condition']} {r['budget']:g}"


def ruler_means(records: list[dict]) -> dict[str, dict[str, float]]:
    """Per setting, the mean score in [0, 1] of each RULER task among ``records`` (RULER's order)."""
    from ..tasks.ruler import PREFIX, RULER_TASKS

    groups: dict[str, dict[str, list[float]]] = {}
    for r in records:
        if r["task"].startswith(PREFIX) and r["task"][len(PREFIX):] in RULER_TASKS and r["score"] is not None:
            groups.setdefault(_setting(r), {}).setdefault(r["task"], []).append(float(r["score"]))
    order = [PREFIX + name for name in RULER_TASKS]
    return {setting: {t: sum(v) / len(v) for t in order if (v := tasks.get(t))} for setting, tasks in groups.items()}


def ruler_summary(records: list[dict]) -> dict[str, dict[str, float]]:
    """Per setting, each RULER task's ``string_match`` (mean × 100, RULER's rounding) and their ``average``, as the
    table shows them (results.json's ``ruler``)."""
    out = {}
    for setting, means in ruler_means(records).items():
        scores = {t: round(100 * m, 2) for t, m in means.items()}
        out[setting] = {**scores, "average": round(sum(scores.values()) / len(scores), 2)}
    return out


def ruler_tables(records: list[dict]) -> str:
    """RULER's summary of a run's records of RULER tasks, per setting (:func:`kvcert.tasks.ruler.summary_table`:
    each task's mean string match × 100 and their average); empty where the run has none."""
    from ..tasks.ruler import summary_table

    return "\n".join(f"RULER, {setting}:\n" + summary_table(means) for setting, means in ruler_means(records).items())


def longbench_e_buckets(records: list[dict]) -> dict[str, dict[str, dict[str, float]]]:
    """Per setting and LongBench-E data set (``longbench_<name>_e``) among ``records``: the scores × 100 by length
    bucket, as ``eval.py --e`` reports them (:func:`kvcert.tasks.longbench_metrics.bucket_scores`, on the rows' own
    ``length`` field)."""
    from ..tasks.longbench_metrics import bucket_scores

    groups: dict[tuple[str, str], tuple[list[float], list[float]]] = {}
    for r in records:
        meta = r.get("metadata") or {}
        if r["task"].startswith("longbench_") and r["task"].endswith("_e") and r["score"] is not None \
                and meta.get("longbench_length") is not None:
            scores, lengths = groups.setdefault((_setting(r), r["task"]), ([], []))
            scores.append(float(r["score"]))
            lengths.append(float(meta["longbench_length"]))
    out: dict[str, dict[str, dict[str, float]]] = {}
    for (setting, task), (scores, lengths) in groups.items():
        out.setdefault(setting, {})[task] = bucket_scores(scores, lengths)
    return out


def longbench_e_tables(records: list[dict]) -> str:
    """:func:`longbench_e_buckets` as a text table; empty where the run has no LongBench-E record."""
    from ..tasks.longbench_metrics import LENGTH_BUCKETS

    buckets = longbench_e_buckets(records)
    if not buckets:
        return ""
    names = [n for n, _ in LENGTH_BUCKETS]
    lines = [f"LongBench-E by length (eval.py --e): {'task':<32} {'setting':<28} " + " ".join(f"{n:>7}" for n in names)]
    for setting, tasks in buckets.items():
        for task, scores in tasks.items():
            lines.append(f"{'':<37}{task:<32} {setting:<28} " + " ".join(f"{scores[n]:>7.2f}" for n in names))
    return "\n".join(lines)
