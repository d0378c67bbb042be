"""Contract tests in kvpress's style (its ``tests/default_presses.py`` lists every press, and one parametrized test
runs them all): every eviction method and every statistic module of the claims, named here one by one, keeps the
contract its kind promises. A method or a module added without a line here fails the listing tests.

* A method (``configs/method/<name>.yaml``) builds from its config through the generation spec, prefills a tiny
  model through the engine's own press and prefill, keeps the budget's share of the tokens (exactly for the
  exact-size samplers, on average for the Poisson design) with a sampled tail exactly when it is randomized, and at
  budget 1.0 is the full cache: every token kept, the same logits.
* A statistic module of :mod:`kvcert.analysis.claims_stats` prepares a small synthetic claim into a
  :class:`~kvcert.analysis.claims_stats.base.Prepared` whose statistic at unit weights computes every name of its
  ``NAMES``, equals its point estimates and an independent computation where one is cheap, and whose empty claim
  is the empty preparation; the registry maps each of its names to its kind.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import torch

from conftest import tiny_model
from kvcert import CertifiedCache, enable_certified_attention
from kvcert.analysis import claims_stats
from kvcert.analysis.claims_stats import MODULES, STATISTICS, Prepared
from kvcert.analysis.load import score_shards, scored
from kvcert.analysis.replay_stats import STEP_CELL_KEY
from kvcert.config.analysis_plan import REPLAY_UNITS
from kvcert.config.methods import follows_grammar, method_config, shipped_methods
from kvcert.config.prereg import load_plan
from kvcert.config.sources import ModelSpec
from kvcert.generation.engine import Engine
from kvcert.generation.spec import GenerationSpec, MethodSpec
from kvcert.testing import frozen_copy, paper_records, replay_frame, write_shard

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "configs"

# --- every eviction method -------------------------------------------------------------------------------------
#: every shipped method config, written out (configs/method/<name>.yaml)
METHODS = [
    "full",
    "adakv-kvpress", "adakv-poisson", "adakv-topk",
    "h2o-poisson", "h2o-topk",
    "knorm-kvpress", "knorm-topk",
    "pyramidkv-poisson", "pyramidkv-topk",
    "snapkv-kvpress", "snapkv-poisson", "snapkv-priority", "snapkv-topk",
    "streaming_llm-kvpress", "streaming_llm-topk",
    "tova-kvpress", "tova-poisson", "tova-topk",
    "value_aware-poisson",
]

CONTEXT = 256  # tokens the press compresses (the prompt's last token is fed after compression)
BUDGET = 0.25


@pytest.fixture(scope="module")
def model():
    return enable_certified_attention(tiny_model("llama", layers=2))


@pytest.fixture(scope="module")
def prompt():
    return torch.randint(0, 128, (CONTEXT + 1,), generator=torch.Generator().manual_seed(0)).tolist()


@pytest.fixture(scope="module")
def full_logits(model, prompt):
    return prefill(model, prompt, "full", 1.0)[1]


def prefill(model, prompt, name: str, budget: float, seed: int = 0) -> tuple[CertifiedCache, torch.Tensor]:
    """The method's prefill of ``prompt`` through the engine (its press for one example, the aware condition; the
    full cache's own condition for ``full``): the cache and the logits of the first answer token."""
    method = MethodSpec.from_dict(method_config(name, CONFIGS))
    spec = GenerationSpec(model=ModelSpec(name="tiny"), method=method, budget=budget, seed=seed,
                          condition="full" if method.is_full else "aware")
    engine = Engine(model, SimpleNamespace(eos_token_id=None), spec)
    cache = CertifiedCache(record_certificates=method.randomized)
    with torch.no_grad():
        logits = engine.prefill(prompt, len(prompt) - 1, cache, engine.press("contract"))
    return cache, logits


def compressed_kept(cache: CertifiedCache) -> torch.Tensor:
    """Tokens kept per layer × head of the compressed context (the prompt's last token, fed after it, apart)."""
    return torch.stack([layer.kept[0] - 1 for layer in cache.layers]).float()


def test_every_shipped_method_is_listed():
    assert sorted(METHODS) == shipped_methods(CONFIGS)


@pytest.mark.parametrize("name", METHODS)
def test_a_method_builds_from_its_config_and_keeps_its_budget(model, prompt, name):
    config = method_config(name, CONFIGS)
    assert follows_grammar(config) and config["name"] == name
    method = MethodSpec.from_dict(config)
    if method.is_full:
        assert method == MethodSpec() and not method.randomized
        cache, _ = prefill(model, prompt, name, 1.0)
        assert torch.equal(compressed_kept(cache), torch.full((2, 2), float(CONTEXT)))
        return
    target = BUDGET * CONTEXT
    floor = min(CONTEXT, method.design.sinks + method.design.window)  # the certainty set: never evicted
    assert floor <= target  # else the budget below would test the certainty set, not the sampler
    seeds = range(4) if method.sampler == "poisson" else range(1)  # Poisson: a random size, its mean the budget
    caches = [prefill(model, prompt, name, BUDGET, seed)[0] for seed in seeds]
    kept = torch.stack([compressed_kept(cache) for cache in caches])
    assert bool((kept >= floor).all()) and bool((kept <= CONTEXT).all())
    if method.sampler == "poisson":
        assert float(kept.mean()) == pytest.approx(target, rel=0.08)
    else:  # every allocation keeps the budget on average over layers × heads (uniform: in every one)
        assert float(kept.mean()) == pytest.approx(target, abs=1.0)
        if method.allocation == "uniform":
            assert torch.equal(kept, torch.full_like(kept, target))
    assert any(layer.has_tail for layer in caches[0].layers) == method.randomized  # π < 1 somewhere iff randomized
    assert (len(caches[0].step_log) > 0) == method.randomized  # only a randomized method is certified


@pytest.mark.parametrize("name", METHODS)
def test_a_method_at_budget_one_is_the_full_cache(model, prompt, full_logits, name):
    cache, logits = prefill(model, prompt, name, 1.0)
    assert torch.equal(compressed_kept(cache), torch.full((2, 2), float(CONTEXT)))
    for layer in cache.layers:  # π = 1 for every token, to the precision of the design's solved scale
        assert float(layer.log_pi[..., : layer.length].min()) > -1e-4
    torch.testing.assert_close(logits, full_logits, rtol=1e-5, atol=1e-5)


# --- every statistic module of the claims ----------------------------------------------------------------------
def rank_auc(scores: np.ndarray, y: np.ndarray) -> float:
    """The Mann–Whitney AUC, P(s₊ > s₋) + ½ P(s₊ = s₋), from mid-ranks (an oracle apart from kvcert's)."""
    ranks = pd.Series(scores).rank().to_numpy()
    pos = y == 1
    n1, n0 = int(pos.sum()), int((~pos).sum())
    return float((ranks[pos].sum() - n1 * (n1 + 1) / 2) / (n1 * n0))


def failed_with_signals(rows):
    return rows[rows["cert_signal"].notna() & rows["confidence"].notna()]


def step_cell_median(rows) -> float:
    """C2 by hand: the median (inverted CDF: the lower middle) of the within-step-cell Spearman correlations."""
    rho = [g["radius"].corr(g["error"], method="spearman") for _, g in rows.groupby(STEP_CELL_KEY, observed=True)]
    return float(np.quantile(rho, 0.5, method="inverted_cdf"))


#: every statistic module, written out: its data set, whether a placebo replaces its outcome (generation claims),
#: and statistics at unit weights computed apart from the module (on the rows of its data set)
STATISTIC_MODULES = [
    {"module": "coverage", "source": "replay", "oracle": {
        "coverage": lambda r: r["covered"].mean(),
        "coverage_later": lambda r: r.loc[r["query_kind"] == "later", "covered"].mean(),
        "coverage_sample_dependent": lambda r: r.loc[r["query_kind"] == "sample_dependent", "covered"].mean()}},
    {"module": "spearman", "source": "replay", "oracle": {"spearman_within_cell": step_cell_median}},
    {"module": "induced", "source": "generations", "outcome": False, "oracle": {
        "induced_failure_rate": lambda r: 1.0 - r.loc[r["full_correct"] == 1.0, "correct"].mean()}},
    {"module": "prediction", "source": "generations", "outcome": True, "oracle": {
        "auc_certificate": lambda r: rank_auc(failed_with_signals(r)["cert_signal"].to_numpy(),
                                              1.0 - failed_with_signals(r)["correct"].to_numpy())}},
    {"module": "escalation", "source": "generations", "outcome": True, "oracle": {}},
    {"module": "attribution", "source": "generations", "outcome": True, "oracle": {
        "auc_attribution": lambda r: rank_auc(
            failed_with_signals(r[r["label"].isin(["induced", "inherent"])])["cert_signal"].to_numpy(),
            (failed_with_signals(r[r["label"].isin(["induced", "inherent"])])["label"] == "induced").to_numpy())}},
    {"module": "recompute", "source": "generations", "outcome": True, "oracle": {}},
    {"module": "robust_coverage", "source": "replay", "oracle": {
        "coverage_robust": lambda r: r["covered_robust"].mean(),
        "coverage_robust_setting": lambda r: r.loc[r["query_kind"] == "setting", "covered_robust"].mean()}},
]
#: the package's other files: the shared parts, the selection of a claim's rows, the secondary analyses
HELPERS = ["__init__", "auc", "base", "cells", "secondary"]
STAT_IDS = [m["module"] for m in STATISTIC_MODULES]


def module_of(entry):
    return getattr(claims_stats, entry["module"])


def test_every_statistic_module_is_listed():
    assert [m.__name__.rsplit(".", 1)[-1] for m in MODULES] == STAT_IDS
    files = sorted(p.stem for p in Path(claims_stats.__file__).parent.glob("*.py"))
    assert files == sorted(STAT_IDS + HELPERS)
    assert set(STATISTICS) == {name for m in MODULES for name in m.NAMES}


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """A small claim of each data set: scored paper-shaped generations (the full runs apart) and a replay table
    with every query kind, whose robust radius misses some draws (coverage below 1 to compare)."""
    folder = tmp_path_factory.mktemp("prereg") / "preregistration"
    freeze = frozen_copy(ROOT / "preregistration", folder)
    records = paper_records(["m"], [512], {"needle": 12, "multikey": 12}, freeze.prereg_hash,
                            "2031-01-01T00:00:00+00:00", decode_steps=4, layers=4)
    shard = write_shard(records, tmp_path_factory.mktemp("shards") / "s.jsonl")
    generations = scored(score_shards([shard], folder)[0])
    replay = replay_frame(cells=24, draws=6, later=2, overshoot=1.5, sample_dependent=True, budgets=(0.25,),
                          layers=2, heads=2)
    return {"plan": load_plan(folder), "generations": generations[generations["condition"] != "full"],
            "replay": replay}


def at_unit_weights(prep: Prepared) -> dict[str, tuple[float, bool]]:
    out = prep.statistic(np.ones((1, len(prep.codes))))
    return {name: (float(v[0]), bool(ok[0])) for name, (v, ok) in out.items()}


@pytest.mark.parametrize("entry", STATISTIC_MODULES, ids=STAT_IDS)
def test_a_statistic_module_prepares_a_claim(data, entry):
    module = module_of(entry)
    rows = data[entry["source"]]
    assert module.KIND.source == entry["source"] and module.KIND.prepare is module.prepare
    assert all(STATISTICS[name] is module.KIND for name in module.NAMES)
    prep = module.prepare(rows, data["plan"])
    assert isinstance(prep, Prepared) and prep.n_units > 0 and 0 < prep.counts["generations"] <= len(rows)
    assert prep.codes.min() == 0 and prep.codes.max() == prep.n_units - 1  # every unit has a record
    at_one = at_unit_weights(prep)
    for name, value in prep.point.items():  # the point estimates: the statistic at unit weights
        assert at_one[name][1] and at_one[name][0] == pytest.approx(value, rel=1e-9, abs=1e-12), name
    for name, oracle in entry["oracle"].items():
        assert at_one[name][1] and at_one[name][0] == pytest.approx(float(oracle(rows)), rel=1e-9), name
    for name in module.NAMES:
        if name in at_one and at_one[name][1]:
            assert np.isfinite(at_one[name][0]), name
    if entry["source"] == "replay":  # the claim's units: the replay cell, its example × layer, its example
        groups = {"cell": None, "example_layer": ["example_id", "layer"], "example": ["example_id"]}
        assert set(prep.units) == set(REPLAY_UNITS)
        for unit in REPLAY_UNITS:
            over = prep.over(unit)
            assert len(over.codes) == len(prep.codes)
            if groups[unit] is not None:
                assert over.n_units == rows.groupby(groups[unit]).ngroups
    else:
        assert (module.KIND.outcome is not None) == entry["outcome"]
        if entry["outcome"]:
            y, defined = module.KIND.outcome(rows)
            assert len(y) == len(defined) == len(rows) and defined.any()


@pytest.mark.parametrize("entry", STATISTIC_MODULES, ids=STAT_IDS)
def test_a_statistic_module_computes_every_name_it_lists(data, entry):
    module = module_of(entry)
    at_one = at_unit_weights(module.prepare(data[entry["source"]], data["plan"]))
    undefined = [n for n in module.NAMES if n not in at_one or not at_one[n][1]]
    assert not undefined, f"{entry['module']}.NAMES lists statistics it does not define: {undefined}"


@pytest.mark.parametrize("entry", STATISTIC_MODULES, ids=STAT_IDS)
def test_a_statistic_module_of_an_empty_claim_is_the_empty_preparation(data, entry):
    module = module_of(entry)
    prep = module.prepare(data[entry["source"]].iloc[0:0], data["plan"])
    assert prep.n_units == 0 and prep.codes.size == 0 and prep.point == {}
    assert prep.counts["generations"] == 0 and prep.statistic(np.ones((1, 0))) == {}
