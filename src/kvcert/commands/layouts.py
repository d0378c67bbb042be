"""``kvcert run``'s records in the layouts users of kvpress and of lm-evaluation-harness read.

Beside ``results.json``, :func:`write_layouts` writes, from the run's records and the task records they
answer (no new scoring: every number is the records' own score):

* **kvpress** (``<out>/kvpress/<folder>/``), one folder per setting and data set, as kvpress's
  ``evaluation/evaluate.py`` writes one per run (``EvaluationRunner.run_evaluation``): ``predictions.csv``
  (its data set's columns but ``context`` — ``question``, ``answer_prefix``, ``answer``, ``task``,
  ``max_new_tokens`` — with ``predicted_answer`` and ``compression_ratio``; then kvcert's own columns),
  ``metrics.json`` (RULER: ``{task: {"string_match": mean × 100, rounded to 2}}``, as
  ``evaluation/benchmarks/ruler/calculate_metrics.py`` returns it) and ``config.yaml`` (the fields of its
  ``EvaluationConfig`` that apply: ``dataset``, ``data_dir``, ``model``, ``press_name``,
  ``compression_ratio``, ``query_aware``, …, and a ``kvcert`` block). The folder is named as
  ``EvaluationConfig.get_results_dir`` names it: ``<dataset>__<data_dir>__<model>__<press_name>__<ratio:.2f>``
  (``__query_aware`` for a question-aware run). RULER's tasks of a setting share one folder, data set
  ``ruler`` and data dir the prompt length (kvpress's ``--dataset ruler --data_dir 4096``, what its
  leaderboard runs); the full cache is kvpress's ``no_press`` at ratio 0.00. Another task is its own data
  set, its metric named ``score`` (the task's own: string match, recall, LongBench's F1, …, × 100).
  ``answer`` is a JSON list (read it with ``converters={"answer": json.loads}``).
* **lm-evaluation-harness** (``<out>/lm-eval/<setting>/<model>/``), as ``lm_eval --output_path
  <out>/lm-eval/<setting> --log_samples`` writes (``lm_eval/loggers/evaluation_tracker.py``):
  ``results_<date>.json`` (``results`` with ``name``, ``alias``, ``sample_len``, ``"score,none"``,
  ``"score_stderr,none"``, ``"passed,none"``, … per task, ``n-samples``, ``higher_is_better``, ``config``,
  ``model_name``, ``task_hashes``; the keys of ``lm_eval/result_schema.py``; ``model_name`` is the model's
  name, the folder lm-eval names after it, and ``config.model_args`` its ``pretrained=`` path) and ``samples_<task>_<date>.jsonl`` (one line per record: ``doc_id``,
  ``doc``, ``target``, ``arguments``, ``resps``, ``filtered_resps``, ``filter``, ``metrics``, the three
  hashes and the metric values, as its evaluator logs a sample), ``<date>`` its ``date_id``
  (``datetime.isoformat()`` with ``:`` as ``-``). A setting is what lm-eval would run as one model (its
  ``model_args`` name the method, condition and budget).

A run's layouts and its ``results.json`` are written whole: into a hidden staging folder of ``out``
(:func:`staging_folder`), then put in place together (:func:`publish`), replacing the earlier run's of the
same ``out``; a run killed on the way leaves nothing a reader takes for a run. Each kvpress folder's
``config.yaml`` carries the SHA-256 of its ``predictions.csv`` and ``metrics.json`` (``kvcert.files``).

:func:`read_kvpress_runs` reads such folders back, kvpress's own and kvcert's alike (a kvcert folder whose files
disagree refused, :func:`check_kvpress_folder`), and :func:`kvpress_table` sets them side by side (docs/kvpress.md).
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import math
import os
import re
from datetime import datetime
from pathlib import Path

#: kvpress's name of the uncompressed run (its ``no_press``, compression ratio 0)
NO_PRESS = "no_press"
#: the columns of kvpress's predictions.csv for a RULER-style data set (its data set's columns but ``context``,
#: then what ``evaluate.py`` adds), then kvcert's own
KVPRESS_COLUMNS = ("question", "answer_prefix", "answer", "task", "max_new_tokens", "predicted_answer",
                   "compression_ratio")
KVCERT_COLUMNS = ("id", "score", "passed", "certificate_status", "relative_radius", "kept_fraction")
#: lm-eval's filter name for unfiltered responses
LM_EVAL_FILTER = "none"


def _sha256(text: str) -> str:
    """lm-eval's ``hash_string``: the SHA-256 hex digest of the UTF-8 text."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _stderr(values: list[float]) -> float | str:
    """lm-eval's ``mean_stderr``: the sample standard deviation over √n; "N/A" below two values."""
    if len(values) < 2:
        return "N/A"
    mu = sum(values) / len(values)
    return math.sqrt(sum((v - mu) ** 2 for v in values) / (len(values) - 1)) / math.sqrt(len(values))


def _relative_radius(record: dict) -> float | None:
    steps = (record.get("certificate") or {}).get("relative_steps", {}).get("mean") or []
    return sum(steps) / len(steps) if steps else None


def _kept(record: dict) -> float:
    kept = record.get("kept_fraction")
    if isinstance(kept, (int, float)):
        return float(kept)
    return sum(kept) / len(kept) if kept else 1.0


def setting_of(record: dict) -> tuple[str, str, float]:
    """(method, condition, budget) of a record: the setting it was generated under."""
    return record["method"], record["condition"], float(record["budget"])


def compression_ratio(record: dict) -> float:
    """kvpress's ``compression_ratio``: the share of the cache removed (0 for the full cache)."""
    return 0.0 if record["method"] == "full" else round(1.0 - float(record["budget"]), 6)


def kvpress_dataset(task: str, length: int | None) -> tuple[str, str, str]:
    """(kvpress data set, its data dir, the task's name in it): RULER's tasks are kvpress's ``ruler`` data set
    at ``data_dir`` = the prompt length, under their RULER names; another task is a data set of its own."""
    from ..tasks.ruler import PREFIX, RULER_TASKS

    if task.startswith(PREFIX) and task[len(PREFIX):] in RULER_TASKS:
        return "ruler", str(length or ""), task[len(PREFIX):]
    return task, "", task


def kvpress_folder_name(dataset: str, data_dir: str, model: str, press_name: str, ratio: float,
                        query_aware: bool) -> str:
    """The folder kvpress's ``EvaluationConfig.get_results_dir`` names for these settings (its components
    joined by ``__``, empty ones left out; ``/`` in the model's name as ``--``)."""
    parts = [dataset, data_dir, model.replace("/", "--"), press_name, f"{ratio:.2f}"]
    if query_aware:
        parts.append("query_aware")
    return "__".join(p for p in parts if p)


def _press_init_command(record: dict) -> str | None:
    if record["method"] == "full":
        return None
    return (f"EvictionPress(scorer={record.get('scorer')!r}, sampler={record.get('sampler')!r}, "
            f"allocation={record.get('allocation')!r}, compression_ratio={compression_ratio(record):g})")


def _csv(rows: list[dict], columns: tuple[str, ...]) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(columns), lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return buffer.getvalue()


def _yaml(data: dict) -> str:
    import yaml

    return yaml.safe_dump(data, default_flow_style=False, indent=2, sort_keys=False, allow_unicode=True)


def kvpress_runs(records: list[dict], tasks: dict[str, dict], model: str, pass_mark, run: dict) -> dict[str, dict]:
    """Folder name → its three files' content (``predictions.csv``, ``metrics.json``, ``config.yaml``) for
    ``records``. ``tasks``: per task name, ``records`` (id → its :class:`~kvcert.tasks.records.TaskRecord`),
    ``length`` and ``max_new_tokens``; ``pass_mark(task)`` as the claims count a pass; ``run``: what
    ``config.yaml``'s ``kvcert`` block names (command, device, seed, data seed, ...)."""
    groups: dict[tuple, list[dict]] = {}
    for r in records:
        dataset, data_dir, _ = kvpress_dataset(r["task"], tasks[r["task"]]["length"])
        groups.setdefault((setting_of(r), dataset, data_dir), []).append(r)
    out: dict[str, dict] = {}
    for ((method, condition, budget), dataset, data_dir), group in groups.items():
        first = group[0]
        full = method == "full"
        press = NO_PRESS if full else method
        ratio = compression_ratio(first)
        name = kvpress_folder_name(dataset, data_dir, model, press, ratio, condition == "aware")
        if condition not in ("aware", "streaming", "full"):
            name += f"__{condition}"
        if name in out:  # two budgets that round to the same two digits
            name += f"__budget{budget:g}"
        rows, per_task = [], {}
        for r in group:
            task = tasks[r["task"]]
            source = task["records"].get(r["example_id"])
            _, _, short = kvpress_dataset(r["task"], task["length"])
            score = r.get("score")
            rows.append({
                "question": source.question if source else "",
                "answer_prefix": source.answer_prefix if source else "",
                "answer": json.dumps(list(r.get("answers") or []), ensure_ascii=False),
                "task": short, "max_new_tokens": task["max_new_tokens"], "predicted_answer": r.get("answer", ""),
                "compression_ratio": ratio, "id": r["example_id"], "score": score,
                "passed": None if score is None else int(score >= pass_mark(r["task"])),
                "certificate_status": r.get("certificate_status"), "relative_radius": _relative_radius(r),
                "kept_fraction": round(_kept(r), 6),
            })
            if score is not None:
                per_task.setdefault(short, []).append(float(score))
        metric = "string_match" if dataset == "ruler" else "score"
        metrics = {task: {metric: round(100 * sum(v) / len(v), 2)} for task, v in per_task.items()}
        config = {
            "dataset": dataset, "data_dir": data_dir or None, "model": model, "device": run.get("device"),
            "press_name": press, "compression_ratio": ratio, "fraction": 1.0,
            "max_new_tokens": max(tasks[t]["max_new_tokens"] for t in {r["task"] for r in group}),
            "query_aware": condition == "aware", "output_dir": run.get("output_dir"), "model_kwargs": {},
            "press_init_command": _press_init_command(first), "seed": int(first.get("seed") or 0),
            "kvcert": {"method": method, "condition": condition, "budget": budget,
                       "scorer": first.get("scorer"), "sampler": first.get("sampler"),
                       "allocation": first.get("allocation"),
                       "tasks": sorted({r["task"] for r in group}), "records": len(group),
                       "length": {t: tasks[t]["length"] for t in sorted({r["task"] for r in group})},
                       **{k: v for k, v in run.items() if k not in ("device", "output_dir")}},
        }
        files = {"predictions.csv": _csv(rows, KVPRESS_COLUMNS + KVCERT_COLUMNS),
                 "metrics.json": json.dumps(metrics, indent=4) + "\n"}
        config["kvcert"]["files"] = {f: _sha256(text) for f, text in files.items()}  # the folder is one run's
        out[name] = {**files, "config.yaml": _yaml(config)}
    return out


def lm_eval_date_id(when: datetime) -> str:
    """lm-eval's ``date_id``: the ISO time with ``:`` as ``-`` (a file name's timestamp, no ``_`` in it); an
    aware time as its naive UTC."""
    from datetime import timezone

    if when.tzinfo is not None:
        when = when.astimezone(timezone.utc).replace(tzinfo=None)
    return when.isoformat().replace(":", "-")


def sanitize_model_name(name: str) -> str:
    """lm-eval's ``sanitize_model_name``: characters a folder name cannot hold as ``__``."""
    return re.sub(r"[\"<>:/|\\?*\[\]]+", "__", name)


def setting_slug(method: str, condition: str, budget: float) -> str:
    """The folder of one setting's lm-eval output (``--output_path``)."""
    return "full" if method == "full" else f"{method}__{condition}__budget{budget:g}"


def lm_eval_runs(records: list[dict], tasks: dict[str, dict], model: str, model_path: str, pass_mark,
                 run: dict, when: datetime) -> dict[str, str]:
    """Relative path (``<setting>/<model>/results_<date>.json``, ``…/samples_<task>_<date>.jsonl``) → content,
    one lm-eval output per setting (``tasks`` and ``pass_mark`` as in :func:`kvpress_runs`)."""
    date_id = lm_eval_date_id(when)
    sanitized = sanitize_model_name(model)
    groups: dict[tuple, dict[str, list[dict]]] = {}
    for r in records:
        groups.setdefault(setting_of(r), {}).setdefault(r["task"], []).append(r)
    files: dict[str, str] = {}
    for (method, condition, budget), by_task in groups.items():
        folder = f"{setting_slug(method, condition, budget)}/{sanitized}"
        results, configs, hashes, n_samples, higher = {}, {}, {}, {}, {}
        for task_name, group in by_task.items():
            task = tasks[task_name]
            mark = pass_mark(task_name)
            lines, sample_hashes, scores, passed, radii = [], [], [], [], []
            for doc_id, r in enumerate(group):
                source = task["records"].get(r["example_id"])
                prompt = (source.context + source.separator + source.question) if source else ""
                target = list(r.get("answers") or [])
                gen_kwargs = {"until": [], "max_gen_toks": task["max_new_tokens"], "do_sample": False}
                score = r.get("score")
                values = {} if score is None else {"score": float(score), "passed": float(score >= mark)}
                if (radius := _relative_radius(r)) is not None:
                    values["relative_radius"] = radius
                doc = {"id": r["example_id"], "context": source.context if source else None,
                       "question": source.question if source else None, "answers": target,
                       "length": source.length if source else None,
                       "metadata": source.metadata if source else r.get("metadata")}
                sample = {
                    "doc_id": doc_id, "doc": doc, "target": str(target),
                    "arguments": {"gen_args_0": {"arg_0": prompt, "arg_1": gen_kwargs}},
                    "resps": [[r.get("answer", "")]], "filtered_resps": [r.get("answer", "")],
                    "filter": LM_EVAL_FILTER, "metrics": list(values),
                    "doc_hash": _sha256(json.dumps(doc, indent=2, default=str, ensure_ascii=False)),
                    "prompt_hash": _sha256(prompt), "target_hash": _sha256(str(target)),
                    **values,
                    "kvcert": {"certificate_status": r.get("certificate_status"), "kept_fraction": _kept(r),
                               "condition": condition, "method": method, "budget": budget},
                }
                lines.append(json.dumps(sample, ensure_ascii=False, default=str))
                sample_hashes.append(sample["doc_hash"] + sample["prompt_hash"] + sample["target_hash"])
                if score is not None:
                    scores.append(float(score))
                    passed.append(float(score >= mark))
                if radius is not None:
                    radii.append(radius)
            hashes[task_name] = _sha256("".join(sample_hashes))  # lm-eval's task hash over its samples' hashes
            metrics = {"name": task_name, "alias": task_name}
            for key, series in (("score", scores), ("passed", passed), ("relative_radius", radii)):
                if series:
                    metrics[f"{key},{LM_EVAL_FILTER}"] = _mean(series)
                    metrics[f"{key}_stderr,{LM_EVAL_FILTER}"] = _stderr(series)
            metrics["sample_len"] = len(group)
            results[task_name] = metrics
            higher[task_name] = {"score": True, "passed": True, **({"relative_radius": False} if radii else {})}
            n_samples[task_name] = {"original": task["offered"], "effective": len(group)}
            configs[task_name] = {"task": task_name, "output_type": "generate_until",
                                  "generation_kwargs": {"until": [], "max_gen_toks": task["max_new_tokens"],
                                                        "do_sample": False},
                                  "metadata": {"length": task["length"], "pass_mark": mark}}
            files[f"{folder}/samples_{task_name}_{date_id}.jsonl"] = "\n".join(lines) + "\n"
        model_args = f"pretrained={model_path},method={method},condition={condition},budget={budget:g}"
        doc = {
            "results": results, "group_subtasks": {t: [] for t in results}, "configs": configs,
            "versions": {t: run.get("kvcert_version") for t in results}, "n-shot": {t: 0 for t in results},
            "higher_is_better": higher, "n-samples": n_samples,
            "config": {"model": "kvcert", "model_args": model_args, "batch_size": 1, "device": run.get("device"),
                       "limit": run.get("limit"), "random_seed": run.get("data_seed"),
                       "gen_kwargs": {"do_sample": False}},
            "git_hash": run.get("git_commit"), "date": when.timestamp(),
            "model_source": "kvcert", "model_name": model, "model_name_sanitized": sanitized,
            "task_hashes": hashes, "kvcert": run,
        }
        files[f"{folder}/results_{date_id}.json"] = json.dumps(doc, indent=2, default=str, ensure_ascii=False) + "\n"
    return files


def write_layouts(out: Path, records: list[dict], tasks: dict[str, dict], model: str, model_path: str,
                  pass_mark, run: dict, when: datetime, into: Path | None = None) -> dict[str, list[str]]:
    """Write both layouts (``kvpress/``, ``lm-eval/``) under ``into`` (a :func:`staging_folder`, which
    :func:`publish` puts in place; default ``out`` itself); the paths they have under ``out``, by layout."""
    from ..atomic import write_text

    into = out if into is None else into
    written: dict[str, list[str]] = {"kvpress": [], "lm_eval": []}
    for name, files in kvpress_runs(records, tasks, model, pass_mark, run).items():
        for filename, text in files.items():
            write_text(into / "kvpress" / name / filename, text)
        written["kvpress"].append(str(out / "kvpress" / name))
    for relative, text in lm_eval_runs(records, tasks, model, model_path, pass_mark, run, when).items():
        write_text(into / "lm-eval" / relative, text)
        written["lm_eval"].append(str(out / "lm-eval" / relative))
    return written


#: what a run puts in its ``out`` folder at the end, all at once (:func:`publish`)
PUBLISHED = ("kvpress", "lm-eval", "results.json")
#: the hidden folder a run writes them in (``.kvcert-writing.<pid>``), and its name while they are put in place
WRITING, PUBLISHING = ".kvcert-writing", ".kvcert-publishing"


def _pid_of(path: Path) -> int | None:
    head, _, pid = path.name.rpartition(".")
    return int(pid) if head in (WRITING, PUBLISHING) and pid.isdigit() else None


def staging_folder(out: Path) -> Path:
    """A new hidden folder in ``out`` (``.kvcert-writing.<pid>``) to write a run's layouts and ``results.json`` in
    (:func:`write_layouts`), none of which a reader takes for a run until :func:`publish` puts them in place.
    The staging folders of runs no longer alive (killed while they wrote or published) are removed first."""
    import shutil

    from ..atomic import _alive

    for path in sorted(out.glob(".kvcert-*")):
        pid = _pid_of(path)
        if pid is not None and path.is_dir() and (pid == os.getpid() or not _alive(pid)):
            shutil.rmtree(path, ignore_errors=True)
    staging = out / f"{WRITING}.{os.getpid()}"
    staging.mkdir(parents=True)
    return staging


def publish(out: Path, staging: Path) -> None:
    """Put the run written in ``staging`` in place of what ``out`` holds (:data:`PUBLISHED`): the folder is renamed
    ``.kvcert-publishing.<pid>`` (from then on :func:`read_kvpress_runs` refuses this ``out``'s folders until the
    end), the earlier ``results.json`` is moved into it first, then each earlier layout folder and the new one
    renamed in its place, the new ``results.json`` last, and the folder with the earlier run removed. A rerun into
    the same ``out`` so replaces the whole of the earlier run's layouts (no second dated lm-eval pair beside
    them); a run killed before this leaves the earlier run as it was, one killed during it a marker that
    refuses the half-published folders and that the next run into ``out`` removes."""
    import shutil

    publishing = out / f"{PUBLISHING}.{os.getpid()}"
    os.rename(staging, publishing)
    replaced = publishing / ".replaced"
    replaced.mkdir()
    if (out / "results.json").exists():
        os.replace(out / "results.json", replaced / "results.json")
    for name in PUBLISHED[:-1]:
        if (out / name).exists():
            os.rename(out / name, replaced / name)
        if (publishing / name).exists():
            os.rename(publishing / name, out / name)
    os.replace(publishing / "results.json", out / "results.json")
    shutil.rmtree(publishing, ignore_errors=True)


class LayoutRefused(ValueError):
    """A kvpress run folder whose files are not of one run; the message names it and says what to do."""


def check_kvpress_folder(folder: Path, config: dict) -> None:
    """Refuse, in one line, a kvpress run folder that kvcert wrote (``config.yaml`` with a ``kvcert`` block) whose
    files are not of one run: ``predictions.csv`` or ``metrics.json`` other than the ones its ``config.yaml`` was
    written with (``kvcert.files``: their SHA-256), ``predictions.csv`` rows other than its ``kvcert.records``,
    or a folder of an ``out`` whose run was killed while it put its layouts in place (a ``.kvcert-publishing.*``
    beside ``kvpress/``). kvpress's own folders are read as they are."""
    block = config.get("kvcert")
    if not isinstance(block, dict):
        return
    redo = f"rerun the kvcert run into that out= (its finished generations are kept), or delete {folder}"
    if folder.parent.name == "kvpress":
        marker = next((p for p in sorted(folder.parent.parent.glob(f"{PUBLISHING}.*")) if p.is_dir()), None)
        if marker is not None:
            raise LayoutRefused(f"{folder}: a kvcert run was killed while it put its layouts in place ({marker}): "
                                f"the folders beside it may be of two runs; {redo}")
    for name, digest in dict(block.get("files") or {}).items():
        path = folder / name
        if not path.is_file() or hashlib.sha256(path.read_bytes()).hexdigest() != digest:
            raise LayoutRefused(f"{folder}: its {name} is {'missing' if not path.is_file() else 'not'} the one its "
                                f"config.yaml was written with (the files are of two runs: a run killed while it "
                                f"wrote them, or files copied over); {redo}")
    predictions = folder / "predictions.csv"
    if isinstance(block.get("records"), int) and predictions.is_file():
        with open(predictions, newline="", encoding="utf-8") as fh:
            rows = sum(1 for _ in csv.DictReader(fh))
        if rows != block["records"]:
            raise LayoutRefused(f"{folder}: predictions.csv holds {rows} rows, its config.yaml says "
                                f"{block['records']} records (limit: {block.get('limit')}): the files are of two "
                                f"runs; {redo}")


def read_kvpress_runs(*roots: Path | str) -> list[dict]:
    """Every kvpress run folder below ``roots`` — a folder holding ``config.yaml`` and ``metrics.json``, as
    kvpress's ``evaluate.py`` writes it and as :func:`write_layouts` does — as one row: its source (the root it
    was found under), ``config.yaml``'s ``dataset``, ``data_dir``, ``model``, ``press_name``,
    ``compression_ratio`` and ``query_aware``, and ``metrics`` {task: its first metric's value}. Hidden folders
    (a run's staging folder) are not searched; a kvcert folder whose files disagree is refused
    (:func:`check_kvpress_folder`)."""
    import yaml

    rows = []
    for root in map(Path, roots):
        if not root.is_dir():
            raise FileNotFoundError(f"{root}: no such folder (give a kvpress results folder or kvcert run's "
                                    "<out>/kvpress)")
        for metrics_file in sorted(root.rglob("metrics.json")):
            config_file = metrics_file.with_name("config.yaml")
            if not config_file.is_file() or any(p.startswith(".") for p in metrics_file.relative_to(root).parts):
                continue
            config = yaml.safe_load(config_file.read_text()) or {}
            check_kvpress_folder(metrics_file.parent, config if isinstance(config, dict) else {})
            metrics = json.loads(metrics_file.read_text())
            rows.append({"source": str(root), **{k: config.get(k) for k in (
                "dataset", "data_dir", "model", "press_name", "compression_ratio", "query_aware")},
                "metrics": {task: next(iter(values.values())) for task, values in metrics.items()
                            if isinstance(values, dict) and values}})
    return rows


def kvpress_table(runs: list[dict]) -> str:
    """``runs`` (:func:`read_kvpress_runs`) as a Markdown table, tasks down and runs across (a column a run: its
    press, compression ratio and ``qa`` where query-aware; its model where the runs hold several, its source's
    number where they come from several roots, listed below the table), each task's value and their average."""
    if not runs:
        return "no kvpress run folders (config.yaml and metrics.json) found"
    tasks = sorted({t for r in runs for t in r["metrics"]})
    models = len({r["model"] for r in runs}) > 1
    sources = list(dict.fromkeys(r["source"] for r in runs))
    heads = [(f"{r['model']} " if models else "") + f"{r['press_name']} {float(r['compression_ratio'] or 0):.2f}"
             + (" qa" if r.get("query_aware") else "") + (f" ({sources.index(r['source']) + 1})" if len(sources) > 1 else "")
             for r in runs]
    lines = ["| task | " + " | ".join(heads) + " |", "|---|" + "---:|" * len(runs)]
    for task in tasks:
        lines.append(f"| {task} | " + " | ".join(
            f"{r['metrics'][task]:.2f}" if task in r["metrics"] else "–" for r in runs) + " |")
    averages = [sum(r["metrics"].values()) / len(r["metrics"]) if r["metrics"] else None for r in runs]
    lines.append("| **average** | " + " | ".join("–" if a is None else f"**{a:.2f}**" for a in averages) + " |")
    if len(sources) > 1:
        lines += ["", "; ".join(f"({i}) {source}" for i, source in enumerate(sources, 1))]
    return "\n".join(lines)
