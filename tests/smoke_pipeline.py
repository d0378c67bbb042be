"""A reduced smoke experiment for the pipeline's fault and cluster tests (not a test module).

One frozen pre-registration per test session with a small grid (needle, 512 tokens, 16
examples, aware and streaming, budget 0.25, snapkv-topk and snapkv-poisson, plus the
full cache: 80 generations in two shards of 40 — a shard writes an example's 5 records
at once, so a shard needs several examples for a kill to land inside it), run through the real Snakefile with
``--config retrain_model=true train_recipe=tiny``: the embedded model is the ``tiny``
recipe trained by the rule ``train_model`` of the reference run (seconds), and every
other run starts from a copy of that model (copied before the run, so Snakemake sees
the rule's output present and does not retrain it). The reference run is the
uninterrupted local run every fault and cluster test compares its records with.

Records are compared without their timing fields. ``KVCERT_GIT_COMMIT`` is pinned for
every run so that a commit landing between two runs does not change their records.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TIMING_FIELDS = ("prefill_seconds", "decode_seconds", "started_utc")
EXPERIMENT = "smoke"
GRID = """\
# Reduced smoke grid of the fault and cluster tests (tests/smoke_pipeline.py).
experiment: smoke
models: [embedded]
lengths: [512]
tasks:
  needle: {examples: 16, seed: 1000}
conditions: [aware, streaming]
budgets: [0.25]
methods: [snapkv-topk, snapkv-poisson]
seeds: [0]
generations_per_shard: 40
"""
OUT = f"results/{EXPERIMENT}"
SHARD_DIR = f"{OUT}/generations/embedded/main/needle/512"
SHARDS = (f"{SHARD_DIR}/shard000.jsonl", f"{SHARD_DIR}/shard001.jsonl")
SHARD_SIZE = 40  # 8 examples x 5 runs: a forked shard is written an example (5 lines) at a time
MANIFEST = f"{OUT}/manifests/embedded/needle/512.jsonl"
VERIFIED = f"{OUT}/prereg/verified.json"
MODEL = f"{OUT}/model/embedded"
GENERATE_LOG = f"{OUT}/logs/generate/embedded/main/needle/512/{{name}}.log"
CONFIG = ("retrain_model=true", "train_recipe=tiny")

_session: dict[str, Path] = {}


def make_prereg(folder: Path) -> Path:
    """The reduced pre-registration: the project's claims.yaml and the small grid, frozen."""
    from kvcert.config.prereg import freeze

    (folder / "grids").mkdir(parents=True)
    shutil.copyfile(REPO / "preregistration" / "claims.yaml", folder / "claims.yaml")
    (folder / "grids" / "smoke.yaml").write_text(GRID)
    freeze(folder, reason="")
    return folder


def pinned_commit() -> str:
    out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True)
    return out.stdout.strip() or "unknown"


def run_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("KVCERT_GIT_COMMIT", _session.get("commit") or pinned_commit())
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


def snakemake_args(prereg: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "snakemake", "--snakefile", str(REPO / "Snakefile"),
            "--config", f"prereg={prereg}", "results=results", *CONFIG, *args]


def snakemake(workdir: Path, prereg: Path, *args: str, env: dict | None = None,
              timeout: float = 600) -> subprocess.CompletedProcess:
    """Run Snakemake in ``workdir`` (its own results/ and .snakemake/), output captured."""
    return subprocess.run(snakemake_args(prereg, *args), cwd=workdir, capture_output=True, text=True,
                          timeout=timeout, env=env or run_env())


def start_snakemake(workdir: Path, prereg: Path, *args: str, log: Path, env: dict | None = None) -> subprocess.Popen:
    """Snakemake in the background, in its own process group (``os.killpg`` reaches its jobs)."""
    fh = open(log, "w")
    return subprocess.Popen(snakemake_args(prereg, *args), cwd=workdir, stdout=fh, stderr=subprocess.STDOUT,
                            env=env or run_env(), start_new_session=True)


def without_timing(record: dict) -> dict:
    return {k: v for k, v in record.items() if k not in TIMING_FIELDS}


def shard_records(path: Path) -> list[dict]:
    from kvcert.generation.shards import read_records

    return [without_timing(r) for r in read_records(path)]


def complete_lines(path: Path) -> list[bytes]:
    """The complete (newline-terminated) lines of a file, newline included."""
    data = path.read_bytes() if path.exists() else b""
    return [line + b"\n" for line in data.split(b"\n")[:-1]]


def wait_for_lines(path: Path, count: int, proc: subprocess.Popen | None = None, timeout: float = 900) -> list[bytes]:
    """Poll ``path`` until it holds ``count`` complete lines (or fail, naming what happened); ``timeout`` is a
    hang guard, not a speed bound."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        lines = complete_lines(path)
        if len(lines) >= count:
            return lines
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"the run ended (rc {proc.returncode}) before {path} held {count} lines")
        time.sleep(0.05)
    raise AssertionError(f"{path} did not reach {count} lines in {timeout:.0f}s")


def seed_workdir(workdir: Path, reference: Path, *paths: str) -> Path:
    """A fresh run folder holding copies (times kept) of ``paths`` of the reference run (default: the model),
    finished shards with their seals."""
    workdir.mkdir(parents=True, exist_ok=True)
    for rel in paths or (MODEL,):
        src, dst = reference / rel, workdir / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.is_dir():
            shutil.copytree(src, dst, copy_function=shutil.copy2)
        else:
            shutil.copy2(src, dst)
            seal = src.with_name(src.name + ".seal.json")  # a finished shard travels with its seal
            if seal.exists():
                shutil.copy2(seal, dst.with_name(seal.name))
    return workdir


def reference(tmp_path_factory) -> tuple[Path, Path]:
    """(pre-registration, reference run folder): built once per test run.

    The reference run is the generation side of the DAG, uninterrupted, local:
    verify_prereg → train_model (tiny) → manifest → both shards. Under pytest-xdist the workers share one:
    the first to ask builds it in the run's common temporary folder, under a lock, and the others wait and read it.
    """
    if "workdir" not in _session:
        _session["commit"] = pinned_commit()
        if os.environ.get("PYTEST_XDIST_WORKER"):
            import fcntl

            base = tmp_path_factory.getbasetemp().parent / "smoke-reference"
            base.mkdir(exist_ok=True)
            with open(base / "lock", "w") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                if not (base / "done").exists():
                    _build_reference(base)
                    (base / "done").touch()
        else:
            base = tmp_path_factory.mktemp("smoke-reference")
            _build_reference(base)
        _session["prereg"], _session["workdir"] = base / "preregistration", base / "run"
    return _session["prereg"], _session["workdir"]


def _build_reference(base: Path) -> None:
    prereg = make_prereg(base / "preregistration")
    workdir = base / "run"
    workdir.mkdir()
    out = snakemake(workdir, prereg, "--cores", "2", "--", *SHARDS, timeout=900)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    for shard in SHARDS:
        assert len(shard_records(workdir / shard)) == SHARD_SIZE


def assert_same_records(run: Path, ref: Path, shards=SHARDS) -> None:
    """Every shard of ``run`` holds the reference's records (timing fields aside), in the same order."""
    for shard in shards:
        got, want = shard_records(run / shard), shard_records(ref / shard)
        assert len(got) == len(want) == SHARD_SIZE, shard
        for number, (a, b) in enumerate(zip(got, want), start=1):
            diff = sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))
            assert not diff, f"{shard}:{number}: fields differ from the reference run: {diff}"
        keys = [(r["example_id"], r["condition"], r["method"], r["budget"], r["seed"]) for r in got]
        assert len(set(keys)) == len(keys), f"{shard}: a record is duplicated"
