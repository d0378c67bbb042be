"""What every section of the report reads (:class:`ReportData`): the typed claims document
(:class:`kvcert.analysis.claims_document.ClaimsDocument`), the tables it was made from and where the report goes."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Mapping

import pandas as pd

from ..config.analysis_plan import AnalysisPlan
from .claims_document import ClaimResult, ClaimsDocument


@dataclass
class ReportData:
    """The claims document, the report's folders, the experiment's grid, the scored rows, the replay rows and
    the main tasks (None: every task)."""

    claims_doc: ClaimsDocument
    out: Path
    fig_dir: Path
    grid: Mapping
    scores_ok: pd.DataFrame | None
    replay: pd.DataFrame
    tasks: list[str] | None

    @property
    def claims(self) -> list[ClaimResult]:
        return self.claims_doc.claims

    @property
    def plan(self) -> AnalysisPlan:
        """The analysis plan the claims were computed under."""
        return self.claims_doc.plan

    @cached_property
    def by_stat(self) -> dict[str, ClaimResult]:
        """{a test's statistic: its claim}."""
        return {t.statistic: c for c in self.claims for t in c.tests}

    @property
    def delta(self) -> float:
        return self.plan.delta

    @property
    def pct(self) -> str:
        """The bootstrap intervals' level as text ("90 %")."""
        return f"{100 * self.plan.bootstrap.level:g} %"

    @property
    def multiturn_cell(self) -> Mapping:
        return self.grid.get("multiturn") or {}

    @cached_property
    def gate_versus_random(self):
        """The multi-turn gate against random gating at its rate, paired by conversation
        (:class:`kvcert.analysis.multiturn_recall.GateVersusRandom`); None without multi-turn runs."""
        from .multiturn_recall import gate_versus_random

        if self.scores_ok is None or not self.multiturn_cell:
            return None
        return gate_versus_random(self.scores_ok, self.multiturn_cell, self.gate_threshold, self.plan.bootstrap)

    @property
    def gate_threshold(self) -> float:
        """The multi-turn gate's threshold: the grid's cell may register its own (a model's radii have their own
        scale), else the plan's ``multiturn_gate.threshold`` (0.1 where none)."""
        gate = self.plan.multiturn_gate.threshold
        return float(self.multiturn_cell.get("gate_threshold", 0.1 if gate is None else gate))
