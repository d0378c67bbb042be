"""Reruns follow content, not file times or paths, through the real Snakefile (slow).

One finished run of a small grid in a copy of the checkout whose embedded model is a copy
of the shipped one: needle at 512 tokens, 600 examples under the full cache and one
Poisson setting, 4-token answers — a manifest and a 1,200-record shard each over 1 MB, above
Snakemake's default checksum limit, so their file times would decide.
Then, each time with a dry run (``-n``):

* the shard restored from a backup (same bytes, a new file time) reruns nothing;
* the manifest touched reruns nothing;
* one weight of the model replaced in place (same size, same safetensors header, the file
  time put back) reruns the model's manifest and generate jobs; a NaN weight is refused by the
  pre-flight; restored, nothing again.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from smoke_pipeline import REPO, run_env

pytestmark = pytest.mark.slow

GRID = """\
experiment: smoke
models: [embedded]
lengths: [512]
tasks:
  needle: {examples: 600, seed: 1000}
conditions: [aware]
budgets: [0.25]
methods: [snapkv-poisson]
seeds: [0]
generations_per_shard: 2000
"""
OUT = "results/smoke"
SHARD = f"{OUT}/generations/embedded/main/needle/512/shard000.jsonl"
MANIFEST = f"{OUT}/manifests/embedded/needle/512.jsonl"
SCORES = f"{OUT}/scores.parquet"


def snakemake(checkout: Path, prereg: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "snakemake", "--snakefile", str(checkout / "Snakefile"),
                           "--config", f"prereg={prereg}", "results=results", *args],
                          cwd=checkout, capture_output=True, text=True, timeout=900, env=run_env())


def jobs(out: subprocess.CompletedProcess) -> dict[str, str]:
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-3000:]
    if "Nothing to be done" in text:
        return {}
    return dict(re.findall(r"^(\w+)\s+(\d+)$", text.split("Job stats:")[1], re.M))


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    base = tmp_path_factory.mktemp("reliability")
    checkout = base / "kvcert"
    checkout.mkdir()
    for name in ("Snakefile", "environment.yml"):
        shutil.copy2(REPO / name, checkout / name)
    for name in ("configs", "analysis", "profiles"):
        shutil.copytree(REPO / name, checkout / name)
    from kvcert.embedded import embedded_model_path

    model = shutil.copytree(embedded_model_path(), base / "model")
    config = checkout / "configs" / "model" / "embedded.yaml"
    config.write_text(config.read_text().replace("path: embedded", f"path: {model}"))
    task = checkout / "configs" / "task" / "needle.yaml"
    task.write_text(task.read_text().replace("max_new_tokens: 16", "max_new_tokens: 4"))
    prereg = base / "preregistration"
    (prereg / "grids").mkdir(parents=True)
    shutil.copyfile(REPO / "preregistration" / "claims.yaml", prereg / "claims.yaml")
    (prereg / "grids" / "smoke.yaml").write_text(GRID)
    from kvcert.config.prereg import freeze

    freeze(prereg)
    done = snakemake(checkout, prereg, "--cores", "2", "--", SCORES)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert jobs(snakemake(checkout, prereg, "-n", "--", SCORES)) == {}
    return checkout, prereg, model


def test_a_restored_shard_over_1_mb_reruns_nothing(finished, tmp_path):
    checkout, prereg, _ = finished
    shard = checkout / SHARD
    assert shard.stat().st_size > 1_000_000  # above Snakemake's default checksum limit
    backup = tmp_path / "shard.jsonl"
    shutil.copyfile(shard, backup)
    shard.unlink()
    shutil.copyfile(backup, shard)  # restored: the same bytes, a new file time
    os.utime(shard, None)
    assert jobs(snakemake(checkout, prereg, "-n", "--", SCORES)) == {}


def test_a_touched_manifest_reruns_nothing(finished):
    checkout, prereg, _ = finished
    assert (checkout / MANIFEST).stat().st_size > 1_000_000
    os.utime(checkout / MANIFEST, None)
    assert jobs(snakemake(checkout, prereg, "-n", "--", SCORES)) == {}


def test_weights_replaced_in_place_rerun_the_models_jobs(finished, tmp_path):
    from safetensors.torch import load_file, save_file

    checkout, prereg, model = finished
    weights = model / "model.safetensors"
    original, stat = weights.read_bytes(), weights.stat()
    tensors = load_file(weights)
    key = next(k for k in tensors if "mlp" in k)

    def replace_in_place(value: float) -> None:
        tensors[key][0, 0] = value
        save_file(tensors, tmp_path / "changed.safetensors", metadata={"format": "pt"})
        shutil.copyfile(tmp_path / "changed.safetensors", weights)
        os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # the file time as it was
        assert weights.stat().st_size == stat.st_size

    try:
        replace_in_place(float(tensors[key][0, 0]) + 0.5)  # other, finite weights: the model's jobs rerun
        stats = jobs(snakemake(checkout, prereg, "-n", "--", SCORES))
        assert stats.get("generate") == "1" and stats.get("manifest") == "1" and stats.get("score") == "1", stats
        replace_in_place(float("nan"))  # broken weights: the pre-flight refuses before any job, naming the weight
        refused = snakemake(checkout, prereg, "-n", "--", SCORES)
        assert refused.returncode != 0 and f"weight {key} holds NaN or ±inf" in refused.stdout + refused.stderr
    finally:
        weights.write_bytes(original)
    assert jobs(snakemake(checkout, prereg, "-n", "--", SCORES)) == {}
