"""``kvcert bench decode --model``: the comparison runs end to end on a model folder and says what it measured.

Speed is the benchmark's business (docs/benchmarks.md); this checks that every variant is measured, the
caches hold what they should (the 25 % caches a quarter of the full cache's KV bytes, kvcert's allocated
bytes at least its KV bytes, transformers' exactly), and the last line carries its summary keys."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.pipeline


def test_bench_decode_on_a_model_folder_measures_every_variant(tmp_path):
    from kvcert.embedded import embedded_model_path

    csv = tmp_path / "decode.csv"
    out = subprocess.run([sys.executable, "-m", "kvcert.cli", "bench", "decode", "--model", str(embedded_model_path()),
                          "--lengths", "400", "--steps", "2", "--repeats", "2", "--threads", "1", "--csv", str(csv),
                          "--figure", str(tmp_path / "decode.png")], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    last = dict(pair.split("=") for pair in out.stdout.strip().splitlines()[-1].split())
    for key in ("cert_over_topk_4k", "cert_over_topk_4k_cpu", "kvcert_full_over_hf_4k", "kv_bytes_ratio_25", "kvcert_topk_over_kvpress_4k",
                "alloc_bytes_over_kvpress_25", "forked_over_generate_tokens_per_s"):
        assert key in last, key
    assert 0.2 < float(last["kv_bytes_ratio_25"]) < 0.4
    import pandas as pd

    rows = pd.read_csv(csv).set_index("variant")
    assert {"hf", "full", "topk", "plugin", "robust"} <= set(rows.index)
    assert rows.loc["hf", "alloc_bytes"] == rows.loc["hf", "kv_bytes"]
    assert (rows.loc[["full", "topk", "plugin", "robust"], "alloc_bytes"]
            >= rows.loc[["full", "topk", "plugin", "robust"], "kv_bytes"]).all()
    assert rows.loc["robust", "sketch_bytes"] > 0 == rows.loc["plugin", "sketch_bytes"]
    assert (rows["decode_s"] > 0).all() and (rows["decode_cpu_s"] > 0).all() and (tmp_path / "decode.png").stat().st_size > 0
    if "kvpress" not in rows.index:
        assert "kvpress is not installed here" in out.stdout and last["kvcert_topk_over_kvpress_4k"] == "n/a"
