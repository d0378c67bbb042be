"""``kvcert bench report``: scoring, claims and the report from paper-scale records.

Simulates the paper's main grid — 4 models × 2 lengths × 710 examples × 13 runs =
73,840 generation records (:func:`kvcert.testing.paper_records`, the
engine's record schema with 24 decode steps and 28 layers of certificate trace) plus
a multi-turn cell, writes them as shards of 150 records under a frozen copy of the
pre-registration, optionally with a synthetic replay table, then times the three
analysis steps as the workflow runs them (:mod:`kvcert.analysis.steps`): score,
claims (1,000 bootstrap resamples per claim), report. Target: ≤ 60 s in all.
Last line: ``report_seconds=<s> records=<n>``.
"""

from __future__ import annotations

import os
import resource
import shutil
import tempfile
import time
from pathlib import Path

from ..config.paths import resolve_prereg

PAPER_MODELS = ["qwen2.5-1.5b-instruct", "qwen2.5-7b-instruct", "llama-3.1-8b-instruct", "mistral-7b-instruct"]
PAPER_TASKS = {"longbench_qasper": 150, "longbench_multifieldqa_en": 150, "longbench_hotpotqa": 150,
               "longbench_2wikimqa": 150, "needle": 110}


def run(args) -> int:
    from . import check_counts

    check_counts(args, models=1, multiturn=0, replay_cells=0, replay_draws=1, jobs=1)
    from kvcert.analysis.load import write_table
    from kvcert.analysis.steps import claims_step, report_step, score_step
    from kvcert.testing import frozen_copy, multiturn_records, paper_records, replay_frame, write_shard

    source = resolve_prereg(args.prereg)
    if not (source / "claims.yaml").exists():
        raise FileNotFoundError(f"{source}: no claims.yaml (run from the repository root or pass --prereg)")
    tmp = Path(tempfile.mkdtemp(prefix="kvcert-bench-report-"))
    try:
        prereg = tmp / "preregistration"
        fr = frozen_copy(source, prereg)
        started = "2030-01-01T00:00:00+00:00"
        t0 = time.perf_counter()
        shards, n, buf = [], 0, []

        def flush():
            shards.append(write_shard(buf, tmp / "shards" / f"shard-{len(shards):05d}.jsonl"))
            buf.clear()

        models = PAPER_MODELS[: args.models]
        records = paper_records(models, [6144, 16384], PAPER_TASKS, fr.prereg_hash, started, seed=args.seed,
                                decode_steps=24, layers=28)
        for model in models:
            records = _chain(records, multiturn_records(model, args.multiturn, fr.prereg_hash, started, seed=args.seed,
                                                        length=16384, layers=28))
        for r in records:
            buf.append(r)
            n += 1
            if len(buf) == 150:
                flush()
        if buf:
            flush()
        replay_paths = []
        if args.replay_cells:
            rp = replay_frame(args.replay_cells, args.replay_draws, 4, args.seed)
            replay_paths.append(write_table(rp, tmp / "replay.parquet", {"prereg_hash": fr.prereg_hash,
                                                                         "model": "synthetic"}))
        print(f"simulated {n} records in {len(shards)} shards ({time.perf_counter() - t0:.1f} s, not timed)"
              + (f"; replay {args.replay_cells} cells x {args.replay_draws} draws x 5 queries" if args.replay_cells else ""))

        c1 = _cpu()
        t1 = time.perf_counter()
        scores = score_step(shards, prereg, tmp / "scores.parquet", jobs=args.jobs)
        t2 = time.perf_counter()
        content = claims_step(scores, replay_paths, prereg, "paper", tmp / "claims.json")
        t3 = time.perf_counter()
        report_step(tmp / "claims.json", scores, replay_paths, [], tmp / "report")
        t4 = time.perf_counter()
        cpu = _cpu() - c1
        print(f"{'step':>8} {'seconds':>8}")
        for name, sec in (("score", t2 - t1), ("claims", t3 - t2), ("report", t4 - t3)):
            print(f"{name:>8} {sec:>8.1f}")
        for c in content["claims"]:
            print(f"  {c['id']}: {c['verdict']:<12} {c['statistic']} = {c['value']}")
        print(f"cpu seconds (this process and its workers): {cpu:.1f}; machine load average {os.getloadavg()[0]:.1f}")
        print(f"report_seconds={t4 - t1:.1f} records={n}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


def _cpu() -> float:
    """CPU seconds of this process and its finished children (user + system)."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def _chain(*iterables):
    for it in iterables:
        yield from it


def register(subparsers) -> None:
    p = subparsers.add_parser("report", help="score + claims + report from 74k simulated paper-shaped records")
    p.add_argument("--prereg", default=None, help="pre-registration folder to copy (claims.yaml, grids/; default: $KVCERT_PREREG, else ./preregistration)")
    p.add_argument("--models", type=int, default=4, help="models simulated (4 = the paper's 73,840 main-grid records)")
    p.add_argument("--multiturn", type=int, default=200, help="multi-turn examples per model")
    p.add_argument("--replay-cells", type=int, default=0, help="also a synthetic replay table with this many cells")
    p.add_argument("--replay-draws", type=int, default=200)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--jobs", type=int, default=min(4, os.cpu_count() or 1), help="processes parsing shards")
    p.set_defaults(func=run)
