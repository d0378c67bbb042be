"""A run's claims against the committed reference's, test by test, with a tolerance each difference is measured in.

``kvcert reference compare`` (and the last lines of a Snakemake run of an experiment that keeps a reference) read both
runs' ``claims.json`` (typed: :class:`kvcert.analysis.claims_document.ClaimsDocument`; a verdict its own tests do not
give is refused, :mod:`kvcert.analysis.verdict_check`) and ``summary.json`` (its verdicts must be claims.json's, its
freeze and record-code digests are named), and compare every claim's verdict and every test's estimate and interval
ends. A difference is *the same up to rounding across machines* when it is within the statistic's tolerance:

* a **share** (a coverage, a rate, an AUC, a difference of shares) is a count over a denominator n — the draws
  (replay rows) of the query kinds it reads, the generations of its cell, the smaller class of an AUC — and a unit
  whose value sits within a float rounding of its threshold (a draw whose error equals its radius to the last bits)
  can fall either side on another CPU: tolerance :data:`UNITS` / n (a fresh clone on an AMD CPU moved C8's later
  coverage by one robust draw in 648,000: 0.9903148 → 0.9903133, 1.5e-6 = 1.0 draw);
* a **rank correlation** of n draws (C2's within-cell Spearman, a median of them) moves in steps of 6 / (n (n² − 1))
  (one unit of Σ d²) when two near-equal draws swap ranks: tolerance :data:`UNITS` such steps;
* a **continuous** statistic (a tightness — a median of radius / error —, a ratio of gains) moves by
  the rounding of its inputs: tolerance :data:`RELATIVE`, relative (float64 rounding is 1e-16; the replay's radii and
  errors are float32 sums, 6e-8 each; the AMD clone moved C8's tightness, 5.59125 → 5.59124, ~2e-6 relative);
* a **verdict** that changed is never within tolerance.

Each line names every difference in those units ("1.0 draws of 648,000", "2.6e-06 relative"). :func:`compare` returns
the lines and the status: 0 every claim the same (up to rounding), 1 any claim differs or is missing on one side,
2 nothing to compare (no claims.json in the run or the reference).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from ..analysis.claims_document import ClaimResult, ClaimsDocument
from ..analysis.verdict_check import check_verdicts

#: a share is the same up to rounding within this many units of its denominator (draws, generations)
UNITS = 3
#: a continuous statistic is the same up to rounding within this relative difference
RELATIVE = 1e-5
#: statistics that are continuous functions of floats (everything else is a share of units)
CONTINUOUS = ("tightness", "spearman", "matched_tightness", "gain_ratio")
#: the status of :func:`compare`
SAME, DIFFERS, NOTHING = 0, 1, 2


@dataclass(frozen=True)
class Tolerance:
    """How a statistic's difference is measured: ``units`` of 1/``denominator`` (a share; ``unit`` names them) or
    relative (``denominator`` None)."""

    denominator: float | None
    unit: str = ""
    of: bool = True  # "… draws of 648,000"; False: the unit says its size itself

    def size(self, ours: float, ref: float) -> float:
        """The difference in this tolerance's units (draws, generations; or relative)."""
        if self.denominator is None:
            scale = max(abs(ours), abs(ref))
            return 0.0 if scale == 0 else abs(ours - ref) / scale
        return abs(ours - ref) * self.denominator

    @property
    def limit(self) -> float:
        return RELATIVE if self.denominator is None else UNITS

    def words(self, size: float) -> str:
        if self.denominator is None:
            return f"{size:.1e} relative"
        return f"{size:.1f} {self.unit}" + (f" of {self.denominator:,.0f}" if self.of else "")

    def describe(self) -> str:
        return f"{RELATIVE:g} relative" if self.denominator is None else self.words(UNITS).replace(".0 ", " ", 1)


def _kind_rows(doc: ClaimsDocument, claim: ClaimResult, kinds: list[str]) -> float | None:
    """The replay rows of ``kinds`` in the claim's budgets (the replay summary's per-kind observations, the claim's
    share of the budgets)."""
    by_kind = (doc.replay_summary or {}).get("by_kind") or {}
    rows = [by_kind.get(k, {}).get("observations") for k in kinds]
    if not rows or any(r is None for r in rows):
        return None
    budgets = (doc.replay_summary or {}).get("by_budget") or {}
    mine = claim.cells.get("budgets") or list(budgets)
    share = len([b for b in mine if f"{float(b):g}" in budgets]) / len(budgets) if budgets else 1.0
    return float(sum(rows)) * (share or 1.0)


def tolerance(doc: ClaimsDocument, claim: ClaimResult, statistic: str) -> Tolerance:
    """The statistic's tolerance (the module docstring): its denominator read from the claims document."""
    cell, details = claim.cell, claim.details
    if statistic.startswith("spearman") and details.get("step_cells") and details.get("observations"):
        n = round(details["observations"] / details["step_cells"])  # draws per step cell
        if n > 2:  # a rank correlation of n draws moves in steps of 6 / (n (n² − 1)) (one unit of Σ d²)
            return Tolerance(n * (n * n - 1) / 6, f"rank steps of 6/(n(n²−1)), n = {n} draws", of=False)
    if any(statistic.startswith(c) for c in CONTINUOUS):
        return Tolerance(None)
    if claim.source != "replay":
        if statistic.startswith("auc_") and cell.get("positives") and cell.get("negatives"):
            return Tolerance(float(min(cell["positives"], cell["negatives"])), "generations")
        return Tolerance(float(cell.get("generations") or 0) or None, "generations")
    if statistic.endswith("_diverged") and details.get("diverged_rows"):
        return Tolerance(float(details["diverged_rows"]), "draws")
    if statistic.startswith("coverage_anytime") and details.get("paths"):
        return Tolerance(float(details["paths"]), "paths")
    kinds = [k for k in (claim.cells.get("query_kinds") or []) if f"_{k}" in statistic] or list(
        claim.cells.get("query_kinds") or [])
    rows = _kind_rows(doc, claim, kinds) or float(details.get("observations") or 0) or None
    if rows and statistic.endswith("_worst_cell"):
        groups = len(details.get("later_coverage_by_budget_layer") or {}) or 1
        rows = rows / groups
    return Tolerance(rows, "draws") if rows else Tolerance(None)


def _num(x) -> str:
    return "–" if x is None else f"{x:.6g}"


def _values(t) -> list[tuple[str, float | None]]:
    ci = list(t.ci or [None, None]) + [None, None]
    return [("estimate", t.estimate), ("interval low", ci[0]), ("interval high", ci[1])]


def claim_line(doc: ClaimsDocument, ours: ClaimResult | None, ref: ClaimResult | None) -> tuple[str, bool]:
    """One claim: ``same`` (up to rounding: every test's estimate and interval within its tolerance, the verdict
    unchanged) with the largest difference, or ``DIFFERS`` naming each difference and its size; and whether the
    same."""
    if ours is None or ref is None:
        cid = (ours or ref).id
        return f"  {cid}: DIFFERS — {'not in this run' if ours is None else 'not in the reference'}", False
    diffs, largest = [], []
    if ours.verdict != ref.verdict:
        diffs.append(f"verdict {ours.verdict} (reference: {ref.verdict})")
    ref_tests = {t.statistic: t for t in ref.tests}
    our_tests = {t.statistic: t for t in ours.tests}
    for name in dict.fromkeys([*ref_tests, *our_tests]):
        a, b = our_tests.get(name), ref_tests.get(name)
        if a is None or b is None:
            diffs.append(f"{name} {'not in this run' if a is None else 'not in the reference'}")
            continue
        tol = tolerance(doc, ref, name)
        for (what, x), (_, y) in zip(_values(a), _values(b)):
            if x is None or y is None or not (math.isfinite(x) and math.isfinite(y)):
                if (x is None) != (y is None):
                    diffs.append(f"{name} {what} {_num(x)} (reference {_num(y)})")
                continue
            size = tol.size(x, y)
            if size > tol.limit:
                diffs.append(f"{name} {what} {_num(x)} (reference {_num(y)}, {x - y:+.3g}: {tol.words(size)}, "
                             f"tolerance {tol.describe()})")
            elif size > 0:
                largest.append((size / tol.limit, f"{name} {what} {tol.words(size)} (tolerance {tol.describe()})"))
    if diffs:
        return f"  {ours.id}: DIFFERS — " + "; ".join(diffs), False
    within = f"; the largest difference {max(largest)[1]}" if largest else "; identical"
    return (f"  {ours.id}: same as the reference — {ours.verdict}, {ours.statistic} = {_num(ours.value)}{within}",
            True)


def read_run(folder: Path) -> tuple[ClaimsDocument | None, dict | None]:
    """A run's (or reference's) claims.json, typed, and summary.json (None where absent); refused in one line: a
    verdict its tests do not give, a summary whose verdict or value is not claims.json's."""
    claims, summary = folder / "claims.json", folder / "summary.json"
    doc = ClaimsDocument.read(claims) if claims.is_file() else None
    if doc is not None:
        check_verdicts(doc, claims.as_posix())
    data = json.loads(summary.read_text()) if summary.is_file() else None
    if doc is not None and data is not None:
        for c in doc.claims:
            s = (data.get("claims") or {}).get(c.id) or {}
            if s.get("verdict") != c.verdict or s.get("value") != c.value:
                raise ValueError(f"{summary}: claim {c.id} is {s.get('verdict')!r} = {s.get('value')!r} there, "
                                 f"{c.verdict!r} = {c.value!r} in claims.json beside it; rerun the report step")
    return doc, data


def compare(run_dir: str | Path, reference_dir: str | Path) -> tuple[list[str], int]:
    """The run's claims against the reference's: a head line, one line per claim; and the status
    (:data:`SAME`, :data:`DIFFERS`, :data:`NOTHING`). No lines where the experiment keeps no reference."""
    run_dir, reference_dir = Path(run_dir), Path(reference_dir)
    ref, ref_summary = read_run(reference_dir)
    if ref is None:
        return [], NOTHING
    ours, our_summary = read_run(run_dir)
    if ours is None:
        return [f"kvcert: no {run_dir / 'claims.json'} yet to compare with the reference {reference_dir}"], NOTHING
    ref_claims, our_claims = {c.id: c for c in ref.claims}, {c.id: c for c in ours.claims}
    results = [claim_line(ref, our_claims.get(cid), ref_claims.get(cid))
               for cid in dict.fromkeys([*ref_claims, *our_claims])]
    n_same = sum(same for _, same in results)
    same_freeze = ours.provenance.prereg_hash == ref.provenance.prereg_hash
    head = (f"kvcert: this run against the reference {reference_dir}: {n_same} of {len(results)} claims the same "
            "(up to rounding across machines)"
            + ("" if same_freeze else
               f" (the reference was made under pre-registration {ref.provenance.prereg_hash[:12]}, this run under "
               f"{ours.provenance.prereg_hash[:12]}: a difference may be the amendment's; `kvcert reference update` "
               "makes this run the reference)"))
    made = [(ref_summary or {}).get("code_digests"), (our_summary or {}).get("code_digests")]
    if made[0] != made[1]:
        head += f"; records made by code {made[1]} (the reference's: {made[0]})"
    status = SAME if n_same == len(results) and results else DIFFERS
    return [head, *(line for line, _ in results)], status
