"""``kvcert run``: one-off generations from overrides, outside the pre-registration."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kvcert.analysis.load import RecordRefused, check_record
from kvcert.embedded import embedded_model_path
from kvcert.paths import configs_dir, prereg_dir
from kvcert.pipeline.oneoff import budget_of, compose_run, parse_overrides, summary_rows

REPO = Path(__file__).resolve().parents[1]


def test_overrides_split_and_budget_conventions():
    hydra, own = parse_overrides(["task=needle", "model.path=/x", "budget=0.25", "limit=3"])
    assert hydra == ["task=needle", "model.path=/x"] and own == {"budget": "0.25", "limit": "3"}
    assert budget_of({"budget": "0.25"}, "snapkv-poisson") == 0.25
    # kvpress's compression_ratio is the fraction removed: 0.75 removed = 0.25 kept
    assert budget_of({"compression_ratio": "0.75"}, "snapkv-poisson") == pytest.approx(0.25)
    assert budget_of({}, "full") == 1.0
    with pytest.raises(ValueError, match="not both"):
        budget_of({"budget": "0.25", "compression_ratio": "0.75"}, "snapkv-topk")
    with pytest.raises(ValueError, match=r"budget=<fraction kept>"):
        budget_of({}, "snapkv-topk")
    with pytest.raises(ValueError, match="key=value"):
        parse_overrides(["needle"])


def test_composed_run_is_the_setting_plus_the_full_cache():
    configs, task, own = compose_run(["task=multikey", "method=snapkv-topk", "compression_ratio=0.5",
                                      "model.path=/ckpt/my-model", "condition=streaming"],
                                     configs_dir(), prereg_dir())
    full, setting = configs
    assert full["condition"] == "full" and full["method"]["name"] == "full"
    assert setting["condition"] == "streaming" and setting["budget"] == 0.5
    assert setting["method"]["scorer"] == "snapkv" and setting["model"]["path"] == "/ckpt/my-model"
    assert setting["model"]["name"] == "my-model"  # records name the user's checkpoint
    assert setting["method"]["design"]["window"] == 32  # the design comes from the pre-registration
    assert task["name"] == "multikey"
    # a method without a condition means question-aware
    assert compose_run(["method=snapkv-topk", "budget=0.25"], configs_dir(), prereg_dir())[0][1]["condition"] == "aware"


@pytest.mark.pipeline
def test_kvcert_run_prints_a_table_and_its_records_are_not_scored(tmp_path):
    out = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "kvcert.cli", "run", f"model.path={embedded_model_path()}", "task=needle",
         "method=snapkv-poisson", "budget=0.25", "limit=3", f"out={out}", "--quiet"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.strip().splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("condition"))
    assert lines[header].split() == ["condition", "method", "budget", "records", "accuracy", "score",
                                     "certificate", "kept"]
    full, aware = lines[header + 1].split(), lines[header + 2].split()
    assert full[:4] == ["full", "full", "1", "3"] and aware[:4] == ["aware", "snapkv-poisson", "0.25", "3"]
    assert float(aware[6]) > 0 and 0.2 < float(aware[7]) < 0.3  # a certificate; about a quarter kept
    records = [json.loads(line) for line in (out / "generations.jsonl").read_text().splitlines()]
    assert len(records) == 6 and {r["prereg_hash"] for r in records} == {None}
    assert summary_rows(records)[1]["accuracy"] == float(aware[4])
    with pytest.raises(RecordRefused, match="one-off record"):
        check_record(records[0], "run:1", "0" * 64)
