"""The report's claims: the claims table (our verdict beside the paper's and other runs', each claim's placebo
and the verdict's stability over bootstrap seeds and, where the grid registers a second replay data seed, the
verdict the same tests give on its prompts) and the tests table (the registered statistics, with the paper's
pooled statistic reported beside them), read from the typed claims document
(:class:`kvcert.analysis.claims_document.ClaimsDocument`)."""

from __future__ import annotations

from typing import Mapping, Sequence

import pandas as pd

from .claims_document import ClaimResult, ClaimTest
from .document import BR, Document, fmt, fmt_ci
from .report_data import ReportData

MARK = {"pass": "✓", "fail": "✗", "unclear": "?", "unexercised": "–"}
OP_TEXT = {">=": "≥", ">": ">", "<=": "≤", "<": "<"}


def agreement(ours: str, paper: str | None) -> str:
    """'same' / 'differs' against the paper's verdict; '–' where the paper states none (a claim beyond it)."""
    if not paper:
        return "–"
    return "same" if paper == ours else "differs"


def placebo_text(c: ClaimResult) -> str:
    """The claim's placebo in a few words: which one leads, its verdict under the same tests."""
    p = c.placebo
    if not p.applicable:
        return "not applicable"
    text = f"{p.kind.replace('_', ' ')}: {p.verdict}"
    return f"**{text} — passes**" if p.passes else text


def stability_text(c: ClaimResult) -> str:
    """The verdict's stability: the share of other bootstrap seeds that agree and, under it, the verdict on the
    second data seed's prompts (:func:`data_seed_text`)."""
    st = c.seed_stability
    text = "–" if st is None or not st.seeds else f"{100 * st.agree:.0f} % of {st.seeds} seeds"
    return text + (BR + data_seed_text(c) if c.data_seed_stability is not None else "")


def data_seed_text(c: ClaimResult) -> str:
    """A replay claim's verdict on the second data seed's prompts, in a few words: "data seed 9700 (48 prompts):
    holds (agrees)"."""
    d = c.data_seed_stability
    return f"data seed {d.seed} ({d.prompts} prompts): {d.verdict} ({'agrees' if d.agree else 'differs'})"


def beside_line(run: Mapping, claim_id: str) -> str:
    """A beside run's verdict and value for one claim, under the paper's in the claims table; what it is when
    that run is absent (the command that makes it is in the paragraph above the table) or lacks the claim."""
    label = f"*{run['label']}* — "
    if not run.get("run"):
        return label + "not run"
    theirs = (run.get("claims") or {}).get(claim_id)
    if not theirs:
        return label + "no such claim"
    return label + f"{theirs['verdict']}: {fmt(theirs.get('value'))}"


def claim_rows(claims: list[ClaimResult], stand_ins: bool = False, beside: Sequence[Mapping] = ()) -> list[list[str]]:
    """The claims table: one row per claim (its tests are in :func:`test_rows`); the paper's verdict and value
    in one column, whether ours is the same beside it (``stand_ins``, a rehearsal: no agreement is claimed),
    and under it, a line per beside run (``kvcert report --beside``: its verdict and value) — folded into the
    paper's column, so that the table keeps its seven columns at 800 px."""
    rows = []
    for c in claims:
        statement = c.statement + (" (this project's claim, beyond the paper)" if c.beyond_paper else "")
        verdict = c.paper.verdict
        if not verdict:
            theirs = str(c.paper.value or "–")
        elif stand_ins:
            theirs = f"{verdict}: {c.paper.value or '–'}"
        else:
            theirs = f"{verdict}: {c.paper.value or '–'} ({agreement(c.verdict, verdict)})"
        theirs += "".join(BR + beside_line(b, c.id) for b in beside)
        rows.append([c.id, statement, f"**{c.verdict}**", theirs, placebo_text(c), stability_text(c),
                     "; ".join(c.reasons)])
    return rows


CLAIM_HEADER = ["claim", "statement", "our verdict", "paper's verdict: value (ours same?)", "placebo (same tests)",
                "stable over seeds", "notes"]


def claim_header(beside: Sequence[Mapping] = ()) -> list[str]:
    """:data:`CLAIM_HEADER`; with beside runs, the paper's column names them too (a line each under the paper's)."""
    if not beside:
        return list(CLAIM_HEADER)
    return [*CLAIM_HEADER[:3], CLAIM_HEADER[3] + ", then " + ", ".join(f"{b['label']}'s" for b in beside),
            *CLAIM_HEADER[4:]]


def pooled_counterpart(statistic: str) -> str | None:
    """The paper's pooled statistic reported beside a registered one (None where the test is the paper's own)."""
    if statistic == "spearman_within_cell":
        return "spearman"
    return statistic.replace("_stratified", "") if "_stratified" in statistic else None


def test_rows(claims: list[ClaimResult]) -> list[list[str]]:
    """One row per registered test — statistic, threshold, estimate, outcome, the leading placebo's estimate —
    then, marked, the paper's pooled statistic reported beside it (not tested)."""
    rows = []
    for c in claims:
        stats = c.details.get("statistics") or {}
        placebo = c.placebo.statistic or {}
        for t in c.tests:
            p = placebo.get(t.statistic)
            rows.append([c.id, f"`{t.statistic}` {OP_TEXT.get(t.op, t.op)} {t.threshold:g}{'†' if t.ours else ''}",
                         fmt_ci(t) + unit_text(t), f"{MARK[t.outcome]} {t.outcome}", fmt_ci(p) if p else "–"])
            beside = pooled_counterpart(t.statistic)
            if beside and beside in stats:
                rows.append([c.id, f"`{beside}` (the paper's pooled statistic; reported, not tested)",
                             fmt_ci(stats[beside]), "–", "–"])
    return rows


TEST_HEADER = ["claim", "test (passes when)", "estimate [90 % CI]", "outcome", "leading placebo [90 % CI]"]
#: a replay test's bootstrap unit, in words (``bootstrap.replay_unit`` / ``replay_beside``)
UNIT_WORDS = {"cell": "replay cells", "example_layer": "prompt × layer", "example": "prompts"}


def unit_text(test: ClaimTest) -> str:
    """A replay test's unit and, where registered, the intervals over the other units beside it (not deciding):
    " (over prompts; prompt × layer [a, b], replay cells [c, d])"; empty for a generation test."""
    unit = test.unit
    if not unit:
        return ""
    others = "; ".join(f"{UNIT_WORDS.get(u, u)} [{fmt(b['ci'][0])}, {fmt(b['ci'][1])}]" for u, b in test.beside.items())
    return f" (over {UNIT_WORDS.get(unit, unit)}" + (f"; beside: {others}" if others else "") + ")"


def beside_paragraph(beside: Sequence[Mapping], prereg_hash: str | None) -> str:
    """The beside runs in one sentence: which experiment each line under the paper's verdict is, and whether it
    ran (the command that makes it where it did not)."""
    parts = []
    for b in beside:
        if not b.get("run"):
            parts.append(f"**{b['label']}** — not run (`{b['command']}`): {b['path']} is absent")
            continue
        models = ", ".join((b.get("grid") or {}).get("models") or []) or "–"
        same = ("the same pre-registration" if b.get("prereg_hash") == prereg_hash
                else "another pre-registration, see Provenance")
        parts.append(f"**{b['label']}**: experiment {b.get('experiment')} (models {models}; {same})")
    return "Under the paper's verdict, each claim's verdict: value in another run — " + "; ".join(parts) + "."


def data_seed_sentence(claims: Sequence[ClaimResult]) -> str:
    """Where the grid registers a second replay data seed: what the line under the seeds' share is (empty
    otherwise)."""
    blocks = [c.data_seed_stability for c in claims if c.data_seed_stability is not None]
    if not blocks:
        return ""
    return (f" The replay claims are decided on the prompts of one data seed; the same tests, placebos included, "
            f"are run on {blocks[0].prompts} prompts of a second, disjoint data seed ({blocks[0].seed}), and the "
            "verdict they give there is shown under the seeds' share (data-seed stability; reported, deciding "
            "nothing; its tests are in the claim details).")


def claims_section(doc: Document, run: ReportData, beside: Sequence[Mapping]) -> None:
    """The run in one paragraph, the contents, the claims table (our verdict beside the paper's and the beside
    runs') and the tests table."""
    claims, claims_doc = run.claims, run.claims_doc
    verdicts = pd.Series([c.verdict for c in claims]).value_counts().to_dict()
    n_gen = 0 if run.scores_ok is None else len(run.scores_ok)
    seeds = claims[0].seed_stability.seeds if claims and claims[0].seed_stability else 0
    doc.paragraph(
        f"Reproduction of the pre-registered claims of Xie, *Error Certificates for KV-Cache Eviction via Randomized "
        f"Design* (arXiv 2607.21475). {n_gen} scored generations, {len(run.replay)} replay draws × queries. Verdicts: "
        + ", ".join(f"{v} {k}" for k, v in verdicts.items()) + f". Tests use {run.pct} bootstrap percentile intervals "
        "(✓ pass, ✗ fail, ? unclear, – unexercised); † marks thresholds set by this project before any run."
    )
    doc.contents()
    doc.heading("Claims")
    doc.paragraph(
        "The registered statistics are computed where the claim's information lives: C4's and C6's AUCs over the "
        "pairs of runs that share a stratum (model × task × condition × budget × length × method), C7's gate "
        "recomputing the same share of every stratum, C2's Spearman within the cells of one step — so that a score "
        "knowing only a run's cell cannot pass. The paper's pooled statistics are reported beside them. Each "
        "claim's tests are run again on **placebos** (a signal with no draw- or run-level information: the "
        "stratum's base rate, a random score; a step cell's median radius, radii permuted among a cell's draws): "
        "a claim whose tests pass while a placebo's pass too is **uninformative**, not held. Every verdict, "
        f"placebos included, is redone under {seeds or 'no'} "
        "other bootstrap seeds; the share that agrees is shown." + data_seed_sentence(claims))
    if beside:
        doc.paragraph(beside_paragraph(beside, claims_doc.provenance.prereg_hash))
    doc.table(claim_header(beside), claim_rows(claims, stand_ins=claims_doc.experiment == "rehearsal", beside=beside),
              css_class="claims")
    doc.heading("Tests", 3)
    doc.table([h.replace("90 %", run.pct) for h in TEST_HEADER], test_rows(claims))

