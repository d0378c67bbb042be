"""``kvcert run`` writes its records as kvpress's evaluation and lm-evaluation-harness write theirs
(:mod:`kvcert.commands.layouts`), read back here with the anchors' own names.

The names below are restated from the anchors: kvpress's ``evaluation/evaluate.py`` (``EvaluationConfig``, its
``get_results_dir`` and ``run_evaluation``'s three files) and ``evaluation/benchmarks/ruler/calculate_metrics.py``
(NVIDIA/kvpress 8bb29b9); lm-evaluation-harness's ``lm_eval/loggers/evaluation_tracker.py`` (the folder and file
names), ``lm_eval/result_schema.py`` (``EvalResults``, ``_TaskMetrics``, ``SampleResult``) and ``lm_eval/utils.py``
(``get_file_task_name``, ``get_file_datetime``, ``hash_string``) (EleutherAI/lm-evaluation-harness 4e7e0d4)."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.pipeline

#: kvpress's ruler data set's columns but ``context``, and what ``evaluate.py`` adds to them
KVPRESS_PREDICTION_COLUMNS = {"question", "answer_prefix", "answer", "task", "max_new_tokens", "predicted_answer",
                              "compression_ratio"}
#: the fields of kvpress's ``EvaluationConfig`` its folder name and a leaderboard row are made of
KVPRESS_CONFIG_FIELDS = {"dataset", "data_dir", "model", "device", "press_name", "compression_ratio", "fraction",
                         "max_new_tokens", "query_aware", "output_dir", "model_kwargs", "press_init_command", "seed"}
#: ``EvalResults`` keys that ``simple_evaluate`` and ``save_results_aggregated`` always write
LM_EVAL_RESULT_KEYS = {"results", "group_subtasks", "configs", "versions", "n-shot", "higher_is_better", "n-samples",
                       "config", "git_hash", "date", "model_source", "model_name", "model_name_sanitized",
                       "task_hashes"}
#: ``SampleResult``'s fixed keys
LM_EVAL_SAMPLE_KEYS = {"doc_id", "doc", "target", "arguments", "resps", "filtered_resps", "filter", "metrics",
                       "doc_hash", "prompt_hash", "target_hash"}


def hash_string(text: str) -> str:  # lm_eval.utils.hash_string
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def kvpress_ruler_metrics(df) -> dict:
    """kvpress's ``ruler/calculate_metrics.py``, restated: string_match_part for ``qa_*``, else string_match_all."""
    scores = {}
    df = df.copy()
    df["predicted_answer"] = df["predicted_answer"].fillna("").astype(str).apply(
        lambda x: re.sub(r"[\x00-\x1f]", "", x.strip()).strip())
    for task, group in df.groupby("task"):
        preds, refs = group["predicted_answer"].tolist(), group["answer"].tolist()
        if task.split("_")[0] == "qa":
            score = sum(max(1.0 if r.lower() in p.lower() else 0.0 for r in ref) for p, ref in zip(preds, refs))
        else:
            score = sum(sum(1.0 if r.lower() in p.lower() else 0.0 for r in ref) / len(ref)
                        for p, ref in zip(preds, refs))
        scores[task] = {"string_match": round(score / len(preds) * 100, 2)}
    return scores


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """One run on the embedded model: a task of its own (needle) and two of RULER's, the full cache and two
    methods at half the cache kept, two records each."""
    from kvcert.embedded import embedded_model_path

    tmp = tmp_path_factory.mktemp("layouts")
    out = tmp / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "kvcert.cli", "run", f"model.path={embedded_model_path()}",
         "task=needle,ruler:niah_single_1,vt", "method=snapkv-poisson,snapkv-topk", "budget=0.5", "limit=2",
         "length=1024", "threads=1", f"out={out}", "--quiet"],
        cwd=tmp, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert f"{out / 'kvpress'}/ (6 folders" in proc.stdout
    return out, json.loads((out / "results.json").read_text())


def records_of(out: Path) -> list[dict]:
    return [json.loads(line) for path in sorted((out / "generations").glob("*.jsonl"))
            for line in path.read_text().splitlines()]


def test_kvpress_folders_are_named_and_filled_as_its_evaluation_writes_them(run):
    import pandas as pd
    import yaml

    out, results = run
    folders = sorted(p.name for p in (out / "kvpress").iterdir())
    assert folders == ["needle__model__no_press__0.00", "needle__model__snapkv-poisson__0.50__query_aware",
                       "needle__model__snapkv-topk__0.50__query_aware", "ruler__1024__model__no_press__0.00",
                       "ruler__1024__model__snapkv-poisson__0.50__query_aware",
                       "ruler__1024__model__snapkv-topk__0.50__query_aware"]
    answers = {(r["method"], r["example_id"]): r["answer"] for r in records_of(out)}
    for name in folders:
        folder = out / "kvpress" / name
        assert sorted(p.name for p in folder.iterdir()) == ["config.yaml", "metrics.json", "predictions.csv"]
        config = yaml.safe_load((folder / "config.yaml").read_text())
        assert KVPRESS_CONFIG_FIELDS <= set(config)
        # the folder's name is EvaluationConfig.get_results_dir's for this config
        parts = [config["dataset"], str(config["data_dir"] or ""), config["model"].replace("/", "--"),
                 config["press_name"], f"{config['compression_ratio']:.2f}"] + (["query_aware"] if config["query_aware"] else [])
        assert "__".join(filter(None, parts)) == name
        df = pd.read_csv(folder / "predictions.csv", converters={"answer": json.loads}, dtype={"predicted_answer": str},
                         keep_default_na=False)
        assert KVPRESS_PREDICTION_COLUMNS <= set(df.columns) and "context" not in df.columns and len(df) == 2 * (
            2 if config["dataset"] == "ruler" else 1)
        assert (df["compression_ratio"] == config["compression_ratio"]).all()
        method = config["kvcert"]["method"]
        assert list(df["predicted_answer"]) == [answers[(method, i)] for i in df["id"]]
        metrics = json.loads((folder / "metrics.json").read_text())
        if config["dataset"] == "ruler":  # RULER's string match × 100, as kvpress scores the same file
            assert config["data_dir"] == "1024" and set(metrics) == {"niah_single_1", "vt"}
            rescored = kvpress_ruler_metrics(df)
            assert set(rescored) == set(metrics)
            assert all(metrics[t]["string_match"] == pytest.approx(rescored[t]["string_match"], abs=0.005) for t in metrics)
            setting = "full" if method == "full" else f"{method} aware 0.5"
            assert {t: v["string_match"] for t, v in metrics.items()} == pytest.approx(
                {t.removeprefix("ruler_"): v for t, v in results["ruler"][setting].items() if t != "average"}, abs=0.005)
        else:
            assert set(metrics) == {"needle"} and metrics["needle"]["score"] == pytest.approx(100 * df["score"].mean(), abs=0.005)
    assert config["press_init_command"].startswith("EvictionPress(") and config["seed"] == 0


def test_kvpress_runs_read_back_side_by_side(run):
    from kvcert.commands.layouts import kvpress_table, read_kvpress_runs

    out, _ = run
    runs = read_kvpress_runs(out / "kvpress")
    assert len(runs) == 6 and {r["press_name"] for r in runs} == {"no_press", "snapkv-poisson", "snapkv-topk"}
    ruler = [r for r in runs if r["dataset"] == "ruler"]
    table = kvpress_table(ruler).splitlines()
    assert table[0] == "| task | no_press 0.00 | snapkv-poisson 0.50 qa | snapkv-topk 0.50 qa |"
    assert [line.split(" |")[0] for line in table[2:]] == ["| niah_single_1", "| vt", "| **average**"]
    # a kvpress results folder beside kvcert's: a column a run, each numbered by its source
    theirs = out.parent / "kvpress-results"
    shutil.copytree(out / "kvpress" / "ruler__1024__model__no_press__0.00", theirs / "ruler__1024__model__no_press__0.00")
    both = kvpress_table(read_kvpress_runs(theirs, out / "kvpress")).splitlines()
    assert both[0].startswith("| task | no_press 0.00 (1) | no_press 0.00 (2) | ") and both[0].count("(2)") == 6
    assert both[-1] == f"(1) {theirs}; (2) {out / 'kvpress'}"
    with pytest.raises(FileNotFoundError, match="no such folder"):
        read_kvpress_runs(out / "absent")


def test_lm_eval_output_is_named_and_keyed_as_its_tracker_writes_it(run):
    out, _ = run
    settings = sorted(p.name for p in (out / "lm-eval").iterdir())
    assert settings == ["full", "snapkv-poisson__aware__budget0.5", "snapkv-topk__aware__budget0.5"]
    for setting in settings:
        [model_folder] = list((out / "lm-eval" / setting).iterdir())
        files = sorted(p.name for p in model_folder.iterdir())
        [results_file] = [f for f in files if f.startswith("results_") and f.endswith(".json")]
        samples_files = [f for f in files if f.startswith("samples_") and f.endswith(".jsonl")]
        date = results_file[results_file.rfind("_") + 1:].removesuffix(".json")  # get_file_datetime
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d-\d\d-\d\d(\.\d+)?", date)
        tasks = {f[f.find("_") + 1:f.rfind("_")] for f in samples_files}  # get_file_task_name
        assert tasks == {"needle", "ruler_niah_single_1", "ruler_vt"}
        assert {f[f.rfind("_") + 1:].replace(".jsonl", "") for f in samples_files} == {date}
        doc = json.loads((model_folder / results_file).read_text())
        assert LM_EVAL_RESULT_KEYS <= set(doc) and doc["model_name_sanitized"] == model_folder.name
        assert doc["config"]["model_args"].startswith("pretrained=")
        for task in tasks:
            metrics = doc["results"][task]
            assert metrics["name"] == metrics["alias"] == task and metrics["sample_len"] == 2
            assert {"score,none", "score_stderr,none", "passed,none", "passed_stderr,none"} <= set(metrics)
            assert doc["n-samples"][task] == {"original": 2, "effective": 2}
            assert doc["higher_is_better"][task]["score"] is True
            samples = [json.loads(line) for line in
                       (model_folder / f"samples_{task}_{date}.jsonl").read_text().splitlines()]
            assert [s["doc_id"] for s in samples] == [0, 1]
            for s in samples:
                assert LM_EVAL_SAMPLE_KEYS <= set(s) and s["filter"] == "none" and set(s["metrics"]) <= set(s)
                prompt, gen_kwargs = s["arguments"]["gen_args_0"]["arg_0"], s["arguments"]["gen_args_0"]["arg_1"]
                assert prompt and gen_kwargs["max_gen_toks"] > 0 and s["filtered_resps"] == [s["resps"][0][0]]
                assert s["prompt_hash"] == hash_string(prompt) and s["target_hash"] == hash_string(s["target"])
                assert s["doc_hash"] == hash_string(json.dumps(s["doc"], indent=2, ensure_ascii=False))
            assert doc["task_hashes"][task] == hash_string(
                "".join(s["doc_hash"] + s["prompt_hash"] + s["target_hash"] for s in samples))
            assert metrics["score,none"] == pytest.approx(sum(s["score"] for s in samples) / 2)


# --- round 6 (issue 62, item 2): a run's folders written whole ----------------------------------------------
class Killed(BaseException):
    """A kill (SIGKILL) at this point: nothing after it runs, no handler catches it."""


def _run(out: Path, *more: str) -> None:
    from argparse import Namespace

    from kvcert.commands.oneoff import run_command
    from kvcert.embedded import embedded_model_path

    run_command(Namespace(overrides=[f"model.path={embedded_model_path()}", "task=needle", "method=snapkv-topk",
                                     "budget=0.5", "length=512", "threads=1", f"out={out}", *more],
                          configs=None, prereg=None, quiet=True))


def _killed_while_writing_layouts(monkeypatch):
    """The lm-eval files are built after every kvpress folder is written: a kill there is one mid-way."""
    from kvcert.commands import layouts

    def killed(*_, **__):
        raise Killed()

    monkeypatch.setattr(layouts, "lm_eval_runs", killed)


def test_a_rerun_killed_while_it_writes_its_layouts_leaves_the_earlier_run_whole_and_a_rerun_replaces_it(
        tmp_path, monkeypatch):
    """The probe: a run (limit=2), its shard deleted as kvcert's refusal advises, a rerun (limit=3) killed while it
    wrote its layouts: results.json was run A's while a kvpress folder held B's predictions.csv (3 rows) beside A's
    metrics.json and config.yaml, and read_kvpress_runs listed it. Now the rerun's files are put in place only when
    all are written; the killed one leaves A whole, and the rerun replaces it whole (one dated lm-eval pair)."""
    import yaml

    from kvcert.commands.layouts import read_kvpress_runs

    out = tmp_path / "run"
    _run(out, "limit=2")
    before = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file() and "generations" not in p.parts}
    for shard in (out / "generations").glob("needle.jsonl*"):
        shard.unlink()
    with monkeypatch.context() as m:
        _killed_while_writing_layouts(m)
        with pytest.raises(Killed):
            _run(out, "limit=3")
    after = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file() and "generations" not in p.parts
             and not any(part.startswith(".") for part in p.relative_to(out).parts)}
    assert after == before  # results.json and every layout file: run A's, byte for byte
    runs = read_kvpress_runs(out / "kvpress")
    assert len(runs) == 2
    for folder in (out / "kvpress").iterdir():
        assert yaml.safe_load((folder / "config.yaml").read_text())["kvcert"]["limit"] == 2
    _run(out, "limit=3")  # the rerun, whole: its files replace the earlier run's
    assert json.loads((out / "results.json").read_text())["tasks"]["needle"]["records"] == 3
    assert not [p for p in out.iterdir() if p.name.startswith(".kvcert-")]  # no staging folder left
    for folder in (out / "kvpress").iterdir():
        config = yaml.safe_load((folder / "config.yaml").read_text())
        assert config["kvcert"]["limit"] == 3 and config["kvcert"]["records"] == 3
    for model_folder in (out / "lm-eval").glob("*/*"):
        names = sorted(p.name for p in model_folder.iterdir())
        assert len(names) == 2 and names[0].startswith("results_") and names[1].startswith("samples_needle_"), names
    assert len(read_kvpress_runs(out / "kvpress")) == 2


def test_a_run_killed_while_it_writes_its_layouts_into_a_fresh_out_leaves_no_folder_a_reader_takes(
        tmp_path, monkeypatch):
    from kvcert.commands.layouts import read_kvpress_runs

    out = tmp_path / "fresh"
    _killed_while_writing_layouts(monkeypatch)
    with pytest.raises(Killed):
        _run(out, "limit=1")
    assert not (out / "results.json").exists() and not (out / "kvpress").exists() and not (out / "lm-eval").exists()
    assert read_kvpress_runs(out) == []  # the staging folder's kvpress files are not read


def test_a_kvpress_folder_whose_files_disagree_or_whose_run_was_killed_while_publishing_is_refused(run, tmp_path):
    import os

    import yaml

    from kvcert.commands.layouts import LayoutRefused, read_kvpress_runs

    out, _ = run
    mixed = tmp_path / "copy" / "kvpress"
    shutil.copytree(out / "kvpress" / "needle__model__no_press__0.00", mixed / "needle__model__no_press__0.00")
    folder = mixed / "needle__model__no_press__0.00"
    assert len(read_kvpress_runs(mixed)) == 1
    lines = (folder / "predictions.csv").read_text().splitlines(keepends=True)
    (folder / "predictions.csv").write_text("".join(lines + lines[1:]))  # another run's, with more rows
    with pytest.raises(LayoutRefused, match=r"needle__model__no_press__0\.00: its predictions\.csv is not the one its "
                                            r"config\.yaml was written with \(the files are of two runs") as info:
        read_kvpress_runs(mixed)
    assert "\n" not in str(info.value)
    config = yaml.safe_load((folder / "config.yaml").read_text())
    del config["kvcert"]["files"]  # as an earlier kvcert wrote it: the rows against its records
    (folder / "config.yaml").write_text(yaml.safe_dump(config))
    with pytest.raises(LayoutRefused, match=r"predictions\.csv holds 4 rows, its config\.yaml says 2 records "
                                            r"\(limit: 2\): the files are of two runs"):
        read_kvpress_runs(mixed)
    (folder / "predictions.csv").write_text("".join(lines))
    assert len(read_kvpress_runs(mixed)) == 1
    marker = mixed.parent / f".kvcert-publishing.{os.getpid()}"
    marker.mkdir()  # a run killed while it put its files in place
    with pytest.raises(LayoutRefused, match=r"a kvcert run was killed while it put its layouts in place"):
        read_kvpress_runs(mixed)
