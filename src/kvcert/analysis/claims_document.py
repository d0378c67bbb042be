"""The claims document: ``claims.json`` as one type, defined once.

:class:`ClaimsDocument` is what the claims step writes (:func:`kvcert.analysis.steps.claims_step` builds it and
writes :meth:`ClaimsDocument.to_dict`) and what the report reads back (:meth:`ClaimsDocument.read`: every key
present, no unknown key, the analysis plan it was computed under). Its parts:

* :class:`ClaimResult` — one claim: its statement, its tests (:class:`ClaimTest`, the first the primary, whose
  statistic, value, interval, operator and threshold the claim repeats at its top level), its verdict and the
  reasons, its placebo block (:class:`PlaceboBlock` of :class:`PlaceboRun`), the verdict's stability over other
  bootstrap seeds (:class:`SeedStability`), a replay claim's tests and verdict on the grid's second data seed
  (:class:`DataSeedStability`, where the grid registers one), its cell counts, registered cells, the paper's outcome
  (:class:`PaperOutcome`) and its details (the statistics beside the tests, breakdowns: each statistic's own keys,
  kept as a mapping);
* :class:`Provenance` — the freeze, the analysis commit, the bootstrap and the input tables' provenance (the second
  data seed's replay tables too, where the grid registers one);
* the registered ``analysis_plan`` (as frozen; :attr:`ClaimsDocument.plan` types it), the experiment's grid, the
  replay summary and the comparison signals' block (:mod:`kvcert.analysis.signals`), kept as mappings.

``to_dict(from_dict(x)) == x``, key order included: claims.json's bytes do not depend on the round trip.
A new key goes here and nowhere else.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Mapping

from ..config.analysis_plan import AnalysisPlan


class ClaimsDocumentError(ValueError):
    """A claims.json that is not one the claims step writes (a key missing or unknown, no analysis plan)."""


def _keys(data: Any, required: tuple[str, ...], optional: tuple[str, ...], what: str, where: str) -> None:
    """Refuse, in one line naming the key and the file, a mapping with a key missing or unknown."""
    if not isinstance(data, Mapping):
        raise ClaimsDocumentError(f"{where}: {what} is not a mapping; rerun the claims step")
    for key in required:
        if key not in data:
            raise ClaimsDocumentError(f"{where}: {what} lacks the key {key!r}; rerun the claims step")
    for key in data:
        if key not in required and key not in optional:
            raise ClaimsDocumentError(f"{where}: unknown key {key!r} in {what} (known: "
                                      f"{', '.join((*required, *optional))}); rerun the claims step")


@dataclass(frozen=True)
class ClaimTest:
    """One registered test: its statistic against its threshold, the bootstrap estimate and interval, its
    outcome; a replay test also its unit and the intervals over the other units beside it."""

    statistic: str
    op: str
    threshold: float
    ours: bool
    estimate: float | None
    ci: list
    level: float
    resamples: int
    skipped: int
    skipped_fraction: float
    outcome: str
    unit: str | None = None
    beside: dict = field(default_factory=dict)

    KEYS = ("statistic", "op", "threshold", "ours", "estimate", "ci", "level", "resamples", "skipped",
            "skipped_fraction", "outcome")

    @classmethod
    def from_dict(cls, data: Mapping, what: str, where: str) -> "ClaimTest":
        _keys(data, cls.KEYS, ("unit", "beside"), what, where)
        return cls(**{k: data[k] for k in cls.KEYS}, unit=data.get("unit"), beside=dict(data.get("beside") or {}))

    def to_dict(self) -> dict:
        out = {k: getattr(self, k) for k in self.KEYS}
        if self.unit is not None:
            out["unit"] = self.unit
            out["beside"] = self.beside
        return out


@dataclass(frozen=True)
class PlaceboRun:
    """A claim's tests run again on one placebo: its verdict, each test's estimate and outcome, the reasons."""

    kind: str
    description: str
    verdict: str
    statistic: dict
    reasons: list

    KEYS = ("kind", "description", "verdict", "statistic", "reasons")

    @classmethod
    def from_dict(cls, data: Mapping, what: str, where: str) -> "PlaceboRun":
        _keys(data, cls.KEYS, (), what, where)
        return cls(**{k: data[k] for k in cls.KEYS})

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.KEYS}


@dataclass(frozen=True)
class PlaceboBlock:
    """A claim's placebos: the leading one (the first that holds, else the first) and every one; not
    ``applicable`` (with the ``reason``) where the statistic reads no signal."""

    applicable: bool
    statistic: dict | None
    verdict: str | None
    passes: bool
    placebos: list[PlaceboRun]
    kind: str | None = None
    reason: str | None = None

    @classmethod
    def from_dict(cls, data: Mapping, what: str, where: str) -> "PlaceboBlock":
        _keys(data, ("applicable", "statistic", "verdict", "passes", "placebos"), ("kind", "reason"), what, where)
        return cls(data["applicable"], data["statistic"], data["verdict"], data["passes"],
                   [PlaceboRun.from_dict(p, f"{what}, placebo {i + 1}", where) for i, p in enumerate(data["placebos"])],
                   data.get("kind"), data.get("reason"))

    def to_dict(self) -> dict:
        out: dict = {"applicable": self.applicable}
        if self.kind is not None:
            out["kind"] = self.kind
        out.update(statistic=self.statistic, verdict=self.verdict, passes=self.passes)
        if self.reason is not None:
            out["reason"] = self.reason
        out["placebos"] = [p.to_dict() for p in self.placebos]
        return out


@dataclass(frozen=True)
class SeedStability:
    """The verdict under other bootstrap seeds: how many, the share that agrees (None without seeds), the
    verdicts' counts and the first seed."""

    seeds: int
    agree: float | None
    verdicts: dict
    first_seed: int | None = None

    @classmethod
    def from_dict(cls, data: Mapping, what: str, where: str) -> "SeedStability | None":
        """None for ``{}``: the stability check was not run."""
        if not data:
            return None
        _keys(data, ("seeds", "agree", "verdicts"), ("first_seed",), what, where)
        return cls(data["seeds"], data["agree"], data["verdicts"], data.get("first_seed"))

    def to_dict(self) -> dict:
        out = {"seeds": self.seeds, "agree": self.agree, "verdicts": self.verdicts}
        if self.first_seed is not None:
            out["first_seed"] = self.first_seed
        return out


@dataclass(frozen=True)
class DataSeedStability:
    """A replay claim's tests on the prompts of the grid's second data seed (``replay.stability``): the same
    statistics, intervals by the same bootstrap (the registered unit and seed) and the verdict the same rules give
    (placebos and minimum cell included), beside the deciding seed's verdict, which they do not change: the seed,
    its prompts, each test (:class:`ClaimTest`), the verdict, its reasons and whether it agrees with the claim's."""

    seed: int
    prompts: int
    tests: list[ClaimTest]
    verdict: str
    reasons: list
    agree: bool

    KEYS = ("seed", "prompts", "tests", "verdict", "reasons", "agree")

    @classmethod
    def from_dict(cls, data: Mapping, what: str, where: str) -> "DataSeedStability":
        _keys(data, cls.KEYS, (), what, where)
        tests = [ClaimTest.from_dict(t, f"{what}, test {i + 1}", where) for i, t in enumerate(data["tests"])]
        return cls(data["seed"], data["prompts"], tests, data["verdict"], data["reasons"], data["agree"])

    def to_dict(self) -> dict:
        return {"seed": self.seed, "prompts": self.prompts, "tests": [t.to_dict() for t in self.tests],
                "verdict": self.verdict, "reasons": self.reasons, "agree": self.agree}


@dataclass(frozen=True)
class PaperOutcome:
    """The paper's outcome of a claim as ``claims.yaml`` states it: its value in words and its verdict (None for a
    claim beyond the paper)."""

    value: str | None
    verdict: str | None

    @classmethod
    def from_dict(cls, data: Mapping, what: str, where: str) -> "PaperOutcome":
        _keys(data, ("value", "verdict"), (), what, where)
        return cls(data["value"], data["verdict"])

    def to_dict(self) -> dict:
        return {"value": self.value, "verdict": self.verdict}


@dataclass(frozen=True)
class ClaimResult:
    """One claim's result: :class:`ClaimTest` s (the first the primary), verdict, placebos, stability, cells."""

    id: str
    statement: str
    source: str
    metric: str
    kill: str
    tests: list[ClaimTest]
    verdict: str
    reasons: list[str]
    cell: dict
    paper: PaperOutcome
    placebo: PlaceboBlock
    seed_stability: SeedStability | None = None  # None: not computed (``{}`` in claims.json)
    cells: dict = field(default_factory=dict)  # the registered cells (claims.yaml) the claim's rows come from
    details: dict = field(default_factory=dict)
    beyond_paper: bool = False
    data_seed_stability: DataSeedStability | None = None  # None: no second data seed (absent from claims.json)

    #: the primary test's fields repeated at the claim's top level, as claims.json names them
    PRIMARY = {"statistic": "statistic", "value": "estimate", "ci": "ci", "ci_level": "level", "op": "op",
               "threshold": "threshold"}
    KEYS = ("id", "statement", "source", "metric", "kill", *PRIMARY, "verdict", "reasons", "tests", "placebo",
            "seed_stability", "cell", "cells", "paper", "details", "beyond_paper")
    #: written only where computed (a grid with a second replay data seed), after ``seed_stability``
    OPTIONAL = ("data_seed_stability",)

    @property
    def primary(self) -> ClaimTest:
        return self.tests[0]

    @property
    def statistic(self) -> str:
        return self.primary.statistic

    @property
    def value(self) -> float | None:
        return self.primary.estimate

    @classmethod
    def from_dict(cls, data: Mapping, where: str) -> "ClaimResult":
        what = f"claim {data.get('id') if isinstance(data, Mapping) else '?'}"
        _keys(data, cls.KEYS, cls.OPTIONAL, what, where)
        tests = [ClaimTest.from_dict(t, f"{what}, test {i + 1}", where) for i, t in enumerate(data["tests"])]
        if not tests:
            raise ClaimsDocumentError(f"{where}: {what} has no tests; rerun the claims step")
        for key, name in cls.PRIMARY.items():
            if data[key] != getattr(tests[0], name):
                raise ClaimsDocumentError(f"{where}: {what}'s {key} {data[key]!r} is not its first test's "
                                          f"{getattr(tests[0], name)!r}; rerun the claims step")
        return cls(data["id"], data["statement"], data["source"], data["metric"], data["kill"], tests, data["verdict"],
                   data["reasons"], data["cell"], PaperOutcome.from_dict(data["paper"], f"{what}'s paper", where),
                   PlaceboBlock.from_dict(data["placebo"], f"{what}'s placebo", where),
                   SeedStability.from_dict(data["seed_stability"], f"{what}'s seed_stability", where),
                   data["cells"], data["details"], data["beyond_paper"],
                   DataSeedStability.from_dict(data["data_seed_stability"], f"{what}'s data_seed_stability", where)
                   if "data_seed_stability" in data else None)

    def to_dict(self) -> dict:
        p = self.primary
        return {
            "id": self.id, "statement": self.statement, "source": self.source, "metric": self.metric,
            "kill": self.kill, **{key: getattr(p, name) for key, name in self.PRIMARY.items()},
            "verdict": self.verdict, "reasons": self.reasons, "tests": [t.to_dict() for t in self.tests],
            "placebo": self.placebo.to_dict(),
            "seed_stability": {} if self.seed_stability is None else self.seed_stability.to_dict(),
            **({} if self.data_seed_stability is None else {"data_seed_stability": self.data_seed_stability.to_dict()}),
            "cell": self.cell, "cells": self.cells, "paper": self.paper.to_dict(), "details": self.details,
            "beyond_paper": self.beyond_paper,
        }


@dataclass(frozen=True)
class Provenance:
    """What the claims were computed from: the freeze, the analysis commit, the bootstrap, the scores' and the
    replay tables' provenance, and the seconds the claims took; ``stability_replay``: the second data seed's
    replay tables' provenance (written only where there are some)."""

    prereg_hash: str
    frozen_utc: str
    freeze_record: str
    analysis_git_commit: str | None
    bootstrap: dict
    scores: dict
    replay: list
    seconds: float
    stability_replay: list = field(default_factory=list)

    KEYS = ("prereg_hash", "frozen_utc", "freeze_record", "analysis_git_commit", "bootstrap", "scores", "replay",
            "seconds")

    @classmethod
    def from_dict(cls, data: Mapping, where: str) -> "Provenance":
        _keys(data, cls.KEYS, ("stability_replay",), "provenance", where)
        return cls(**{k: data[k] for k in cls.KEYS}, stability_replay=list(data.get("stability_replay") or []))

    def to_dict(self) -> dict:
        out = {k: getattr(self, k) for k in self.KEYS}
        if self.stability_replay:
            out["stability_replay"] = self.stability_replay
        return out


@dataclass(frozen=True)
class ClaimsDocument:
    """claims.json: the experiment, the paper, the verdict rules, the registered analysis plan, the grid, the
    provenance, the replay summary, every :class:`ClaimResult` in order and the comparison signals' block."""

    experiment: str
    paper: dict
    verdict_rules: str | None
    analysis_plan: dict
    grid: dict
    provenance: Provenance
    replay_summary: dict | None
    claims: list[ClaimResult]
    comparison_signals: dict | None

    KEYS = ("experiment", "paper", "verdict_rules", "analysis_plan", "grid", "provenance", "replay_summary", "claims",
            "comparison_signals")

    @cached_property
    def plan(self) -> AnalysisPlan:
        """The analysis plan the claims were computed under, typed."""
        return AnalysisPlan.from_dict(self.analysis_plan)

    @classmethod
    def from_dict(cls, data: Mapping, where: str = "claims.json") -> "ClaimsDocument":
        """The document of a parsed claims.json (``where``: its path, for the messages)."""
        _keys(data, cls.KEYS, (), "the claims document", where)
        if not data["analysis_plan"]:
            raise ClaimsDocumentError(f"{where}: no analysis_plan (the plan its claims were computed under); rerun "
                                      "the claims step")
        return cls(data["experiment"], data["paper"], data["verdict_rules"], data["analysis_plan"], data["grid"],
                   Provenance.from_dict(data["provenance"], where), data["replay_summary"],
                   [ClaimResult.from_dict(c, where) for c in data["claims"]], data["comparison_signals"])

    @classmethod
    def read(cls, path: str | Path) -> "ClaimsDocument":
        """The document of the claims.json at ``path``."""
        return cls.from_dict(json.loads(Path(path).read_text()), Path(path).as_posix())

    def to_dict(self) -> dict:
        return {"experiment": self.experiment, "paper": self.paper, "verdict_rules": self.verdict_rules,
                "analysis_plan": self.analysis_plan, "grid": self.grid, "provenance": self.provenance.to_dict(),
                "replay_summary": self.replay_summary, "claims": [c.to_dict() for c in self.claims],
                "comparison_signals": self.comparison_signals}
