"""What every statistic of a claim is prepared into (:class:`Prepared`), how a family of statistics is computed
(:class:`Kind`), and the helpers the preparations share: units, an empty claim, a weighted ratio, the strata."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable, Mapping

import numpy as np
import pandas as pd

from ...config.analysis_plan import REPLAY_UNITS, AnalysisPlan
from ..stats import encode_units


@dataclass
class Prepared:
    """A claim's data made ready: the statistic on weights, units, point estimates, cell counts.

    ``unexercised``: {statistic: why} for tests whose data lack the rows they need.
    ``beside``: statistics reported beside the tests (not tested), bootstrapped once at the
    registered seed on units of their own (e.g. the pooled Spearman over every draw).
    ``selective``: ``statistic(w, only)`` computes only the statistics named in ``only`` (the
    tests, for the placebos and the stability seeds; None = all).
    """

    statistic: Callable[[np.ndarray], Mapping[str, tuple[np.ndarray, np.ndarray]]]
    codes: np.ndarray
    n_units: int
    point: dict[str, float]
    counts: dict[str, int]
    details: dict = field(default_factory=dict)
    unexercised: dict[str, str] = field(default_factory=dict)
    beside: "Prepared | None" = None
    selective: bool = False
    units: dict[str, np.ndarray] | None = None  # a replay statistic: its records' codes in each of REPLAY_UNITS

    def over(self, unit: str) -> "Prepared":
        """This preparation bootstrapped over ``unit`` (one of :data:`REPLAY_UNITS`; the beside statistic too);
        itself where it has no such units (a generation statistic, an empty claim)."""
        if self.units is None or unit not in self.units:
            return self
        codes = self.units[unit]
        beside = None if self.beside is None else self.beside.over(unit)
        return replace(self, codes=codes, n_units=int(codes.max()) + 1 if codes.size else 0, beside=beside)


@dataclass(frozen=True)
class Kind:
    """How a family of statistics is computed: its data set (``source``: "generations" or "replay"), its preparation,
    the minimum counts that apply (``analysis_plan.minimum_cell``), and, for the generation claims, the outcome whose
    stratum base rate is its placebo score (None: the statistic reads no signal, so no placebo applies)."""

    source: str
    prepare: Callable[[pd.DataFrame, AnalysisPlan], Prepared]
    minimum: tuple[str, ...]
    outcome: Callable[[pd.DataFrame], tuple[np.ndarray, np.ndarray]] | None = None


#: the counts of the AUC claims' minimum cell: the two classes as well as the generations
AUC_COUNTS = ("generations", "positives", "negatives")


def replay_units(cells: pd.DataFrame) -> dict[str, np.ndarray]:
    """Each replay cell's code in every unit of :data:`REPLAY_UNITS` (``cells``: one row per replay cell, with the
    model, example and layer columns): the cell itself, its example × layer, its example."""
    out = {"cell": np.arange(len(cells), dtype=np.int64)}
    for name, key in (("example_layer", ["model", "example_id", "layer"]), ("example", ["model", "example_id"])):
        out[name] = (cells.groupby(key, sort=True, observed=True).ngroup().to_numpy().astype(np.int64)
                     if len(cells) else np.zeros(0, dtype=np.int64))
    return out


def units(rows: pd.DataFrame) -> tuple[np.ndarray, int]:
    """Integer codes of each row's bootstrap unit (an example; a multi-turn unit), and their number."""
    return encode_units(rows["unit"].to_numpy())


def empty(rows: pd.DataFrame) -> Prepared | None:
    """A claim with no rows: nothing to bootstrap (its statistics are undefined, its cell too small)."""
    if len(rows):
        return None
    return Prepared(lambda w: {}, np.zeros(0, dtype=np.int64), 0, {}, {"generations": 0, "positives": 0, "negatives": 0})


def ratio(w: np.ndarray, num: np.ndarray, den: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(w · num) / (w · den) per resample row; undefined where the denominator is 0."""
    d = w @ den
    ok = d > 0
    return np.where(ok, (w @ num) / np.where(ok, d, 1.0), np.nan), ok


def signal_rows(rows: pd.DataFrame) -> tuple[pd.DataFrame, int]:
    """The rows that carry both the certificate signal and the confidence, and how many were dropped."""
    ok = rows["cert_signal"].notna() & rows["confidence"].notna()
    return rows[ok], int((~ok).sum())


def strata_codes(rows: pd.DataFrame, plan: AnalysisPlan) -> np.ndarray:
    """The stratum of every row (``analysis_plan.strata``: the columns a run's stratum is made of)."""
    cols = list(plan.strata)
    missing = [c for c in cols if c not in rows.columns]
    if missing:
        raise ValueError(f"analysis_plan.strata: the scores have no column {missing[0]!r}")
    if rows.empty:
        return np.zeros(0, dtype=np.int64)
    return rows.groupby(cols, sort=True, observed=True, dropna=False).ngroup().to_numpy().astype(np.int64)
