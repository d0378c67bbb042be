"""``kvcert run``: one-off generations from overrides, outside the pre-registration."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kvcert.analysis.load import RecordRefused, check_record
from kvcert.embedded import embedded_model_path
from kvcert.config.paths import configs_dir, prereg_dir
from kvcert.commands.oneoff import budget_of, compose_run, listing, parse_overrides, summary_rows, sweep

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
    per_task, own = compose_run(["task=multikey", "method=snapkv-topk", "compression_ratio=0.5",
                                 "model.path=/ckpt/my-model", "condition=streaming", "limit=3"],
                                configs_dir(), prereg_dir())
    [(task, configs)] = per_task
    full, setting = configs
    assert full["condition"] == "full" and full["method"]["name"] == "full"
    assert setting["condition"] == "streaming" and setting["budget"] == 0.5
    assert setting["method"]["scorer"] == "snapkv" and setting["model"]["path"] == "/ckpt/my-model"
    assert setting["model"]["name"] == "my-model"  # records name the user's checkpoint
    assert setting["method"]["design"]["window"] == 32  # the design comes from the pre-registration
    assert task["name"] == "multikey" and own == {"limit": "3"}
    # a method without a condition means question-aware
    assert compose_run(["method=snapkv-topk", "budget=0.25"], configs_dir(), prereg_dir())[0][0][1][1]["condition"] == "aware"


def test_comma_separated_values_sweep_every_combination_with_one_baseline_per_task():
    assert sweep(["task=needle,multikey", "budget=0.25,0.5", "limit=2"]) == [
        ["task=needle", "budget=0.25", "limit=2"], ["task=needle", "budget=0.5", "limit=2"],
        ["task=multikey", "budget=0.25", "limit=2"], ["task=multikey", "budget=0.5", "limit=2"]]
    per_task, _ = compose_run(["task=needle,multikey", "method=snapkv-poisson,adakv-topk", "budget=0.25,0.5"],
                              configs_dir(), prereg_dir())
    assert [t["name"] for t, _ in per_task] == ["needle", "multikey"]
    for _, configs in per_task:
        assert [c["method"]["name"] for c in configs] == ["full"] + ["snapkv-poisson"] * 2 + ["adakv-topk"] * 2
        assert [c["budget"] for c in configs] == [1.0, 0.25, 0.5, 0.25, 0.5]
    # a dotted key's commas are its value's (no sweep)
    assert sweep(["+method.scorer_options={a:1,b:2}"]) == [["+method.scorer_options={a:1,b:2}"]]
    with pytest.raises(ValueError, match="empty value"):
        sweep(["budget=0.25,"])


def test_method_names_follow_one_grammar_and_typos_get_the_options():
    from kvcert.config.methods import follows_grammar, method_config

    for path in sorted((configs_dir() / "method").glob("*.yaml")):
        config = method_config(path.stem, configs_dir())
        assert config["name"] == path.stem and follows_grammar(config), path.name
    # a grammar name without a file composes (kvcert run, the pipeline's composition, generate_answer)
    [(_, [_, setting])], _ = compose_run(["method=adakv-priority", "budget=0.25"], configs_dir(), prereg_dir())
    assert (setting["method"]["scorer"], setting["method"]["sampler"], setting["method"]["allocation"]) == \
        ("snapkv", "priority", "adakv")
    with pytest.raises(ValueError, match=r"method=snapkv-poison: \(did you mean method=snapkv-poisson\?\)"):
        compose_run(["method=snapkv-poison", "budget=0.25"], configs_dir(), prereg_dir())
    with pytest.raises(ValueError, match=r"task=needl: \(did you mean task=needle\?\) no task config.*lookalike"):
        compose_run(["task=needl"], configs_dir(), prereg_dir())
    # a shipped method whose scorer is overridden is named for what it runs
    [(_, [_, setting])], _ = compose_run(["method=snapkv-poisson", "method.scorer=h2o", "budget=0.25"],
                                         configs_dir(), prereg_dir())
    assert setting["method"]["name"] == "h2o-poisson" and setting["method"]["scorer"] == "h2o"
    text = listing(configs_dir())
    assert "needle (synthetic)" in text and "longbench_hotpotqa (longbench)" in text and "adakv-kvpress" in text


@pytest.mark.pipeline
def test_kvcert_run_prints_a_table_and_its_records_are_not_scored(tmp_path):
    out = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "kvcert.cli", "run", f"model.path={embedded_model_path()}", "task=needle,multikey",
         "method=snapkv-poisson", "budget=0.25", "limit=3", f"out={out}", "--quiet"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.strip().splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("task"))
    assert lines[header].split()[:6] == ["task", "condition", "method", "budget", "records", "passed"]
    full, aware = lines[header + 1].split(), lines[header + 2].split()
    assert full[:5] == ["needle", "full", "full", "1", "3"] and aware[:5] == ["needle", "aware", "snapkv-poisson", "0.25", "3"]
    assert 0.2 < float(aware[-1]) < 0.3  # about a quarter kept
    results = json.loads((out / "results.json").read_text())
    assert set(results["tasks"]) == {"needle", "multikey"} and len(results["metrics"]) == 4
    assert len(results["configs"]) == 4 and results["outside_preregistration"]
    row = results["metrics"][1]
    assert row["relative_radius"]["value"] > 0 and row["passed"]["ci"][0] <= row["passed"]["value"] <= row["passed"]["ci"][1]
    records = [json.loads(line) for line in (out / "generations" / "needle.jsonl").read_text().splitlines()]
    assert len(records) == 6 and {r["prereg_hash"] for r in records} == {None}
    assert summary_rows(records, lambda task: 1.0)[1]["passed"] == row["passed"]
    with pytest.raises(RecordRefused, match="one-off record"):
        check_record(records[0], "run:1", "0" * 64)
