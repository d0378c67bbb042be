"""The pre-registered claims (``preregistration/claims.yaml``: the paper's seven and this project's
C8), computed as stated: the verdict rules and the loop over the claims.

Every claim is read from ``claims.yaml``: its cells, its tests (statistic, operator,
threshold), its placebos and the paper's outcome; the analysis choices from the typed
``analysis_plan`` (:class:`kvcert.config.analysis_plan.AnalysisPlan`). The statistics, one module
each with its formula (names as in ``claims.yaml``; the method is described in
``docs/design.md``, "The claims and their tests"), are in :mod:`kvcert.analysis.claims_stats`:
``coverage`` (C1), ``spearman_within_cell`` (C2), ``induced_failure_rate`` (C3),
``auc_certificate_stratified`` and ``…_minus_confidence`` (C4), ``escalation_gain`` (C5),
``auc_attribution_stratified`` and ``…_minus_confidence`` (C6),
``gain_ratio_certificate_over_random_stratified`` and ``gain_certificate_minus_confidence_stratified``
(C7), ``coverage_robust_<kind>``, ``tightness_robust_<kind>``, ``coverage_robust_later_worst_cell``
and ``coverage_robust_diverged`` (C8). The stratified statistics are computed within one
stratum (``analysis_plan.strata``) so that a score knowing only a run's stratum cannot pass;
the paper's pooled statistics are reported beside them.

**Placebos** (``analysis_plan.placebos``, :mod:`kvcert.analysis.placebos`): each claim's tests
are run again, by this very code, on its data with the signal replaced by one that carries no
draw- or run-level information. A claim whose tests pass is *uninformative* when a placebo's
tests all pass too (:func:`kvcert.analysis.stats.claim_verdict`).

**Monte-Carlo stability**: the verdict (placebos included) is recomputed under
``bootstrap.stability_seeds`` other bootstrap seeds; ``seed_stability`` reports the share
that agrees with the registered seed's verdict.

**Data-seed stability**: where the grid registers a second replay data seed (``replay.stability``), a replay claim
is decided on the deciding seed's prompts alone, and its tests, placebos and verdict rules are run again, by this
very code, on the second seed's prompts (``data_seed_stability``: each test's value and interval, the verdict
they give and whether it agrees), beside the verdict, changing nothing.

**Secondary analyses** (``analysis_plan.secondary``, :mod:`kvcert.analysis.claims_stats.secondary`): a replay
claim's certificate against its step cell's constant on the draws of largest error, on those of smallest radius,
and at matched coverage (``details["secondary"]``); and its certificate's worst later-query budget × layer cell
(``secondary.worst_later_cell``, ``details["worst_later_cell"]``); beside the tests, deciding nothing.

**Resamples**: every interval, the tests' and those reported beside them, is made of ``bootstrap.resamples``
resamples.

Generation claims use the scored grid rows (:func:`kvcert.analysis.load.scored`) of the
experiment's main tasks (the grid's ``tasks``; the multi-turn and LoCoMo cells are
reported separately), restricted to the claim's conditions, budgets and methods (a
method name matches the record's ``sampler`` or ``method``;
:mod:`kvcert.analysis.claims_stats.cells`). Intervals: the unit bootstrap of
:mod:`kvcert.analysis.stats` (examples; replay cells for C1, C2, C8), paired across the
tests of a claim. Minimum cell (``analysis_plan.minimum_cell``): the claim's rows must
number at least ``generations`` (replay: that many replay cells), and for the AUC claims
the two classes (C4: failures / successes; C6: induced / inherent) in the strata that hold
both at least ``positives`` / ``negatives``; every condition × budget × method named by
the claim must be present. Otherwise the claim is inconclusive whatever its interval says.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable, Mapping, Sequence

import numpy as np
import pandas as pd

from ..config.analysis_plan import AnalysisPlan, BootstrapPart, MinimumCell
from .claims_stats import STATISTICS, Kind, Prepared
from .claims_stats.attribution import prepare as prepare_attribution
from .claims_stats.prediction import prepare as prepare_prediction
from .claims_stats.secondary import NAMES as SECONDARY_NAMES, prepare as prepare_secondary
from .claims_stats.secondary import WORST_NAMES, prepare_worst_later
from .claims_stats.base import strata_codes
from .claims_stats.cells import method_mask, select_generations, select_replay
from .claims_document import (ClaimResult, ClaimTest, DataSeedStability, PaperOutcome, PlaceboBlock, PlaceboRun,
                              SeedStability)
from .placebos import PLACEBOS, keyed_uniforms, placebo_names, placebo_rng, placebo_rows
from .stats import Estimate, bootstrap, claim_verdict, test_outcome

#: what other modules and tests import from here: the statistics' registry, the cell selection, the placebos
__all__ = ["ClaimResult", "Kind", "PLACEBOS", "Prepared", "STATISTICS", "TestResult", "evaluate_claim",
           "evaluate_claims", "keyed_uniforms", "main_tasks", "method_mask", "placebo_rows", "select_generations",
           "select_replay", "stability_seeds", "strata_codes"]


@dataclass
class TestResult:
    statistic: str
    op: str
    threshold: float
    ours: bool
    estimate: Estimate
    outcome: str
    unit: str | None = None  # a replay test: the unit its interval resamples (``bootstrap.replay_unit``)
    beside: dict = field(default_factory=dict)  # a replay test: {unit: interval and outcome} over the other units

    def record(self) -> ClaimTest:
        """The test as claims.json records it."""
        est = self.estimate.to_dict()
        return ClaimTest(self.statistic, self.op, self.threshold, self.ours, est["estimate"], est["ci"], est["level"],
                         est["resamples"], est["skipped"], self.estimate.skipped_fraction, self.outcome, self.unit,
                         self.beside)


# --- what a claim's tests are computed from ------------------------------------------------------
def _kind(spec: Mapping) -> Kind:
    names = [t["statistic"] for t in spec["tests"]]
    unknown = [n for n in names if n not in STATISTICS]
    if unknown:
        raise ValueError(f"claims.yaml {spec['id']}: unknown statistic {unknown[0]!r}; known: {', '.join(STATISTICS)}")
    kinds = {STATISTICS[n] for n in names}
    if len(kinds) != 1:
        raise ValueError(f"claims.yaml {spec['id']}: the tests of one claim must come from one data set")
    return kinds.pop()


def _bootstrap(prep: Prepared, plan: BootstrapPart, names: list[str] = (), only: bool = False) -> dict[str, Estimate]:
    """The bootstrap of a prepared claim; statistics without data (no claim rows, or none of a named query kind)
    are NaN (every resample skipped). ``only``: compute just ``names`` where the preparation can."""
    nan = float("nan")
    fn = (lambda w: prep.statistic(w, set(names))) if only and prep.selective else prep.statistic
    out = {} if prep.n_units == 0 else bootstrap(fn, prep.codes, prep.n_units, plan, point=prep.point)
    for n in names:
        out.setdefault(n, Estimate(n, nan, nan, nan, plan.level, plan.resamples, plan.resamples))
    return out


# --- verdicts ------------------------------------------------------------------------------------
@dataclass
class Decision:
    """A claim's tests decided at one bootstrap seed."""

    tests: list[TestResult]
    cells_ok: bool
    reasons: list[str]
    estimates: dict[str, Estimate]

    @property
    def outcomes(self) -> list[str]:
        return [t.outcome for t in self.tests]

    def verdict(self, placebo_holds: bool = False) -> str:
        return claim_verdict(self.outcomes, self.cells_ok, placebo_holds)


def cell_reasons(source: str, counts: Mapping, need: Mapping[str, int], missing: Sequence[str] = ()) -> list[str]:
    """The minimum-cell rule (``analysis_plan.minimum_cell``): one reason per registered cell without data and per
    count below its minimum (``need``: {count: minimum}, as claims.json's ``cell["minimum"]`` records it); a claim
    with any is inconclusive, whatever its intervals say (:func:`kvcert.analysis.stats.claim_verdict`)."""
    reasons = [f"no data for cell {m}" for m in missing]
    for key, minimum in need.items():
        have = int(counts.get(key, 0))
        if have < minimum:
            what = "replay cells" if source == "replay" and key == "generations" else key
            reasons.append(f"{what}: {have} < the pre-registered minimum {minimum}")
    return reasons


def decide(spec: Mapping, kind: Kind, prep: Prepared, plan: BootstrapPart, minimum: MinimumCell,
           missing: Sequence[str] = (), tests_only: bool = False) -> Decision:
    """Bootstrap a prepared claim's tests at ``plan``'s seed and apply the verdict rules (without placebos);
    ``tests_only``: compute the tests' statistics alone (the placebos, the stability seeds)."""
    reasons = cell_reasons(kind.source, prep.counts, {key: minimum.count(key) for key in kind.minimum}, missing)
    estimates = _bootstrap(prep, plan, [t["statistic"] for t in spec["tests"]], only=tests_only)
    cells_ok = not reasons
    tests = []
    for t in spec["tests"]:
        est = estimates[t["statistic"]]
        if t["statistic"] in prep.unexercised:
            outcome = "unexercised"
            reasons.append(f"{t['statistic']}: unexercised ({prep.unexercised[t['statistic']]})")
        else:
            outcome = test_outcome(est.ci_low, est.ci_high, t["op"], float(t["threshold"]), est.skipped_fraction)
        if est.skipped_fraction > 0.10 and prep.n_units and outcome != "unexercised":
            reasons.append(f"{t['statistic']}: {est.skipped}/{est.resamples} resamples undefined (> 10 %)")
        tests.append(TestResult(t["statistic"], t["op"], float(t["threshold"]), bool(t.get("ours", False)), est, outcome))
    decision = Decision(tests, cells_ok, reasons, estimates)
    if decision.verdict() == "inconclusive" and cells_ok and "unclear" in decision.outcomes:
        reasons.append("an interval straddles its threshold" if len(reasons) == 0 else "a test is unclear")
    return decision


def _placebo_block(spec: Mapping, names: Sequence[str], decisions: Mapping[str, Decision], kind: Kind) -> PlaceboBlock:
    if not names:
        return PlaceboBlock(False, None, None, False, [], reason="the statistic reads no signal (it measures the "
                            "damage of eviction itself): nothing to replace by a placebo")
    blocks = [PlaceboRun(name, PLACEBOS[name], decisions[name].verdict(),
                         {t.statistic: {**t.estimate.to_dict(), "outcome": t.outcome} for t in decisions[name].tests},
                         decisions[name].reasons) for name in names]
    held = [b for b in blocks if b.verdict == "holds"]
    lead = held[0] if held else blocks[0]
    return PlaceboBlock(True, lead.statistic, lead.verdict, bool(held), blocks, kind=lead.kind)


@dataclass
class Evaluated:
    """A claim's tests decided on one data set, placebos included: its rows, preparation (over the deciding unit),
    decision, placebos and verdict (with its reasons)."""

    kind: Kind
    rows: pd.DataFrame
    missing: list
    unit: str | None
    full: Prepared
    prep: Prepared
    main: Decision
    placebo_preps: dict
    placebo: PlaceboBlock
    verdict: str
    reasons: list


def _evaluated(spec: Mapping, analysis_plan: AnalysisPlan, scores: pd.DataFrame | None, replay: pd.DataFrame | None,
               tasks: list[str] | None, tests_only: bool = False) -> Evaluated:
    """Select a claim's cells, bootstrap its tests at the registered seed, score its placebos with the same tests
    and apply the verdict rules; ``tests_only``: the tests' statistics alone (not those reported beside them)."""
    kind = _kind(spec)
    plan, minimum = analysis_plan.bootstrap, analysis_plan.minimum_cell
    cells = spec.get("cells") or {}
    if kind.source == "replay":
        rows, missing = select_replay(replay, cells)
    else:
        rows, missing = select_generations(scores if scores is not None else pd.DataFrame(), cells, tasks)
    unit = plan.replay_unit if kind.source == "replay" else None
    full = kind.prepare(rows, analysis_plan)
    prep = full.over(unit) if unit else full
    main = decide(spec, kind, prep, plan, minimum, missing, tests_only)
    names = placebo_names(kind, analysis_plan)
    placebo_preps = {n: kind.prepare(placebo_rows(rows, n, kind, analysis_plan, placebo_rng(analysis_plan, spec["id"], n)),
                                     analysis_plan) for n in names}
    if unit:
        placebo_preps = {n: p.over(unit) for n, p in placebo_preps.items()}
    placebo_decisions = {n: decide(spec, kind, p, plan, minimum, missing, True) for n, p in placebo_preps.items()}
    placebo = _placebo_block(spec, names, placebo_decisions, kind)
    verdict = main.verdict(placebo.passes)
    reasons = list(main.reasons)
    if verdict == "uninformative":
        reasons.append(f"a placebo ({placebo.kind}: {PLACEBOS[placebo.kind]}) passes the same tests")
    return Evaluated(kind, rows, list(missing), unit, full, prep, main, placebo_preps, placebo, verdict, reasons)


def evaluate_claim(
    spec: Mapping, analysis_plan: AnalysisPlan, scores: pd.DataFrame | None, replay: pd.DataFrame | None,
    tasks: list[str] | None = None, stability: bool = True, data_seed: tuple[int, pd.DataFrame] | None = None,
) -> ClaimResult:
    """One claim of ``claims.yaml``: select its cells, bootstrap its tests, score its placebos with the same
    tests, apply the verdict rules, and (``stability``) redo all of it under the registered other seeds.
    ``data_seed``: (seed, replay table) of the grid's second replay data seed; a replay claim's tests are computed
    on it too (:func:`data_seed_stability`), beside its verdict."""
    ev = _evaluated(spec, analysis_plan, scores, replay, tasks)
    kind, rows, missing, unit, full, prep, main = ev.kind, ev.rows, ev.missing, ev.unit, ev.full, ev.prep, ev.main
    plan = analysis_plan.bootstrap
    minimum = analysis_plan.minimum_cell
    if unit:
        _beside_units(spec, kind, full, plan, minimum, missing, main, plan.replay_beside, unit)
    seed_stability = _seed_stability(spec, kind, prep, ev.placebo_preps, plan, minimum, missing, ev.verdict,
                                     analysis_plan) if stability else None
    estimates = dict(main.estimates)
    if prep.beside is not None:  # reported, not tested: over the same unit, with the registered resamples
        estimates.update(_bootstrap(prep.beside, plan))
    details = dict(prep.details)
    details["statistics"] = {name: e.to_dict() for name, e in estimates.items()}
    certificate = analysis_plan.secondary.certificate(spec["id"]) if kind.source == "replay" else None
    if certificate:
        details["secondary"] = secondary_block(rows, analysis_plan, certificate, plan, unit)
    worst = analysis_plan.secondary.worst_later(spec["id"]) if kind.source == "replay" else None
    if worst:
        details["worst_later_cell"] = worst_later_block(rows, analysis_plan, worst, plan, unit)
    if kind.source == "generations" and prep.n_units:
        details["by_model_length"] = _breakdown(rows, kind.prepare, analysis_plan)
        if kind.prepare in (prepare_prediction, prepare_attribution):
            names_ = list(main.estimates)
            details["by_length"] = {
                str(length): {n: e.to_dict() for n, e in _bootstrap(kind.prepare(part, analysis_plan), plan,
                                                                    names_).items()}
                for length, part in rows.groupby("target_tokens")
            }
    other = (data_seed_stability(spec, analysis_plan, data_seed[0], data_seed[1], ev.verdict)
             if data_seed is not None and kind.source == "replay" else None)
    cells = spec.get("cells") or {}
    return ClaimResult(
        id=str(spec["id"]), statement=str(spec["statement"]), source=kind.source, metric=str(spec.get("metric", "")),
        kill=str(spec.get("kill", "")), tests=[t.record() for t in main.tests], verdict=ev.verdict,
        reasons=ev.reasons, cell={**prep.counts, "minimum": {k: minimum.count(k) for k in kind.minimum}},
        paper=PaperOutcome.from_dict({"value": None, "verdict": None, **(spec.get("paper") or {})},
                                     f"claim {spec['id']}'s paper", "claims.yaml"),
        details=details, beyond_paper=bool(spec.get("beyond_paper", False)),
        placebo=ev.placebo, seed_stability=seed_stability, cells=dict(cells), data_seed_stability=other,
    )


def data_seed_stability(spec: Mapping, analysis_plan: AnalysisPlan, seed: int, replay: pd.DataFrame,
                        verdict: str) -> DataSeedStability:
    """A replay claim's tests on the second data seed's replay table: its cells selected as on the deciding seed's,
    each test bootstrapped over the registered unit at the registered seed and resamples, the placebos scored by
    the same tests, and the verdict the same rules give (:func:`_evaluated`); ``agree``: whether it is ``verdict``
    (the deciding seed's), which it does not change."""
    ev = _evaluated(spec, analysis_plan, None, replay, None, tests_only=True)
    prompts = int(ev.rows.groupby(["model", "example_id"], observed=True).ngroups) if len(ev.rows) else 0
    tests = []
    for t in ev.main.tests:
        t.unit = ev.unit
        tests.append(t.record())
    return DataSeedStability(int(seed), prompts, tests, ev.verdict, ev.reasons, ev.verdict == verdict)


def secondary_block(rows: pd.DataFrame, analysis_plan: AnalysisPlan, certificate: str, plan: BootstrapPart,
                    unit: str | None) -> dict:
    """A replay claim's secondary analyses (:mod:`kvcert.analysis.claims_stats.secondary`: its certificate against
    its step cell's constant), reported beside its tests: each statistic's interval over the deciding unit, at the
    registered seed and resamples."""
    prep = prepare_secondary(rows, analysis_plan, certificate)
    prep = prep.over(unit) if unit else prep
    est = _bootstrap(prep, plan, list(SECONDARY_NAMES))
    return {**prep.details, "unit": unit or "cell",
            "statistics": {n: est[n].to_dict() for n in SECONDARY_NAMES if n in est}}


def worst_later_block(rows: pd.DataFrame, analysis_plan: AnalysisPlan, certificate: str, plan: BootstrapPart,
                      unit: str | None) -> dict:
    """A replay claim's certificate in its worst later-query cell (:func:`kvcert.analysis.claims_stats.secondary.
    prepare_worst_later`: the budget × layer cell of lowest coverage), reported beside its tests: the cell, its
    coverage, and the intervals over the deciding unit at the registered seed and resamples — of the smallest
    cell's coverage (the minimum taken in each resample) and of that cell's own."""
    prep = prepare_worst_later(rows, analysis_plan, certificate)
    prep = prep.over(unit) if unit else prep
    est = _bootstrap(prep, plan, list(WORST_NAMES))
    return {**prep.details, "unit": unit or "cell",
            "statistics": {n: est[n].to_dict() for n in WORST_NAMES if n in est}}


def _beside_units(spec, kind, prep: Prepared, plan, minimum, missing, main: Decision, beside: Sequence[str],
                  unit: str) -> None:
    """A replay claim's tests over the other registered units (``bootstrap.replay_beside``), at the registered seed:
    each test's interval and outcome over each, reported beside the deciding one (not deciding)."""
    for test in main.tests:
        test.unit = unit
    for other in beside:
        decision = decide(spec, kind, prep.over(other), plan, minimum, missing, True)
        for test, alt in zip(main.tests, decision.tests):
            test.beside[other] = {"ci": alt.estimate.to_dict()["ci"], "outcome": alt.outcome}


def stability_seeds(analysis_plan: AnalysisPlan) -> list[int]:
    """The other bootstrap seeds of the stability check: the registered seed + 1, …, + ``stability_seeds``."""
    return analysis_plan.bootstrap.other_seeds


def _seed_stability(spec, kind, prep, placebo_preps, plan, minimum, missing, verdict,
                    analysis_plan) -> SeedStability:
    """The verdict, placebos included, under each of :func:`stability_seeds`: the share that agrees."""
    seeds = stability_seeds(analysis_plan)
    if not seeds:
        return SeedStability(0, None, {})
    seen = []
    for sd in seeds:
        bp = replace(plan, seed=sd)
        holds = any(decide(spec, kind, p, bp, minimum, missing, True).verdict() == "holds"
                    for p in placebo_preps.values())
        seen.append(decide(spec, kind, prep, bp, minimum, missing, True).verdict(holds))
    counts = pd.Series(seen).value_counts().to_dict()
    return SeedStability(len(seeds), float(np.mean([v == verdict for v in seen])),
                         {str(k): int(v) for k, v in counts.items()}, seeds[0])


def _breakdown(rows: pd.DataFrame, prepare: Callable, analysis_plan: AnalysisPlan) -> list[dict]:
    """Point estimates per (model, target_tokens): the paper reports ranges over these."""
    out = []
    for (model, length), part in rows.groupby(["model", "target_tokens"]):
        prep = prepare(part, analysis_plan)
        if not prep.n_units:
            out.append({"model": model, "target_tokens": int(length), **prep.counts})
            continue
        at_one = prep.statistic(np.ones((1, len(prep.codes))))
        values = {n: (prep.point[n] if n in prep.point else (float(v[0]) if bool(ok[0]) else None))
                  for n, (v, ok) in at_one.items()}
        out.append({"model": model, "target_tokens": int(length), **prep.counts,
                    **{n: (None if v is None or not np.isfinite(v) else float(v)) for n, v in values.items()}})
    return out


def evaluate_claims(
    claims_doc: Mapping, scores: pd.DataFrame | None, replay: pd.DataFrame | None, tasks: list[str] | None = None,
    data_seed: tuple[int, pd.DataFrame] | None = None,
) -> list[ClaimResult]:
    """Every claim of a parsed ``claims.yaml``, in order (progress on stderr: each claim's tests, placebos and
    stability seeds are most of the step's time); ``data_seed``: (seed, replay table) of the grid's second replay
    data seed, on which the replay claims' tests are computed too (:func:`data_seed_stability`)."""
    from ..progress import progress

    plan = AnalysisPlan.of_document(claims_doc)
    bar = progress(len(claims_doc["claims"]), "claims (tests, placebos, stability seeds)", unit="claims")
    results = []
    for spec in claims_doc["claims"]:
        results.append(evaluate_claim(spec, plan, scores, replay, tasks, data_seed=data_seed))
        bar.update(1)
    bar.close()
    return results


def main_tasks(grid: Mapping | None) -> list[str] | None:
    """The tasks of a design grid's main cell (its ``tasks`` keys); None = every task."""
    if not grid or "tasks" not in grid:
        return None
    return list(grid["tasks"])
