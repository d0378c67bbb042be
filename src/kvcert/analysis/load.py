"""Generation shards → one scored row per generation, checked against the frozen pre-registration.

Reads shards with :func:`kvcert.generation.shards.read_records` (a corrupt line stops
the analysis naming path:line) and refuses, in one line each:

* a record that is not a :class:`~kvcert.generation.record.GenerationRecord` (a field
  missing or unknown; the message names the field, the file and the line);
* a record whose ``prereg_hash`` differs from the verified freeze (the message names the
  file and both hashes): records of another pre-registration are never scored against
  this one (docs/design.md §3);
* two records with the same generation key (``model, task, target_tokens,
  example_id, condition, method, budget, seed``), which would be counted twice;
* a shard whose records were made at two record-code digests (``code_digest``), :func:`check_one_code`;
* records of one model made from two different model folders (two ``model_digest`` values:
  weights replaced between shards), :func:`check_model_digests`;
* with the plan's content of each shard (:class:`PlannedShard`, ``kvcert score
  --experiment``): a record whose key is not one the plan puts at that path (an
  invented example id, a shard moved to another cell, a partial file of another cell),
  a planned record that is missing, and a record whose ``config_hash`` differs from the
  hash of the config its job composes now (the message names both hashes).

The stored ``score`` is a cache, not the truth: every record is **rescored** from its
``answer`` and ``answers`` with its task's metric (:func:`kvcert.tasks.score_record`,
what the engine ran); the table holds the derived score, and where the two differ the
count goes into the provenance (``rescored``) and the score step names the first one.

A record whose ``started_utc`` precedes the freeze time — and, when the verification
the jobs read is known (``verified_utc`` of ``kvcert prereg verify --out``), precedes
that verification too: no job starts before the verification it read, so a record
stamped after it was made after the freeze whatever the freezing machine's clock said —
is kept in the table, flagged ``pre_freeze``, listed in the report and excluded from
scoring (compared at the one-second resolution of ``started_utc``).

Derived columns (``analysis_plan`` of ``claims.yaml``):

* ``correct`` — score ≥ the pass mark (``correctness``: the default, or the longest
  matching task-name prefix); NaN when the record has no score;
* ``cert_signal`` — ``certificate.<field>.<aggregation>`` reduced over decode steps
  with ``over_steps`` (``certificate_signal``); ``gate_signal`` — the same with the
  ``multiturn_gate`` choices; ``cert_signal_robust`` — ``certificate_signal`` of the
  robust certificate (``certificate_robust``; reported, not the pre-registered signal). NaN for the full cache and deterministic samplers (top-k
  cannot certify: Theorem 1). A randomized run whose certificate is null had no
  sampled tail at any step: if nothing was evicted (``certificate_status: exact``, every
  layer's kept fraction 1) its output is the exact one and its signals are 0; if tokens
  were evicted all the same (``uncertified``: the sinks and window alone exceed a short
  prompt's budget), nothing certifies its error and its signals are NaN, never 0 — the
  report counts such runs.
* ``confidence`` — the primary confidence signal (``confidence_signal.primary``, mean
  token log-probability); ``confidence_secondary`` likewise (min log-probability). A
  failure score is its negative.
* ``full_correct`` — correctness of the full-cache run of the same
  ``(model, task, target_tokens, example_id, seed)``; ``label`` — ``correct``,
  ``induced`` (compressed wrong, full cache right), ``inherent`` (both wrong),
  ``unknown`` (no full-cache run) or ``full`` (the full-cache run itself).
* ``unit`` — the bootstrap unit ``model|task|target_tokens|example_id``.
* ``sig_<name>`` — the comparison signals (``comparison_signals``), raw values
  (their failure orientation is the plan's): ``sig_output_entropy``, ``sig_top2_margin``,
  ``sig_attention_entropy`` (per-step series reduced with ``over_steps``),
  ``sig_evicted_mass`` and ``sig_evicted_mass_expected`` (``evicted_mass.<kind>.<aggregation>``);
  NaN where a record has none (the full cache; a deterministic sampler's expectation).
"""

from __future__ import annotations

import math
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping

import numpy as np
import pandas as pd

from ..config.analysis_plan import AnalysisPlan, ComparisonPart, SignalPart
from ..generation.record import GenerationKey, GenerationRecord
from ..generation.shards import ShardSealError, check_seal, read_records, seal_path
from ..tasks import score_record
from ..config.prereg import Freeze, load_plan, parse_utc, read_verified, verify
from ..provenance import check_prereg_hash
from ..tables import METADATA_KEY, read_table, write_table  # noqa: F401  (the loader's table format)

GENERATION_KEY: tuple[str, ...] = ("model", "task", "target_tokens", "example_id", "condition", "method", "budget", "seed")
FULL_KEY: tuple[str, ...] = ("model", "task", "target_tokens", "example_id", "seed")
RANDOMIZED_SAMPLERS = ("poisson", "priority")


class RecordRefused(ValueError):
    """A generation record the analysis will not score (missing field, foreign pre-registration, duplicate)."""


def _key_text(key: tuple) -> str:
    return "/".join("native" if v is None else f"{v:g}" if isinstance(v, float) else str(v) for v in key)


@dataclass(frozen=True)
class PlannedShard:
    """What the plan puts in one shard: {:class:`~kvcert.generation.record.GenerationKey`: the config hash its job
    composes now}.

    ``configs`` names where the hashes come from (for the message); ``references`` {example id: (reference
    answers, metadata)} are the manifest's (``manifest``), which a record's score is derived from: a record
    whose own differ is refused."""

    records: Mapping[tuple, str]
    configs: str = "the experiment's configs"
    references: Mapping[str, tuple] | None = None
    manifest: str = "the manifest"

    def check(self, shard: Path, records: list[dict]) -> None:
        """Refuse a record the plan does not put in ``shard``, one made under another config, and a
        planned record that is missing (one line each)."""
        fix = f"delete {shard} and {seal_path(shard).name} and rerun to regenerate it"
        seen = set()
        for number, record in enumerate(records, start=1):
            key = GenerationKey.of(record)
            if key not in self.records:
                raise RecordRefused(
                    f"{shard}:{number}: record {_key_text(key)} is not one the plan puts in this shard "
                    f"({len(self.records)} planned, e.g. {_key_text(next(iter(self.records)))}): it was edited, "
                    f"or made for another shard or cell; {fix}")
            if record["config_hash"] != self.records[key]:
                raise RecordRefused(
                    f"{shard}:{number}: config_hash {record['config_hash']} differs from {self.records[key]}, the "
                    f"hash of the config its job composes now ({self.configs}): the shard was made under other "
                    f"configs (or edited); {fix} (or restore the configs)")
            if self.references is not None:
                answers, metadata = self.references[record["example_id"]]
                if list(record["answers"]) != answers or dict(record["metadata"]) != metadata:
                    what = "answers" if list(record["answers"]) != answers else "metadata"
                    raise RecordRefused(
                        f"{shard}:{number}: record {_key_text(key)}: its reference {what} differ from the "
                        f"manifest's ({self.manifest}), which its score is derived from: it was edited; {fix}")
            seen.add(key)
        missing = [k for k in self.records if k not in seen]
        if missing:
            raise RecordRefused(f"{shard}: {len(missing)} planned records missing (e.g. {_key_text(missing[0])}); {fix}")


def signal_value(part: SignalPart, certificate: Mapping | None, randomized: bool, exact: bool = True) -> float:
    """The signal ``part`` (``certificate_signal`` / ``multiturn_gate``) of one record's certificate (see the module
    docstring for null certificates)."""
    if not randomized:
        return math.nan
    if certificate is None:
        return 0.0 if exact else math.nan
    return reduce_steps(certificate[part.field][part.aggregation], part.over_steps)


def reduce_steps(values, over_steps: str) -> float:
    """A per-step series reduced to one number (``mean``, ``max``, ``min``, ``last``, ``first``);
    NaN for an empty or missing series (non-finite steps skipped)."""
    vals = [float(v) for v in (values or []) if v is not None and math.isfinite(float(v))]
    if not vals:
        return math.nan
    if over_steps == "mean":
        return sum(vals) / len(vals)
    if over_steps == "max":
        return max(vals)
    if over_steps == "min":
        return min(vals)
    return vals[-1] if over_steps == "last" else vals[0]


def comparison_columns(part: ComparisonPart, record: Mapping) -> dict[str, float]:
    """The ``sig_*`` columns of one record: its comparison signals reduced as ``part`` (``comparison_signals``) says."""
    mass = record["evicted_mass"] or {}
    kind = lambda name: _float((mass.get(name) or {}).get(part.aggregation))  # noqa: E731
    return {
        "sig_output_entropy": reduce_steps(record["output_entropy_steps"], part.over_steps),
        "sig_top2_margin": reduce_steps(record["top2_margin_steps"], part.over_steps),
        "sig_attention_entropy": reduce_steps(record["attention_entropy_steps"], part.over_steps),
        "sig_evicted_mass": kind("realised"),
        "sig_evicted_mass_expected": kind("expected"),
    }


@dataclass(frozen=True)
class ScoringPlan:
    """The parts of ``analysis_plan`` that turn a record into a row."""

    pass_default: float
    pass_by_prefix: dict[str, float]
    certificate: SignalPart
    gate: SignalPart
    confidence_primary: str = "mean_logprob"
    confidence_secondary: str = "min_logprob"
    comparison: ComparisonPart = ComparisonPart()

    @classmethod
    def from_plan(cls, plan: AnalysisPlan) -> "ScoringPlan":
        return cls(
            pass_default=plan.correctness.default,
            pass_by_prefix=dict(plan.correctness.by_task_prefix),
            certificate=plan.certificate_signal,
            gate=plan.multiturn_gate,
            confidence_primary=plan.confidence_signal.primary,
            confidence_secondary=plan.confidence_signal.secondary,
            comparison=plan.comparison_signals or ComparisonPart(),
        )

    def pass_mark(self, task: str) -> float:
        """The longest matching task-name prefix's pass mark, else the default."""
        best, mark = -1, self.pass_default
        for prefix, value in self.pass_by_prefix.items():
            if task.startswith(prefix) and len(prefix) > best:
                best, mark = len(prefix), value
        return mark


def verified_freeze(prereg_folder: str | Path, verified_json: str | Path | None = None) -> Freeze:
    """Verify the pre-registration now; if ``verified_json`` (``kvcert prereg verify --out``) is given, it must agree."""
    freeze = verify(prereg_folder)
    if verified_json is not None:
        check_prereg_hash(str(verified_json), read_verified(verified_json).get("prereg_hash"), freeze.prereg_hash,
                          f"{prereg_folder} verifies differently now: rerun `kvcert prereg verify`", RecordRefused)
    return freeze


def _float(x) -> float:
    return math.nan if x is None else float(x)


def flatten(record: Mapping, plan: ScoringPlan) -> dict:
    """One record → one row (the derived columns that need no other record)."""
    sampler = record.get("sampler")
    randomized = sampler in RANDOMIZED_SAMPLERS
    cert = record.get("certificate")
    score = record.get("score")
    correct = math.nan if score is None else float(float(score) >= plan.pass_mark(record["task"]))
    meta = record.get("metadata") or {}
    kept = record.get("kept_fraction") or []
    exact = all(float(f) >= 1.0 for f in kept)  # nothing evicted: a null certificate means zero error
    return {
        "model": str(record["model"]),
        "task": str(record["task"]),
        "target_tokens": -1 if record["target_tokens"] is None else int(record["target_tokens"]),
        "example_id": str(record["example_id"]),
        "condition": str(record["condition"]),
        "method": str(record["method"]),
        "scorer": record.get("scorer"),
        "sampler": sampler,
        "allocation": record.get("allocation"),
        "budget": float(record["budget"]),
        "seed": int(record["seed"]),
        "score": _float(score),
        "correct": correct,
        "confidence": _float(record.get(plan.confidence_primary)),
        "confidence_secondary": _float(record.get(plan.confidence_secondary)),
        "cert_signal": signal_value(plan.certificate, cert, randomized, exact),
        "cert_signal_robust": signal_value(plan.certificate, record.get("certificate_robust"), randomized, exact),
        "gate_signal": signal_value(plan.gate, cert, randomized, exact),
        **comparison_columns(plan.comparison, record),
        "uncertified": bool(randomized and cert is None and not exact),
        "turn_distance": _float(meta.get("turn_distance")),
        "depth": _float(meta.get("depth")),
        "dataset": None if meta.get("dataset") is None else str(meta.get("dataset")),
        "prompt_tokens": int(record["prompt_tokens"]),
        "decode_steps": int(record["decode_steps"]),
        "kept_fraction": sum(kept) / len(kept) if kept else math.nan,
        "kv_bytes_peak": int(record["kv_bytes_peak"]),
        "prefill_seconds": float(record["prefill_seconds"]),
        "decode_seconds": float(record["decode_seconds"]),
        "started_utc": str(record["started_utc"]),
        "config_hash": str(record["config_hash"]),
        "prereg_hash": record["prereg_hash"],
        "git_commit": str(record["git_commit"]),
        "kvcert_version": str(record["kvcert_version"]),
        "model_digest": record.get("model_digest"),
        "code_digest": record.get("code_digest"),
    }


def check_record(record: Mapping, where: str, prereg_hash: str) -> None:
    """Raise :class:`RecordRefused` for a missing required field or a foreign pre-registration hash."""
    try:
        GenerationRecord.from_dict(record)
    except (TypeError, ValueError) as exc:
        raise RecordRefused(f"{where}: {exc}; it was not written by this kvcert's generation engine "
                            "(regenerate the shard)") from None
    if record["prereg_hash"] is None:
        raise RecordRefused(
            f"{where}: a one-off record (kvcert run or kvcert generate without --prereg-hash), made outside "
            "the pre-registration; claims score only the pipeline's shards"
        )
    check_prereg_hash(where, record["prereg_hash"], prereg_hash, "records generated under another "
                      "pre-registration cannot be scored against this one (regenerate the shard)", RecordRefused)


@dataclass(frozen=True)
class _Answer:
    """What a task's metric reads of a record (:func:`kvcert.tasks.score_record`)."""

    task: str
    answers: list
    metadata: dict


def check_one_code(shard: Path, records: list[dict]) -> None:
    """Refuse a shard whose records were made at two record-code digests (``code_digest``,
    :func:`kvcert.provenance.code_digest`; a record without one counts as its own, "none"): one shard is one run
    of one code, and a shard resumed after the code changed would score two codes' records as one. One line
    naming a record of each."""
    first: dict = {}
    for number, record in enumerate(records, start=1):
        first.setdefault(record.get("code_digest") or "none", number)
        if len(first) > 1:
            (a, line_a), (b, line_b) = first.items()
            raise RecordRefused(
                f"{shard}:{line_a} and :{line_b}: records made at two record codes ({a} and {b}): the shard was "
                f"resumed after the code changed; delete {shard} and {seal_path(shard).name} and rerun to "
                "regenerate it at one code")


def derived_score(record: Mapping) -> float | None:
    """The score of the record's ``answer`` under its task's metric, as the engine computes it
    (None where the record has no reference answers)."""
    if not record["answers"]:
        return None
    return score_record(_Answer(record["task"], list(record["answers"]), dict(record["metadata"] or {})),
                        str(record["answer"]))


def _same_score(stored, derived) -> bool:
    if stored is None or derived is None:
        return stored is None and derived is None
    if math.isnan(float(stored)) or math.isnan(float(derived)):
        return math.isnan(float(stored)) and math.isnan(float(derived))
    return math.isclose(float(stored), float(derived), rel_tol=1e-9, abs_tol=1e-12)


def _load_one(args: tuple[str, ScoringPlan, str, "int | PlannedShard | None"]) -> dict[str, list]:
    """Read, check, rescore and flatten one shard into columns (runs in a worker process for many shards).

    The shard must match its seal (no line lost, no record edited since it was finished)
    and hold what the plan puts in it (``expected``: a :class:`PlannedShard`, or only the
    record count). ``cols["rescored"]`` lists ``(path:line, stored, derived)`` of every
    record whose stored score differs from its answer's."""
    path, plan, prereg_hash, expected = args
    shard = Path(path)
    cols: dict[str, list] = {c: [] for c in SCORE_COLUMNS}
    cols["rescored"] = []
    records = read_records(shard)
    planned = expected if isinstance(expected, PlannedShard) else None
    try:
        check_seal(shard, len(records), len(planned.records) if planned else expected)
    except ShardSealError as exc:
        raise RecordRefused(str(exc)) from None
    for number, record in enumerate(records, start=1):
        check_record(record, f"{shard}:{number}", prereg_hash)
    check_one_code(shard, records)
    if planned is not None:
        planned.check(shard, records)
    for number, record in enumerate(records, start=1):
        where = f"{shard}:{number}"
        try:
            derived = derived_score(record)
            if not _same_score(record["score"], derived):
                cols["rescored"].append((where, record["score"], derived))
                record = {**record, "score": derived}
            row = flatten(record, plan)
        except (TypeError, ValueError, KeyError) as exc:
            raise RecordRefused(f"{where}: malformed generation record ({type(exc).__name__}: {exc})") from None
        row["shard"] = str(shard)
        row["line"] = number
        for c in SCORE_COLUMNS:
            cols[c].append(row[c])
    return cols


def load_shards(paths: Iterable[str | Path], plan: ScoringPlan, freeze: Freeze, jobs: int = 1,
                expected: Mapping[str, "int | PlannedShard"] | None = None,
                verified_utc: str | None = None) -> pd.DataFrame:
    """Read, check, rescore and flatten every record of ``paths``; add the cross-record columns.

    ``expected``: what the plan puts in each shard path (a :class:`PlannedShard`, or only a
    record count: :func:`check_seal`). ``verified_utc``: when the verification the jobs
    read was made (see :func:`derive`). With ``jobs`` > 1 the shards are parsed by that
    many worker processes; a refused record stops the whole load with its message.
    ``df.attrs["rescored"]`` lists the records whose stored score differed from their answer's.
    """
    from ..progress import progress

    tasks = [(str(p), plan, freeze.prereg_hash, (expected or {}).get(str(p))) for p in paths]
    cols: dict[str, list] = {c: [] for c in SCORE_COLUMNS}
    bar = progress(len(tasks), "score (check, rescore, flatten)", unit="shards")
    parts = []
    if jobs > 1 and len(tasks) >= 2 * jobs:
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            for part in pool.map(_load_one, tasks, chunksize=max(1, len(tasks) // (4 * jobs))):
                parts.append(part)
                bar.update(1)
    else:
        for t in tasks:
            parts.append(_load_one(t))
            bar.update(1)
    bar.close()
    rescored = []
    for part in parts:
        rescored += part["rescored"]
        for c in SCORE_COLUMNS:
            cols[c].extend(part[c])
    df = derive(pd.DataFrame(cols, columns=SCORE_COLUMNS), freeze, verified_utc)
    df.attrs["rescored"] = rescored
    return df


#: the scores table's columns (one row per record: derived values, not the record's fields)
SCORE_COLUMNS = [
    "model", "task", "target_tokens", "example_id", "condition", "method", "scorer", "sampler", "allocation", "budget",
    "seed", "score", "correct", "confidence", "confidence_secondary", "cert_signal", "gate_signal",
    "cert_signal_robust", "sig_output_entropy", "sig_top2_margin", "sig_attention_entropy", "sig_evicted_mass",
    "sig_evicted_mass_expected", "uncertified", "turn_distance", "depth", "dataset", "prompt_tokens", "decode_steps", "kept_fraction", "kv_bytes_peak",
    "prefill_seconds", "decode_seconds", "started_utc", "config_hash", "prereg_hash", "git_commit", "kvcert_version",
    "model_digest", "code_digest", "shard", "line",
]


def derive(df: pd.DataFrame, freeze: Freeze, verified_utc: str | None = None) -> pd.DataFrame:
    """Add pre_freeze, unit, full_correct and label; refuse duplicate generations.

    A record is pre-freeze when it started before the freeze and, with ``verified_utc``
    given, before that verification too (a job cannot start before the verification it read)."""
    df = df.copy()
    # started_utc is stamped to the second: compare at that resolution (a record stamped in the
    # freeze's own second is not flagged; one stamped in any earlier second is)
    frozen = parse_utc(freeze.frozen_utc).replace(microsecond=0)
    started = pd.to_datetime(df["started_utc"], utc=True, format="ISO8601")
    before = started < pd.Timestamp(frozen)
    if verified_utc is not None:
        before &= started < pd.Timestamp(parse_utc(verified_utc).replace(microsecond=0))
    df["pre_freeze"] = before.to_numpy(dtype=bool)
    df["unit"] = (
        df["model"].astype(str) + "|" + df["task"].astype(str) + "|" + df["target_tokens"].astype(str) + "|"
        + df["example_id"].astype(str)
    )
    dup = df.duplicated(list(GENERATION_KEY), keep=False)
    if dup.any():
        rows = df[dup].sort_values(list(GENERATION_KEY)).head(2)
        where = ", ".join(f"{r.shard}:{r.line}" for r in rows.itertuples())
        raise RecordRefused(
            f"{where}: the same generation ({', '.join(GENERATION_KEY)}) appears twice; remove the duplicate shard"
        )
    check_model_digests(df)
    scored = ~df["pre_freeze"]
    full = df[scored & df["condition"].eq("full")][list(FULL_KEY) + ["correct"]].rename(columns={"correct": "full_correct"})
    df = df.merge(full, on=list(FULL_KEY), how="left")
    is_full = df["condition"].eq("full")
    corr, fc = df["correct"], df["full_correct"]
    label = np.where(
        is_full, "full",
        np.where(corr.isna() | fc.isna(), "unknown", np.where(corr == 1.0, "correct", np.where(fc == 1.0, "induced", "inherent"))),
    )
    df["label"] = label
    return df


def check_model_digests(df: pd.DataFrame) -> None:
    """Refuse records of one model made from different model folders (two ``model_digest`` values: weights
    replaced between shards), naming a record of each and the remedy. Records without a digest (written
    before it was stamped) are not compared."""
    if "model_digest" not in df or df["model_digest"].isna().all():
        return
    known = df[df["model_digest"].notna()]
    for model, rows in known.groupby("model", sort=True):
        digests = list(dict.fromkeys(rows["model_digest"]))
        if len(digests) > 1:
            first = rows[rows["model_digest"] == digests[0]].iloc[0]
            other = rows[rows["model_digest"] == digests[1]].iloc[0]
            raise RecordRefused(
                f"{first['shard']}:{first['line']} and {other['shard']}:{other['line']}: records of model {model} made "
                f"from different model folders (model digests {digests[0]} and {digests[1]}: its weights or "
                "tokenizer changed between shards); delete the shards made from the old folder and rerun to "
                "regenerate them")


def scored(df: pd.DataFrame) -> pd.DataFrame:
    """The rows the claims use: generations made after the freeze, with a score."""
    return df[~df["pre_freeze"] & df["correct"].notna()]


# --- Parquet with provenance --------------------------------------------------------------
def score_shards(
    shards: Iterable[str | Path], prereg_folder: str | Path, verified_json: str | Path | None = None, jobs: int = 1,
    expected: Mapping[str, "int | PlannedShard"] | None = None,
) -> tuple[pd.DataFrame, dict]:
    """Verify the pre-registration, load every shard, and return (table, provenance)."""
    freeze = verified_freeze(prereg_folder, verified_json)
    verified_utc = read_verified(verified_json).get("verified_utc") if verified_json is not None else None
    plan = ScoringPlan.from_plan(load_plan(prereg_folder))
    shards = list(shards)
    df = load_shards(shards, plan, freeze, jobs, expected, verified_utc)
    provenance = {
        "prereg_hash": freeze.prereg_hash,
        "frozen_utc": freeze.frozen_utc,
        "freeze_record": freeze.path.name,
        "freeze_git_commit": freeze.git_commit,
        "shards": len(shards),
        "records": int(len(df)),
        "pre_freeze": int(df["pre_freeze"].sum()) if len(df) else 0,
        "verified_utc": verified_utc,
        "plan_checked": bool(expected) and all(isinstance(v, PlannedShard) for v in expected.values()),
        "rescored": len(df.attrs.get("rescored", [])),
    }
    return df, provenance
