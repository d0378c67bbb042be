"""A claims document's verdicts re-derived from its own tests: a verdict the registered rules do not give is refused.

claims.json records, per claim, each test's interval, operator and threshold, the outcome, the placebos' tests, the
cell counts with their registered minimums, and the verdict. The verdict is a function of the rest, by the rules of
:mod:`kvcert.analysis.claims` (imported, not restated):

* each test's outcome from its interval: :func:`kvcert.analysis.stats.test_outcome` (ci, op, threshold,
  skipped fraction; an ``unexercised`` test — too few rows of the kind it needs — stays so, and must be named in
  the reasons);
* the minimum cell: :func:`kvcert.analysis.claims.cell_reasons` of the claim's counts and registered minimums, and
  the cells without data the reasons name;
* each placebo's verdict from its own tests, the placebo block's ``passes`` = some placebo holds;
* the verdict: :func:`kvcert.analysis.stats.claim_verdict` (outcomes, cells, placebo); a replay claim's verdict on
  the grid's second data seed (``data_seed_stability``) likewise, as far as it is recorded (its placebos are not).

:func:`contradictions` lists, one line each, every recorded outcome or verdict these rules do not give (a verdict
edited by hand, an outcome beside its interval); :func:`check_verdicts` refuses a document with any, in one line.
The report (:func:`kvcert.analysis.report.build_report`) and ``kvcert reference update`` / ``compare`` call it.
"""

from __future__ import annotations

from typing import Mapping, Sequence

from .claims import cell_reasons
from .claims_document import ClaimResult, ClaimsDocument, ClaimTest
from .stats import claim_verdict, test_outcome

#: the prefix of a reason naming a registered cell without data (:func:`kvcert.analysis.claims.cell_reasons`)
NO_DATA = "no data for cell "


class VerdictContradicted(ValueError):
    """A claims document whose recorded verdicts (or outcomes) the registered rules do not give from its tests."""


def _nan(x) -> float:
    return float("nan") if x is None else float(x)


def outcome(ci: Sequence, op: str, threshold: float, resamples: int, skipped: int) -> str:
    """A test's outcome from its recorded interval (None: not finite), as the claims step decides it."""
    low, high = (ci or [None, None])[:2]
    fraction = skipped / resamples if resamples else 1.0
    return test_outcome(_nan(low), _nan(high), op, float(threshold), fraction)


def _test_line(t: ClaimTest) -> str:
    ci = ", ".join("–" if x is None else f"{x:.4g}" for x in (t.ci or [None, None]))
    return f"{t.statistic} [{ci}] {t.op} {t.threshold:g}"


def cells_ok(claim: ClaimResult) -> bool:
    """The minimum-cell rule on the recorded counts (``cell`` and its ``minimum``) and the cells the reasons say
    have no data."""
    need = dict(claim.cell.get("minimum") or {})
    counts = {k: v for k, v in claim.cell.items() if k != "minimum"}
    missing = [r[len(NO_DATA):] for r in map(str, claim.reasons) if r.startswith(NO_DATA)]
    return not cell_reasons(claim.source, counts, need, missing)


def _placebo_verdict(claim: ClaimResult, statistic: Mapping, ok: bool, where: str, problems: list[str]) -> str:
    """A placebo run's verdict from its tests (the claim's operators and thresholds on the placebo's intervals)."""
    outcomes = []
    for t in claim.tests:
        est = statistic.get(t.statistic)
        if not isinstance(est, Mapping):
            problems.append(f"{where}: no test {t.statistic}")
            outcomes.append("unclear")
            continue
        recorded = est.get("outcome")
        derived = recorded if recorded == "unexercised" else outcome(est.get("ci"), t.op, t.threshold,
                                                                     int(est.get("resamples") or 0),
                                                                     int(est.get("skipped") or 0))
        if recorded != derived:
            problems.append(f"{where}: {t.statistic} recorded {recorded!r}, its interval gives {derived!r}")
        outcomes.append(derived)
    return claim_verdict(outcomes, ok)


def _data_seed(block) -> list[str]:
    """A replay claim's verdict on the grid's second data seed (``data_seed_stability``, where there is one): its
    outcomes from its intervals, its verdict from them (its placebos are not recorded: "holds" and "uninformative"
    are both what all-pass tests give), its minimum cell from its reasons."""
    if block is None:
        return []
    problems, outcomes = [], []
    for t in block.tests:
        derived = t.outcome if t.outcome == "unexercised" else outcome(t.ci, t.op, t.threshold, t.resamples, t.skipped)
        if derived != t.outcome:
            problems.append(f"data seed {block.seed}: test {_test_line(t)} recorded {t.outcome!r}, its interval gives "
                            f"{derived!r}")
        outcomes.append(derived)
    ok = not any(str(r).startswith(NO_DATA) or "pre-registered minimum" in str(r) for r in block.reasons)
    allowed = {claim_verdict(outcomes, ok, False), claim_verdict(outcomes, ok, True)}
    if block.verdict not in allowed:
        problems.append(f"data seed {block.seed}: verdict {block.verdict!r}, its tests give "
                        f"{' or '.join(sorted(allowed))}")
    return problems


def claim_contradictions(claim: ClaimResult) -> list[str]:
    """Every recorded outcome and verdict of one claim that the rules do not give (empty: it follows)."""
    problems: list[str] = []
    outcomes = []
    for t in claim.tests:
        if t.outcome == "unexercised":
            if not any(str(r).startswith(f"{t.statistic}: unexercised") for r in claim.reasons):
                problems.append(f"{t.statistic} recorded 'unexercised' without its reason")
            outcomes.append(t.outcome)
            continue
        derived = outcome(t.ci, t.op, t.threshold, t.resamples, t.skipped)
        if derived != t.outcome:
            problems.append(f"test {_test_line(t)} recorded {t.outcome!r}, its interval gives {derived!r}")
        outcomes.append(derived)
    ok = cells_ok(claim)
    block = claim.placebo
    holds = False
    for run in block.placebos:
        verdict = _placebo_verdict(claim, run.statistic, ok, f"placebo {run.kind}", problems)
        if verdict != run.verdict:
            problems.append(f"placebo {run.kind} recorded {run.verdict!r}, its tests give {verdict!r}")
        holds = holds or verdict == "holds"
    if bool(block.passes) != holds:
        problems.append(f"the placebo block says passes={block.passes}, its placebos say {holds}")
    problems.extend(_data_seed(getattr(claim, "data_seed_stability", None)))
    verdict = claim_verdict(outcomes, ok, holds)
    if verdict != claim.verdict:
        why = "; ".join(f"{_test_line(t)}: {o}" for t, o in zip(claim.tests, outcomes))
        cells = "" if ok else ", a cell below its minimum"
        placebo = ", a placebo holds" if holds else ""
        problems.insert(0, f"verdict {claim.verdict!r}, but its tests give {verdict!r} ({why}{cells}{placebo})")
    return problems


def contradictions(doc: ClaimsDocument) -> list[str]:
    """One line per claim whose recorded outcomes or verdict the rules do not give: ``C7: verdict …``."""
    return [f"{c.id}: " + "; ".join(p) for c in doc.claims if (p := claim_contradictions(c))]


def check_verdicts(doc: ClaimsDocument, where: str) -> None:
    """Refuse (:class:`VerdictContradicted`, one line) a document with a verdict its tests do not give."""
    lines = contradictions(doc)
    if lines:
        more = f" (and {len(lines) - 1} more claims)" if len(lines) > 1 else ""
        raise VerdictContradicted(f"{where}: {lines[0]}{more}: not what the registered rules give; the file was "
                                  "edited or made by other code — rerun the claims step (`kvcert claims`)")
