"""Attention-level replay on a (random-init) Llama: the vectorised draws equal
certified_attention evaluated one draw and one query at a time; the vAttention arm equals a
per-row float64 recomputation; summaries and the impossibility rows."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import LlamaForCausalLM

from kvcert import certified_attention, enable_certified_attention
from kvcert.config.analysis_plan import QUERY_KINDS, ReplayPart
from kvcert.generation.replay import (
    _potential, _seed, _shadow_slots, _vattention_seed, capture, compressed_decode, draw_samples,
    impossibility_for_model, replay_layers, replay_model,
)
from kvcert.generation.replay_table import TABLE_COLUMNS, VATTENTION_COLUMNS
from kvcert.analysis.replay_stats import (
    CELL_KEY, REPLAY_COLUMNS, replay_cells, simultaneous_anytime, summarize_replay, within_cell_spearman,
    within_head_spearman,
)
from kvcert.analysis.stats import spearman
from kvcert.method.certificate import anytime_radius
from kvcert.method.design import DEFAULT_DESIGN, cpu_generator, inclusion_probabilities, poisson_sample
from kvcert.method.vattention import ht_inclusion, normal_quantile
from kvcert.method.sketch import build_sketch
from kvcert.method.scorers import SnapKVScorer
from kvcert.tasks import build_prompt_ids, generate
from kvcert.training.tokenizer import build_tokenizer

from conftest import model_for

BUDGETS, DRAWS, LATER, DELTA, SEED = [0.25, 0.5], 12, 2, 0.1, 5


def part(budgets, draws, later, kinds=QUERY_KINDS, seed=0):
    return ReplayPart(budgets=budgets, draws=draws, later_queries=later, query_kinds=kinds, seed=seed)


@pytest.fixture(scope="module")
def setup():
    tok = build_tokenizer()
    model = enable_certified_attention(model_for(tok))
    records = generate("needle", tok, n_examples=2, target_tokens=300, seed=123, answer_tokens=0)  # a 300-token prompt
    df = replay_model(model, tok, records, part(BUDGETS, DRAWS, LATER, seed=SEED), DELTA, model_name="tiny")
    return model, tok, records, df


def test_shape_and_columns(setup):
    _, _, records, df = setup
    assert list(df.columns) == TABLE_COLUMNS and TABLE_COLUMNS[: len(REPLAY_COLUMNS)] == REPLAY_COLUMNS
    # examples × layers × heads × budgets × (setting + later + sample-dependent steps) × draws
    assert len(df) == len(records) * 2 * 4 * len(BUDGETS) * (1 + 2 * LATER) * DRAWS
    assert set(df["query_kind"]) == {"setting", "later", "sample_dependent"}
    assert (df.loc[df["step"] == 0, "query_kind"] == "setting").all() and (df.loc[df["step"] > 0, "query_kind"] != "setting").all()
    assert (df["covered"] == (df["error"] <= df["radius"])).all()
    assert (df["covered_robust"] == (df["error"] <= df["radius_robust"])).all()
    assert (df["anytime_radius"] >= df["radius"] - 1e-15).all()  # δ_t ≤ δ widens the radius
    assert (df["radius_robust"] >= df["radius"] - 1e-15).all() and (df["shadow_range"] >= 0).all()
    assert (df["shadow_sum"] > 0).any()  # the sketch bounds some evicted summand
    assert (df["kv_head"] == df["head"] // 2).all()


def _independent(model, tok, record, layer, budget, draw, step):
    """One draw, one query, through the public certified_attention (not the vectorised causal path)."""
    ids, _ = build_prompt_ids(tok, record)
    cap = capture(model, ids, [layer], LATER)
    obs, n = cap.prompt[layer], len(ids)
    pi = inclusion_probabilities(SnapKVScorer()(obs)[0], budget, DEFAULT_DESIGN)
    gen = torch.Generator().manual_seed(_seed(SEED, record.id, layer, budget))
    sample = poisson_sample(pi.unsqueeze(0).expand(DRAWS, -1, -1).contiguous(), gen)
    k, v = cap.keys[layer].double(), cap.values[layer].double()
    idx = sample.indices[draw]  # [Hkv, K]
    kk = k[:, :n].gather(1, idx.unsqueeze(-1).expand(-1, -1, k.shape[-1]))
    vv = v[:, :n].gather(1, idx.unsqueeze(-1).expand(-1, -1, v.shape[-1]))
    lp = sample.log_pi[draw].double()
    valid = sample.valid[draw].unsqueeze(-1).double()
    centre = (vv * valid).sum(1) / valid.sum(1)
    q = (obs.query[0, :, -1] if step == 0 else cap.later[layer][step - 1]).double()
    keys = torch.cat([kk, k[:, n : n + step]], 1)
    values = torch.cat([vv, v[:, n : n + step]], 1)
    log_pi = torch.cat([lp, torch.zeros(k.shape[0], step, dtype=torch.float64)], 1)
    res = certified_attention(q[None, :, None], keys[None], values[None], log_pi[None], DELTA, obs.scaling, centre[None])
    full_k, full_v = k[:, : n + step], v[:, : n + step]
    g = q.shape[0] // k.shape[0]
    logits = torch.einsum("hgd,hld->hgl", q.reshape(k.shape[0], g, -1), full_k) * obs.scaling
    exact = torch.einsum("hgl,hld->hgd", torch.softmax(logits, -1), full_v).reshape(q.shape[0], -1)
    error = torch.linalg.vector_norm(res.output[0, :, 0] - exact, dim=-1)
    anyr = anytime_radius(res.variance, res.range_term, DELTA, step + 1)[0, :, 0]
    evicted = ~sample.kept_mask()[draw] & (pi < 1)
    sketch = build_sketch(k[None, :, :n], v[None, :, :n], evicted[None], _potential(cap, layer)[None], centre[None],
                          _shadow_slots(cap, layer))
    rob = certified_attention(q[None, :, None], keys[None], values[None], log_pi[None], DELTA, obs.scaling, centre[None],
                              sketch=sketch)
    torch.testing.assert_close(rob.radius, res.radius)  # the sketch leaves the plug-in alone
    return error, res.radius[0, :, 0], anyr, rob.robust_radius[0, :, 0]


@pytest.mark.parametrize("layer,budget,draw,step", [(0, 0.25, 3, 0), (1, 0.5, 7, 2), (1, 0.25, 0, 1)])
def test_vectorised_draws_equal_certified_attention(setup, layer, budget, draw, step):
    model, tok, records, df = setup
    error, radius, anyr, robust = _independent(model, tok, records[0], layer, budget, draw, step)
    rows = df[(df["example_id"] == records[0].id) & (df["layer"] == layer) & (df["budget"] == budget)
              & (df["draw"] == draw) & (df["step"] == step) & (df["query_kind"] != "sample_dependent")].sort_values("head")
    torch.testing.assert_close(torch.tensor(rows["error"].to_numpy()), error, rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(torch.tensor(rows["radius"].to_numpy()), radius, rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(torch.tensor(rows["anytime_radius"].to_numpy()), anyr, rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(torch.tensor(rows["radius_robust"].to_numpy()), robust, rtol=1e-9, atol=1e-12)


def test_sample_dependent_queries_are_the_draws_own_decoding(setup):
    """A draw's sample-dependent rows: its own compressed run (queries differ from the full-cache run's beyond the
    first layer), error against exact attention over every prompt key and that run's decode keys."""
    model, tok, records, df = setup
    record, budget, draw = records[1], 0.5, 4
    ids, _ = build_prompt_ids(tok, record)
    cap = capture(model, ids, [0, 1], LATER)
    drawn = {i: draw_samples(cap, i, budget, DRAWS, DEFAULT_DESIGN, SEED, record.id) for i in (0, 1)}
    comp = compressed_decode(model, cap, {i: d[1] for i, d in drawn.items()}, LATER, [0, 1])
    n = len(ids)
    for layer in (0, 1):
        c = comp[layer]
        assert c.queries.shape == (DRAWS, 4, LATER, 16) and c.keys.shape == (DRAWS, 2, LATER, 16)
        # the first decode step's layer-0 query depends on the token only: the same as the full-cache run's
        if layer == 0:
            torch.testing.assert_close(c.queries[draw, :, 0], cap.later[0][0], rtol=1e-5, atol=1e-5)
        q = c.queries[draw, :, -1].double()  # the last decode step sees every decode key of its run
        k = torch.cat([cap.keys[layer][:, :n], c.keys[draw]], 1).double()
        v = torch.cat([cap.values[layer][:, :n], c.values[draw]], 1).double()
        g = q.shape[0] // k.shape[0]
        w = torch.softmax(torch.einsum("hgd,hld->hgl", q.reshape(k.shape[0], g, -1), k) * cap.prompt[layer].scaling, -1)
        exact = torch.einsum("hgl,hld->hgd", w, v).reshape(q.shape[0], -1)
        rows = df[(df["example_id"] == record.id) & (df["layer"] == layer) & (df["budget"] == budget)
                  & (df["draw"] == draw) & (df["step"] == LATER) & (df["query_kind"] == "sample_dependent")]
        assert len(rows) == 4
        pi, sample = drawn[layer]
        idx = sample.indices[draw]
        kk = torch.cat([cap.keys[layer][:, :n].double().gather(1, idx.unsqueeze(-1).expand(-1, -1, 16)), c.keys[draw].double()], 1)
        vv = torch.cat([cap.values[layer][:, :n].double().gather(1, idx.unsqueeze(-1).expand(-1, -1, 16)), c.values[draw].double()], 1)
        lp = torch.cat([sample.log_pi[draw].double(), torch.zeros(2, LATER, dtype=torch.float64)], 1)
        valid = sample.valid[draw].unsqueeze(-1).double()
        kept_v = cap.values[layer][:, :n].double().gather(1, idx.unsqueeze(-1).expand(-1, -1, 16))
        centre = (kept_v * valid).sum(1) / valid.sum(1)
        res = certified_attention(q[None, :, None], kk[None], vv[None], lp[None], DELTA, cap.prompt[layer].scaling,
                                  centre[None])
        err = torch.linalg.vector_norm(res.output[0, :, 0] - exact, dim=-1)
        torch.testing.assert_close(torch.tensor(rows.sort_values("head")["error"].to_numpy()), err, rtol=1e-7, atol=1e-10)


def _vattention_row(model, tok, record, layer, budget, draw, head, step):
    """One vAttention draw of one query head and step, recomputed token by token in float64 from the arm's
    recipe (matched density: kvcert's certain count as deterministic part, its kept tail count as draws)."""
    ids, _ = build_prompt_ids(tok, record)
    cap = capture(model, ids, [layer], LATER)
    n = len(ids)
    pi, sample = draw_samples(cap, layer, budget, DRAWS, DEFAULT_DESIGN, SEED, record.id)
    k, v = cap.keys[layer].double(), cap.values[layer].double()
    hq, hkv = 4, k.shape[0]
    g = head // (hq // hkv)
    q = (cap.prompt[layer].query[0, :, -1] if step == 0 else cap.later[layer][step - 1]).double()[head]
    logits = (k[g, : n + step] @ q) * cap.prompt[layer].scaling
    e = torch.exp(logits - logits.max())
    lo, hi = DEFAULT_DESIGN.sinks, n - DEFAULT_DESIGN.window
    certain = (pi >= 1).sum(-1)
    heavy = int(certain[g]) - (lo + n - hi)
    top = sorted(range(lo, hi), key=lambda i: -float(logits[i]))[:heavy]
    det = set(range(lo)) | set(range(hi, n + step)) | set(top)
    residual = [i for i in range(n + step) if i not in det]
    b_all = (sample.lengths - certain.unsqueeze(0)).clamp(min=0)
    b = int(b_all[draw, g])
    u = torch.rand((DRAWS, hq, LATER + 1, max(1, int(b_all.max()))), generator=cpu_generator(
        _vattention_seed(SEED, record.id, layer, budget)), dtype=torch.float64)[draw, head, step]
    picks = [residual[int(float(u[j]) * len(residual))] for j in range(b)]
    d_det = sum(float(e[i]) for i in det)
    n_det = sum(e[i] * v[g, i] for i in det)
    den = d_det + len(residual) / b * sum(float(e[i]) for i in picks)
    num = n_det + len(residual) / b * sum(e[i] * v[g, i] for i in picks)
    pi_ht = float(ht_inclusion(len(residual), b))
    den_ht = d_det + sum(float(e[i]) for i in set(picks)) / pi_ht
    num_ht = n_det + sum(e[i] * v[g, i] for i in set(picks)) / pi_ht
    exact = (e @ v[g, : n + step]) / e.sum()
    sampled = torch.tensor([float(e[i]) for i in picks], dtype=torch.float64)
    eps = normal_quantile(DELTA) * float(sampled.std()) * len(residual) / (den * b ** 0.5)
    true = float(e.sum())
    return {"error_vatt": float(torch.linalg.vector_norm(num / den - exact)),
            "error_vatt_ht": float(torch.linalg.vector_norm(num_ht / den_ht - exact)), "epsilon_vatt": eps,
            "denominator_error_vatt": abs(den - true) / true, "denominator_error_vatt_ht": abs(den_ht - true) / true,
            "sampled_vatt": b, "tokens_read_vatt": len(det) + b, "exact_norm": float(torch.linalg.vector_norm(exact)),
            "resident_vatt": n + step}


@pytest.mark.parametrize("layer,budget,draw,head,step", [(0, 0.25, 3, 1, 0), (1, 0.5, 7, 2, 2), (1, 0.25, 0, 3, 1)])
def test_vattention_arm_equals_a_per_row_recomputation(setup, layer, budget, draw, head, step):
    model, tok, records, df = setup
    want = _vattention_row(model, tok, records[0], layer, budget, draw, head, step)
    row = df[(df["example_id"] == records[0].id) & (df["layer"] == layer) & (df["budget"] == budget)
             & (df["draw"] == draw) & (df["step"] == step) & (df["head"] == head)
             & (df["query_kind"] != "sample_dependent")]
    assert len(row) == 1
    for name, value in want.items():
        assert float(row[name].iloc[0]) == pytest.approx(value, rel=1e-9, abs=1e-12), name
    assert float(row["covered_vatt"].iloc[0]) == float(want["denominator_error_vatt"] <= want["epsilon_vatt"])


def test_vattention_arm_matches_density_and_leaves_the_certificate_alone(setup):
    """vAttention reads per query what kvcert keeps for the row (kept + the decode keys seen); NaN where it has no
    row (the sample-dependent kind); without the arm the certificate's columns are the same."""
    model, tok, records, df = setup
    full = df[df["query_kind"] != "sample_dependent"]
    assert (full["tokens_read_vatt"] == full["kept"] + full["step"]).all()
    assert (full["resident_vatt"] == full.groupby("example_id")["resident_vatt"].transform("min") + full["step"]).all()
    defined = [c for c in VATTENTION_COLUMNS if c not in ("epsilon_vatt", "covered_vatt", "covered_vatt_ht")]
    assert full[defined].notna().all().all()
    assert full["epsilon_vatt"].notna().mean() > 0.9 and (full["sampled_vatt"] >= 2).mean() > 0.9
    own = df[df["query_kind"] == "sample_dependent"]
    arm = [c for c in VATTENTION_COLUMNS if c != "exact_norm"]
    assert own[arm].isna().all().all() and own["exact_norm"].notna().all()
    off = replay_model(model, tok, records[:1], part([0.25], 4, LATER, seed=SEED), DELTA, model_name="tiny",
                       vattention=False)
    on = replay_model(model, tok, records[:1], part([0.25], 4, LATER, seed=SEED), DELTA, model_name="tiny")
    import pandas as pd

    pd.testing.assert_frame_equal(off[REPLAY_COLUMNS], on[REPLAY_COLUMNS])
    assert off[[c for c in VATTENTION_COLUMNS if c != "exact_norm"]].isna().all().all()


def test_simultaneous_anytime_counts_whole_paths():
    """A path is covered only when every step is: one missed step of four uncovers the draw's path."""
    import pandas as pd

    base = {"model": "m", "example_id": "e", "layer": 0, "head": 0, "budget": 0.25}
    rows = []
    for draw, misses in ((0, ()), (1, (2,)), (2, (0,))):
        for step in range(4):
            rows.append({**base, "draw": draw, "step": step, "query_kind": "setting" if step == 0 else "later",
                         "covered_anytime": step not in misses})
    paths = simultaneous_anytime(pd.DataFrame(rows))
    assert list(paths["covered"]) == [True, False, False] and set(paths["path"]) == {"later"}
    assert float(pd.DataFrame(rows)["covered_anytime"].mean()) == pytest.approx(10 / 12)  # the per-step mean is not it


def test_summaries(setup):
    _, _, records, df = setup
    cells = replay_cells(df)
    assert len(cells) == len(records) * 2 * 4 * len(BUDGETS) * 3 and list(cells.columns[: len(CELL_KEY)]) == CELL_KEY
    assert cells["n"].sum() == len(df)
    s = summarize_replay(df, DELTA)
    assert s["pooled"]["coverage"] == pytest.approx(df["covered"].mean())
    assert s["pooled"]["robust"]["coverage"] == pytest.approx(df["covered_robust"].mean())
    assert set(s["by_kind"]) == {"setting", "later", "sample_dependent"} and -1 <= s["pooled"]["spearman"] <= 1
    assert s["pooled"]["cells"] == len(cells) and set(s["by_layer"]) == {"0", "1"}
    # anytime: the share of whole paths covered, at most the per-step mean of the anytime radius
    later = s["by_kind"]["later"]
    assert later["paths"] == len(records) * 2 * 4 * len(BUDGETS) * DRAWS
    assert later["coverage_anytime"] <= later["coverage_anytime_step"] + 1e-12
    assert s["by_kind"]["setting"]["coverage_anytime"] is None
    direct = sorted(spearman(h["radius"], h["error"]) for _, h in df.groupby(["model", "example_id", "layer", "head"]))
    assert sorted(within_head_spearman(df)) == pytest.approx(direct, abs=1e-12)
    per_cell = sorted(spearman(h["radius"], h["error"]) for _, h in df.groupby([*CELL_KEY, "step"]))
    per_cell = [x for x in per_cell if x == x]
    assert sorted(within_cell_spearman(df)) == pytest.approx(per_cell, abs=1e-12)
    assert cells["coverage_anytime"].isna().sum() == (cells["query_kind"] == "setting").sum()


def test_layers_subset_and_checks(setup):
    model, tok, records, _ = setup
    assert replay_layers(32, 4) == [0, 10, 21, 31] and replay_layers(2, None) == [0, 1]
    df = replay_model(model, tok, records[:1], part([0.5], 3, 0), DELTA, max_layers=1, model_name="tiny")
    assert set(df["layer"]) == {0} and set(df["query_kind"]) == {"setting"} and len(df) == 4 * 3
    df = replay_model(model, tok, records[:1], part([0.5], 3, 1, ("setting", "sample_dependent")), DELTA,
                      max_layers=1, model_name="tiny")
    assert set(df["query_kind"]) == {"setting", "sample_dependent"} and len(df) == 4 * 3 * 2
    with pytest.raises(ValueError, match="query_kinds"):
        part([0.5], 3, 1, ("setting", "stale"))
    config = copy.deepcopy(model.config)
    config._attn_implementation = "sdpa"
    plain = LlamaForCausalLM(config)
    with pytest.raises(ValueError, match="enable_certified_attention"):
        replay_model(plain, tok, records[:1], part([0.5], 3, 0), DELTA)


def test_impossibility_rows(setup):
    model, tok, records, _ = setup
    rows = impossibility_for_model(model, tok, records[0], budget=0.25, model_name="tiny")
    assert [r["mode"] for r in rows] == ["permute", "shift"]
    for r in rows:
        assert r["identical_retained_state"] and r["retained_hash_before"] == r["retained_hash_after"]
        assert r["layer"] == 1 and r["budget"] == 0.25 and r["error_ratio"] == r["error_after"] / r["error_before"]
    assert rows[1]["error_after"] > 10 * rows[1]["error_before"]  # the shift moves the true error by orders


def test_replay_entry_point(setup, tmp_path):
    """analysis/replay.py with a model named in a configs folder, and with a model config file."""
    import json
    import runpy
    import sys
    from pathlib import Path
    from unittest.mock import patch

    from kvcert.analysis.load import read_table
    from kvcert.config.prereg import load_plan
    from kvcert.testing import frozen_copy
    from kvcert.tasks import write_jsonl

    model, tok, records, _ = setup
    root = Path(__file__).resolve().parents[1]
    model.save_pretrained(tmp_path / "model")
    tok.save_pretrained(tmp_path / "model")
    (tmp_path / "configs" / "model").mkdir(parents=True)
    (tmp_path / "configs" / "model" / "tiny.yaml").write_text("name: tiny\npath: elsewhere\ndtype: float32\ndevice: cpu\n")
    (tmp_path / "job.yaml").write_text(f"model:\n  name: tiny-job\n  path: {tmp_path / 'model'}\n  device: cpu\n")
    write_jsonl(records, tmp_path / "manifest.jsonl")
    fr = frozen_copy(root / "preregistration", tmp_path / "prereg")
    common = ["--records", str(tmp_path / "manifest.jsonl"), "--prereg", str(tmp_path / "prereg"), "--max-examples", "1",
              "--max-layers", "1", "--threads", "1"]
    for which, name in ((["--model", "tiny", "--configs", str(tmp_path / "configs"), "--model-path",
                          str(tmp_path / "model")], "tiny"), (["--model-config", str(tmp_path / "job.yaml")], "tiny-job")):
        out, imp = tmp_path / f"{name}.parquet", tmp_path / f"{name}.json"
        argv = [str(root / "analysis" / "replay.py"), *which, *common, "--out", str(out), "--impossibility-out", str(imp)]
        with patch.object(sys, "argv", argv):
            runpy.run_path(argv[0], run_name="__main__")
        df, prov = read_table(out)
        assert prov["prereg_hash"] == fr.prereg_hash and prov["model"] == name and prov["layers"] == [0]
        assert prov["draws"] == 200 and prov["budgets"] == [0.125, 0.25, 0.5]  # the pre-registered replay settings
        assert len(df) == 1 * 4 * 3 * 9 * 200 and set(df["model"]) == {name}  # setting + 4 later + 4 sample-dependent
        assert prov["query_kinds"] == ["setting", "later", "sample_dependent"]
        assert prov["seed"] == load_plan(tmp_path / "prereg").replay.seed == 0  # the plan's seed, not a CLI default
        rows = json.loads(imp.read_text())
        assert rows["prereg_hash"] == fr.prereg_hash and rows["rows"][0]["identical_retained_state"]



def test_vattention_summary(setup, tmp_path):
    """vAttention beside the certificate: point estimates equal the rows' direct means and medians, the intervals
    (prompt-cluster bootstrap) hold them, and a table without the arm says so."""
    import numpy as np

    from kvcert.analysis.vattention_stats import quantile_ratio, summarize_vattention
    from kvcert.config.analysis_plan import BootstrapPart
    from kvcert.testing import replay_frame

    _, _, records, df = setup
    plan = BootstrapPart(resamples=60, seed=3, level=0.9, replay_unit="example")
    s = summarize_vattention(df, DELTA, plan)
    assert s["available"] and s["resamples"] == 60
    full = df[df["query_kind"] != "sample_dependent"]
    pooled = s["groups"]["pooled"]
    assert pooled["rows"] == len(full) and pooled["prompts"] == len(records)
    has = full["epsilon_vatt"].notna()
    assert pooled["coverage_plugin"]["estimate"] == pytest.approx(full["covered"].mean())
    assert pooled["coverage_vatt"]["estimate"] == pytest.approx(full.loc[has, "covered_vatt"].mean())
    two = full.loc[has, "denominator_error_vatt"] <= full.loc[has, "epsilon_vatt"] * quantile_ratio(DELTA)
    assert pooled["coverage_vatt_two_sided"]["estimate"] == pytest.approx(two.mean())
    assert pooled["rows_without_epsilon"] == int((~has).sum())
    rel = (full["error_vatt"] / full["exact_norm"]).to_numpy()
    assert pooled["relative_error_vatt"]["estimate"] == pytest.approx(float(np.median(rel)))
    assert pooled["tokens_read_vatt"]["estimate"] == pytest.approx(pooled["tokens_read_kvcert"]["estimate"])
    assert pooled["tokens_resident_vatt"]["estimate"] > pooled["tokens_read_kvcert"]["estimate"]
    for g in ("kind=setting", "kind=later", "budget=0.25", "budget=0.5/kind=later"):
        assert s["groups"][g]["rows"] > 0
    for name in ("coverage_plugin", "coverage_vatt", "relative_error_vatt", "tightness_plugin"):
        lo, hi = pooled[name]["ci"]
        assert lo <= pooled[name]["estimate"] + 1e-12 and pooled[name]["estimate"] <= hi + 1e-12
    assert summarize_vattention(replay_frame(4, 5, 1), DELTA, plan) == {"available": False}


# --- the second replay data seed (replay.stability) in the claims step ------------------------------------------
@pytest.fixture(scope="module")
def stability_run(tmp_path_factory):
    """A frozen copy of the pre-registration whose smoke grid registers a second replay data seed (4100, 2 prompts),
    a few scored records, and the two seeds' replay tables as the replay jobs stamp them."""
    from pathlib import Path

    import yaml

    from kvcert.analysis.load import score_shards
    from kvcert.generation.jobs import replay_config_hash
    from kvcert.tables import write_table
    from kvcert.testing import frozen_copy, make_record, replay_frame, write_shard

    root = Path(__file__).resolve().parents[1]
    tmp = tmp_path_factory.mktemp("stability")
    source, prereg = tmp / "source", tmp / "preregistration"
    (source / "grids").mkdir(parents=True)
    (source / "claims.yaml").write_text((root / "preregistration" / "claims.yaml").read_text())
    for path in (root / "preregistration" / "grids").glob("*.yaml"):
        grid = yaml.safe_load(path.read_text())
        if path.stem == "smoke":
            grid["replay"]["stability"] = {"seed": 4100, "examples": 2}
        (source / "grids" / path.name).write_text(yaml.safe_dump(grid, sort_keys=False))
    h = frozen_copy(source, prereg, resamples=50, stability_seeds=0).prereg_hash
    records = [make_record(f"e{i}", condition="full", score=1.0, prereg_hash=h) for i in range(4)]
    scores = tmp / "scores.parquet"
    df, prov = score_shards([write_shard(records, tmp / "s.jsonl")], prereg)
    write_table(df, scores, prov)
    stamp = {"prereg_hash": h, "model": "embedded", "task": "needle", "examples": 2,
             "config_hash": replay_config_hash(root / "configs", "embedded", "needle", "snapkv-poisson")}
    deciding = replay_frame(24, 20, 4, seed=0, layers=2, heads=2, overshoot=1.0)
    second = replay_frame(24, 20, 4, seed=1, layers=2, heads=2, overshoot=2.0)
    second["example_id"] = "s4100-" + second["example_id"]
    tables = {name: write_table(frame, tmp / f"{name}.parquet", stamp)
              for name, frame in (("deciding", deciding), ("second", second), ("same", deciding))}
    return {"tmp": tmp, "prereg": prereg, "scores": scores, "configs": root / "configs", "tables": tables,
            "deciding": deciding, "second": second}


def test_the_claims_step_decides_on_one_data_seed_and_reports_the_other(stability_run):
    """``kvcert claims --stability-replay``: the replay claims are decided on the deciding seed's table, and each
    carries the second seed's tests and verdict (``data_seed_stability``: the grid's seed, its prompts); the
    second seed's tables are in the provenance; claims.json reads back typed and writes back the same."""
    from kvcert.analysis.claims_document import ClaimsDocument
    from kvcert.analysis.steps import claims_step

    r = stability_run
    out = r["tmp"] / "claims.json"
    content = claims_step(r["scores"], [r["tables"]["deciding"]], r["prereg"], "smoke", out, configs=r["configs"],
                          accept_excluded=True, stability_replay=[r["tables"]["second"]])
    doc = ClaimsDocument.read(out)
    assert doc.to_dict() == content
    replay_claims = [c for c in doc.claims if c.source == "replay"]
    assert {c.id for c in replay_claims} == {"C1", "C2", "C8"}
    for c in doc.claims:
        block = c.data_seed_stability
        if c.source != "replay":
            assert block is None
            continue
        assert (block.seed, block.prompts) == (4100, 2) and [t.statistic for t in block.tests] == [
            t.statistic for t in c.tests]
        assert all(t.resamples == 50 and t.unit == "example" for t in block.tests)
    c1 = doc.claims[0]
    assert c1.value == pytest.approx(r["deciding"]["covered"].mean())  # decided on the deciding seed alone
    assert c1.data_seed_stability.tests[0].estimate == pytest.approx(r["second"]["covered"].mean())
    assert c1.data_seed_stability.verdict == "killed" and not c1.data_seed_stability.agree
    assert [p["examples"] for p in doc.provenance.stability_replay] == [2]


def test_the_claims_step_refuses_tables_that_do_not_fit_the_second_seed(stability_run):
    """One line each: the grid registers a second data seed and its tables are not given; tables whose prompts are
    the deciding seed's; a second seed's table where the grid registers none (refused before any claim)."""
    from kvcert.analysis.load import RecordRefused
    from kvcert.analysis.steps import claims_step, stability_tables

    r = stability_run
    out = r["tmp"] / "refused.json"
    with pytest.raises(RecordRefused, match=r"^the grid registers a second replay data seed \(replay.stability: seed "
                                            r"4100\); give its replay tables with --stability-replay$"):
        claims_step(r["scores"], [r["tables"]["deciding"]], r["prereg"], "smoke", out, configs=r["configs"],
                    accept_excluded=True)
    with pytest.raises(RecordRefused, match=r"same.parquet: the stability seed's prompts share 2 with the deciding "
                                            r"seed's \(e.g. 0\); register a stability seed whose prompts are disjoint"):
        claims_step(r["scores"], [r["tables"]["deciding"]], r["prereg"], "smoke", out, configs=r["configs"],
                    accept_excluded=True, stability_replay=[r["tables"]["same"]])
    with pytest.raises(RecordRefused, match=r"second.parquet: --stability-replay given, but the experiment's grid "
                                            r"registers no second replay data seed"):
        stability_tables(None, r["deciding"], r["second"], [r["tables"]["second"]])
    assert stability_tables(None, r["deciding"], None, []) is None
    assert not out.exists()


def test_vattention_report_section(setup, tmp_path):
    """The report's section: its three tables from the replay's rows, and vattention.json beside the report."""
    import json
    from types import SimpleNamespace

    from kvcert.analysis.document import Document
    from kvcert.analysis.report_vattention import COVERAGE_HEADER, vattention_section
    from kvcert.config.analysis_plan import BootstrapPart

    _, _, _, df = setup
    run = SimpleNamespace(replay=df, delta=DELTA, plan=SimpleNamespace(bootstrap=BootstrapPart(resamples=20, seed=1)),
                          pct="90 %", out=tmp_path)
    doc = Document()
    summary = vattention_section(doc, run)
    md = doc.markdown(tmp_path)
    assert "## vAttention beside the certificate" in md and "| " + " | ".join(COVERAGE_HEADER) + " |" in md
    assert "bounds only the softmax denominator" in md.replace("\n", " ") or "denominator only" in md
    saved = json.loads((tmp_path / "vattention.json").read_text())
    assert saved["available"] and set(saved["groups"]) == set(summary["groups"])
    empty = SimpleNamespace(**{**vars(run), "replay": df[df["query_kind"] == "sample_dependent"]})
    doc = Document()
    assert vattention_section(doc, empty) == {"available": False} and "No vAttention arm" in doc.markdown(tmp_path)
