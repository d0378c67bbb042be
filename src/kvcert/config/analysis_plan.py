"""The pre-registered analysis plan, typed: ``analysis_plan`` of ``preregistration/claims.yaml``.

The twin of :class:`kvcert.generation.spec.GenerationSpec` on the analysis side: the one
reader of the frozen plan (:func:`kvcert.config.prereg.load_claims` builds it), validated once
(:meth:`AnalysisPlan.from_dict`: an unknown key is refused in one line naming it, a value out
of range too), handed to every stage that reads the plan — generation (the design, δ, the
replay) and the analysis (scoring, claims, signals, report) — instead of the dict. Torch-free,
at the configuration stage. ``kvcert prereg freeze`` also checks the block against
``analysis_plan.schema.yaml`` beside this module (:func:`check_schema`).

Its parts, each a frozen dataclass (defaults: the value the code used when a freeze lacks the
key, so every committed freeze loads as it was analysed):

* ``design`` — the retention design (sinks, window, top_fraction, floor, temper, dense_layers;
  :class:`kvcert.method.design.RetentionDesign` builds it at the model stage);
* ``delta`` — the certificate's level δ ∈ (0, 1): P(‖ô − o‖ > ε_δ) ≤ δ;
* ``bootstrap`` — the unit bootstrap (resamples, seed, interval level, unit) and its
  ``stability_seeds``: the verdict redone under seeds ``seed + 1, …, seed + stability_seeds``;
* ``placebos`` — the placebos of each data set and their seed;
* ``replay`` — the replay cell (budgets, draws, later queries, query kinds, the minimum of
  diverged decodes, the sampling ``seed``);
* ``robust_certificate`` — the robust certificate's registered parameters (checked against
  :data:`kvcert.method.sketch.PLAN` where it is computed);
* signals — ``certificate_signal``, ``multiturn_gate``, ``confidence_signal``,
  ``correctness`` (pass marks), ``comparison_signals``;
* ``strata``, ``minimum_cell``, ``recompute``, ``escalation`` — what the claims' statistics read;
* ``secondary`` — the analyses reported beside replay claims' tests (each certificate against its step cell's
  constant; a certificate's worst later-query cell), deciding nothing.

:meth:`AnalysisPlan.to_dict` is the registered mapping itself (what ``claims.json`` records).
"""

from __future__ import annotations

import copy
import difflib
from dataclasses import InitVar, dataclass, field, fields
from pathlib import Path
from typing import Any, Mapping

from .design_params import RetentionDesign
from .names import AGGREGATIONS

#: the JSON schema of ``analysis_plan`` (checked at ``kvcert prereg freeze``)
SCHEMA = Path(__file__).with_name("analysis_plan.schema.yaml")
#: the strata of the stratified statistics when ``strata`` names none
DEFAULT_STRATA = ("model", "task", "condition", "budget", "target_tokens", "method")
#: the keys of ``design`` (the fields of :class:`kvcert.method.design.RetentionDesign`, built at the model stage)
DESIGN_KEYS = ("sinks", "window", "top_fraction", "floor", "temper", "dense_layers")
#: the keys of ``robust_certificate`` (those of :data:`kvcert.method.sketch.PLAN`, which checks a freeze's values
#: against what it computes where the certificate is computed: earlier freezes registered other values) and the
#: least each number may be (None: any number; ``str``: a name)
ROBUST_CERTIFICATE = {"sketch_fraction": 0, "key_bits": 1, "drift": None, "window": 1, "score": str,
                      "successor_horizon": 0, "successor_penalty": None, "combination": str, "floor": str}
ROBUST_KEYS = tuple(ROBUST_CERTIFICATE)
#: the certificate fields a signal can read (``certificate.<field>.<aggregation>`` of a record)
CERT_FIELDS = ("steps", "anytime_steps", "relative_steps")
#: the reductions of a per-step series to one number (``over_steps``)
OVER_STEPS = ("mean", "max", "min", "last", "first")
#: the query kinds a replay can draw, in order (the replay table's, :mod:`kvcert.generation.replay_table`)
QUERY_KINDS = ("setting", "later", "sample_dependent")
#: the units the generation claims' bootstrap can resample (``bootstrap.unit``)
BOOTSTRAP_UNITS = ("example",)
#: the placebos of each data set when ``placebos`` names none
DEFAULT_PLACEBOS = {"generations": ("stratum_base_rate", "random_score"),
                    "replay": ("step_cell_median_radius", "step_cell_permuted_radius")}


class AnalysisPlanError(ValueError):
    """The pre-registered ``analysis_plan`` is malformed (one line naming the key)."""


def _reject_unknown(section: str, given: Mapping, cls) -> None:
    """Refuse a key of ``given`` that is not a field of ``cls`` (or not in ``cls``, a tuple of key names)."""
    names = cls if isinstance(cls, tuple) else [f.name for f in fields(cls)]
    allowed = sorted(n for n in names if not n.startswith("_"))
    for key in given:
        if key not in allowed:
            close = difflib.get_close_matches(str(key), allowed, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            where = f"analysis_plan.{section}." if section else "analysis_plan."
            raise AnalysisPlanError(f"{where}{key}: unknown{hint}; allowed keys: {', '.join(allowed)}")


def _mapping(section: str, value: Any) -> dict:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise AnalysisPlanError(f"analysis_plan.{section}: must be a mapping, got {value!r}")
    return dict(value)


def _fraction(section: str, value: Any, high_open: bool = True) -> float:
    v = float(value)
    if not (0.0 < v < 1.0 if high_open else 0.0 < v <= 1.0):
        raise AnalysisPlanError(f"analysis_plan.{section}: must lie in (0, 1{')' if high_open else ']'}, got {value!r}")
    return v


def _one_of(section: str, value: Any, allowed: tuple) -> str:
    """``value`` if it is one of ``allowed``, else refused in one line naming ``section``."""
    if value not in allowed:
        raise AnalysisPlanError(f"analysis_plan.{section}: {value!r} is not one of {', '.join(map(str, allowed))}")
    return str(value)


def _count(section: str, value: Any) -> int:
    """``value`` as an integer >= 0, else refused in one line naming ``section``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or int(value) != value or value < 0:
        raise AnalysisPlanError(f"analysis_plan.{section}: must be an integer >= 0, got {value!r}")
    return int(value)


def _design(data: Any) -> dict:
    """``design``: its keys those of :class:`~kvcert.config.design_params.RetentionDesign`, its values in range."""
    design = _mapping("design", data)
    _reject_unknown("design", design, DESIGN_KEYS)
    try:
        RetentionDesign(**design)
    except ValueError as exc:  # its message starts with the field
        raise AnalysisPlanError(f"analysis_plan.design.{exc}") from None
    except TypeError as exc:
        raise AnalysisPlanError(f"analysis_plan.design: {exc}") from None
    return design


def _robust_certificate(data: Any) -> dict:
    """``robust_certificate``: its keys, each a name or a number in range (:data:`ROBUST_CERTIFICATE`)."""
    robust = _mapping("robust_certificate", data)
    _reject_unknown("robust_certificate", robust, ROBUST_KEYS)
    for key, value in robust.items():
        kind = ROBUST_CERTIFICATE[key]
        where = f"analysis_plan.robust_certificate.{key}"
        if kind is str:
            if not isinstance(value, str):
                raise AnalysisPlanError(f"{where}: must be a name, got {value!r}")
        elif isinstance(value, bool) or not isinstance(value, (int, float)):
            raise AnalysisPlanError(f"{where}: must be a number, got {value!r}")
        elif kind is not None and value < kind:
            raise AnalysisPlanError(f"{where}: must be >= {kind}, got {value!r}")
    return robust


def _part(cls, key: str, data: Any, **extra):
    """``cls`` built from the mapping ``data`` (its fields by name, and ``extra``), unknown keys refused."""
    data = _mapping(key, data)
    _reject_unknown(key, data, cls)
    return cls(**data, **extra)


#: the units the replay claims' bootstrap can resample (``bootstrap.replay_unit`` / ``replay_beside``): a replay
#: cell (model × example × layer × query head × budget × query kind), an example × layer, an example (a prompt)
REPLAY_UNITS = ("cell", "example_layer", "example")


@dataclass(frozen=True)
class BootstrapPart:
    """``bootstrap``: the unit bootstrap of every interval (resamples, seed, level, unit = example) and the
    Monte-Carlo stability check: the verdict redone under ``stability_seeds`` other seeds. The replay claims
    resample ``replay_unit`` (default ``cell``, what every freeze before the eighth amendment did: the cells of
    one prompt are not independent; ``example`` resamples the prompts, the cluster bootstrap), and report the
    intervals over ``replay_beside``'s units beside their tests (not deciding)."""

    resamples: int = 1000
    seed: int = 0
    level: float = 0.9
    unit: str = "example"
    stability_seeds: int = 0
    replay_unit: str = "cell"
    replay_beside: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "resamples", int(self.resamples))
        object.__setattr__(self, "seed", int(self.seed))
        object.__setattr__(self, "level", _fraction("bootstrap.level", self.level))
        object.__setattr__(self, "stability_seeds", int(self.stability_seeds))
        object.__setattr__(self, "unit", _one_of("bootstrap.unit", self.unit, BOOTSTRAP_UNITS))
        object.__setattr__(self, "replay_unit", str(self.replay_unit))
        object.__setattr__(self, "replay_beside", tuple(str(u) for u in self.replay_beside))
        for name, value in (("replay_unit", self.replay_unit), *(("replay_beside", u) for u in self.replay_beside)):
            if value not in REPLAY_UNITS:
                raise AnalysisPlanError(f"analysis_plan.bootstrap.{name}: {value!r} is not a replay unit; one of "
                                        f"{', '.join(REPLAY_UNITS)}")
        if self.replay_unit in self.replay_beside:
            raise AnalysisPlanError(f"analysis_plan.bootstrap.replay_beside: {self.replay_unit!r} is the replay unit "
                                    "itself; name the others")
        if self.resamples < 1:
            raise AnalysisPlanError(f"analysis_plan.bootstrap.resamples: must be >= 1, got {self.resamples}")
        if self.stability_seeds < 0:
            raise AnalysisPlanError(f"analysis_plan.bootstrap.stability_seeds: must be >= 0, got {self.stability_seeds}")

    @property
    def other_seeds(self) -> list[int]:
        """The stability check's seeds: ``seed + 1, …, seed + stability_seeds``."""
        return [self.seed + k for k in range(1, self.stability_seeds + 1)]

    def to_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass(frozen=True)
class PlacebosPart:
    """``placebos``: the placebos each data set's claims are scored with (None: :data:`DEFAULT_PLACEBOS`) and the
    seed of their random draws."""

    generations: tuple[str, ...] | None = None
    replay: tuple[str, ...] | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        for source in ("generations", "replay"):
            value = getattr(self, source)
            if value is not None:
                object.__setattr__(self, source, tuple(_one_of(f"placebos.{source}", v, DEFAULT_PLACEBOS[source])
                                                       for v in value))
        object.__setattr__(self, "seed", int(self.seed))

    def names(self, source: str) -> list[str]:
        """The placebos registered for ``source`` ("generations" or "replay")."""
        registered = getattr(self, source)
        return list(DEFAULT_PLACEBOS[source] if registered is None else registered)


@dataclass(frozen=True)
class ReplayPart:
    """``replay``: the replay cell's budgets, draws per budget, later queries, query kinds, the minimum number of
    diverged decodes C8's diverged coverage needs, and the sampling seed of the draws.

    ``seed``: **the schema default, not a registered value**: no freeze so far registers it, and 0 is the seed
    every replay so far was drawn with (``kvcert replay``'s former ``--seed`` default); the next amendment
    registers it (``replay.seed`` in ``claims.yaml``)."""

    budgets: tuple[float, ...] = ()
    draws: int = 0
    later_queries: int = 0
    query_kinds: tuple[str, ...] = ("setting", "later")
    minimum_diverged_decodes: int = 0
    seed: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "budgets", tuple(_fraction("replay.budgets", b, False) for b in self.budgets))
        object.__setattr__(self, "query_kinds", tuple(_one_of("replay.query_kinds", k, QUERY_KINDS)
                                                      for k in self.query_kinds))
        for name in ("draws", "later_queries", "minimum_diverged_decodes"):
            object.__setattr__(self, name, _count(f"replay.{name}", getattr(self, name)))
        object.__setattr__(self, "seed", int(self.seed))


#: the certificates a secondary analysis can compare with their step cell's constant
SECONDARY_CERTIFICATES = ("plugin", "robust")


@dataclass(frozen=True)
class SecondaryPart:
    """``secondary``: analyses reported beside replay claims' tests, never deciding a verdict — each claim's
    certificate against its step cell's constant (every radius replaced by its step cell's median: the
    ``step_cell_median_radius`` placebo), paired on the same draws (:mod:`kvcert.analysis.claims_stats.secondary`).
    ``claims``: replay claim → the certificate it compares (``plugin`` or ``robust``); none (the default, what
    every freeze before the eighth amendment had): no secondary analysis. ``top_error``: the share of a step cell's
    draws of largest error (0.1: the top decile); ``bottom_radius``: the share of smallest radius (0.25: the bottom
    quartile). The matched coverage of the tightness comparison is the nominal 1 − δ. ``worst_later_cell``: replay
    claim → the certificate whose worst later-query budget × layer cell is reported beside its tests (its lowest
    coverage, the cell, its interval; :func:`kvcert.analysis.claims_stats.secondary.prepare_worst_later`); none (the
    default, every freeze before the ninth amendment): not reported."""

    claims: tuple[tuple[str, str], ...] = ()
    top_error: float = 0.1
    bottom_radius: float = 0.25
    worst_later_cell: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        for name in ("claims", "worst_later_cell"):
            given = getattr(self, name)
            pairs = tuple(given.items()) if isinstance(given, Mapping) else tuple(tuple(p) for p in given)
            for claim, cert in pairs:
                if cert not in SECONDARY_CERTIFICATES:
                    raise AnalysisPlanError(f"analysis_plan.secondary.{name}.{claim}: {cert!r} is not a certificate; "
                                            f"one of {', '.join(SECONDARY_CERTIFICATES)}")
            object.__setattr__(self, name, tuple((str(c), str(v)) for c, v in pairs))
        object.__setattr__(self, "top_error", _fraction("secondary.top_error", self.top_error))
        object.__setattr__(self, "bottom_radius", _fraction("secondary.bottom_radius", self.bottom_radius))

    def certificate(self, claim: str) -> str | None:
        """The certificate claim ``claim``'s secondary analyses compare (None: it has none)."""
        return dict(self.claims).get(str(claim))

    def worst_later(self, claim: str) -> str | None:
        """The certificate whose worst later-query cell claim ``claim`` reports (None: none)."""
        return dict(self.worst_later_cell).get(str(claim))


@dataclass(frozen=True)
class SignalPart:
    """``certificate_signal`` / ``multiturn_gate``: which number of a record's certificate is its signal (the field,
    its aggregation over heads and layers, its reduction over decode steps); the gate's ``threshold``."""

    field: str = "relative_steps"
    aggregation: str = "mean"
    over_steps: str = "mean"
    threshold: float | None = None
    section: InitVar[str] = "certificate_signal"  # the plan's key it is read from, which its messages name

    def __post_init__(self, section: str) -> None:
        object.__setattr__(self, "field", _one_of(f"{section}.field", self.field, CERT_FIELDS))
        object.__setattr__(self, "aggregation", _one_of(f"{section}.aggregation", self.aggregation, AGGREGATIONS))
        object.__setattr__(self, "over_steps", _one_of(f"{section}.over_steps", self.over_steps, OVER_STEPS))
        if self.threshold is not None:
            object.__setattr__(self, "threshold", float(self.threshold))


@dataclass(frozen=True)
class ConfidencePart:
    """``confidence_signal``: the primary and the secondary confidence signal (a record's field names)."""

    primary: str = "mean_logprob"
    secondary: str = "min_logprob"


@dataclass(frozen=True)
class CorrectnessPart:
    """``correctness``: a run is correct when its score ≥ the pass mark of its task (the longest matching prefix of
    ``by_task_prefix``, else ``default``)."""

    default: float = 1.0
    by_task_prefix: dict = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "default", float(self.default))
        object.__setattr__(self, "by_task_prefix", {str(k): float(v) for k, v in (self.by_task_prefix or {}).items()})


@dataclass(frozen=True)
class MinimumCell:
    """``minimum_cell``: the least generations (replay: replay cells), positives and negatives a claim's cell needs."""

    generations: int = 0
    positives: int = 0
    negatives: int = 0

    def __post_init__(self) -> None:
        for name in ("generations", "positives", "negatives"):
            object.__setattr__(self, name, _count(f"minimum_cell.{name}", getattr(self, name)))

    def count(self, key: str) -> int:
        return int(getattr(self, key))

    def to_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass(frozen=True)
class RecomputePart:
    """``recompute``: C7's recompute rates (the curve) and the rate its verdict is taken at."""

    gate_rates: tuple[float, ...] = ()
    verdict_rate: float = 0.2

    def __post_init__(self) -> None:
        object.__setattr__(self, "gate_rates", tuple(_fraction("recompute.gate_rates", r, False) for r in self.gate_rates))
        object.__setattr__(self, "verdict_rate", _fraction("recompute.verdict_rate", self.verdict_rate, False))

    @property
    def rates(self) -> list[float]:
        """Every rate computed: the curve's and the verdict's, ascending."""
        return sorted(set(self.gate_rates) | {self.verdict_rate})


@dataclass(frozen=True)
class EscalationPart:
    """``escalation``: C5's budget ladder and the certificate quantile that escalates a run."""

    budgets: tuple[float, ...] = ()
    threshold_quantile: float = 0.5

    def __post_init__(self) -> None:
        object.__setattr__(self, "budgets", tuple(sorted(_fraction("escalation.budgets", b, False)
                                                         for b in self.budgets)))
        object.__setattr__(self, "threshold_quantile", _fraction("escalation.threshold_quantile", self.threshold_quantile))


@dataclass(frozen=True)
class ComparisonSignal:
    """One comparison signal: its source (a record field), the direction that means failure, its methods."""

    source: str
    failure: str
    methods: tuple[str, ...]

    def __post_init__(self) -> None:
        if self.failure not in ("higher", "lower"):
            raise AnalysisPlanError(f"analysis_plan.comparison_signals: failure must be 'higher' or 'lower', "
                                    f"got {self.failure!r}")
        object.__setattr__(self, "methods", tuple(str(m) for m in self.methods))

    def to_dict(self) -> dict:
        return {"source": self.source, "failure": self.failure, "methods": list(self.methods)}


@dataclass(frozen=True)
class TurnDistance:
    """``comparison_signals.turn_distance``: the signals and the inclusive buckets [lo, hi] of the multi-turn AUC."""

    signals: tuple[str, ...] = ()
    buckets: tuple[tuple[int, int], ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "signals", tuple(str(s) for s in self.signals))
        object.__setattr__(self, "buckets", tuple((int(lo), int(hi)) for lo, hi in self.buckets))


@dataclass(frozen=True)
class ComparisonPart:
    """``comparison_signals``: the secondary analyses' signals, the claims whose cells they use (``prediction``,
    ``attribution``), the breakdown keys ``by``, the turn-distance buckets; ``over_steps`` and ``aggregation``
    turn a record's per-step series into one number."""

    over_steps: str = "mean"
    aggregation: str = "mean"
    signals: dict = field(default_factory=dict, hash=False)  # name → ComparisonSignal, in the plan's order
    prediction: dict = field(default_factory=dict, hash=False)
    attribution: dict = field(default_factory=dict, hash=False)
    by: tuple[str, ...] = ("method", "condition", "target_tokens")
    turn_distance: TurnDistance | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "over_steps", _one_of("comparison_signals.over_steps", self.over_steps, OVER_STEPS))
        object.__setattr__(self, "aggregation", _one_of("comparison_signals.aggregation", self.aggregation,
                                                        AGGREGATIONS))
        for name in self.turn_distance.signals if self.turn_distance else ():
            if name not in self.signals:
                raise AnalysisPlanError(f"analysis_plan.comparison_signals.turn_distance.signals: {name!r} is not a "
                                        f"signal of comparison_signals.signals ({', '.join(self.signals)})")

    @classmethod
    def from_dict(cls, data: Mapping) -> "ComparisonPart":
        data = _mapping("comparison_signals", data)
        _reject_unknown("comparison_signals", data, cls)
        signals = {}
        for name, spec in _mapping("comparison_signals.signals", data.pop("signals", None)).items():
            signals[str(name)] = _part(ComparisonSignal, f"comparison_signals.signals.{name}", spec)
        for task in ("prediction", "attribution"):
            part = _mapping(f"comparison_signals.{task}", data.get(task))
            unknown = [k for k in part if k != "cells"]
            if unknown:
                raise AnalysisPlanError(f"analysis_plan.comparison_signals.{task}.{unknown[0]}: unknown; allowed keys: cells")
            data[task] = part
        td = data.pop("turn_distance", None)
        if "by" in data:
            data["by"] = tuple(str(k) for k in data["by"])
        return cls(**data, signals=signals, turn_distance=_part(TurnDistance, "comparison_signals.turn_distance", td)
                   if td else None)

    def cells(self, task: str) -> str:
        """The claim whose cells ``task`` ("prediction" or "attribution") is computed on."""
        return str(getattr(self, task)["cells"])


@dataclass(frozen=True)
class AnalysisPlan:
    """The frozen pre-registration's ``analysis_plan`` (module docstring), validated once."""

    delta: float
    design: dict = field(default_factory=dict, hash=False)
    bootstrap: BootstrapPart = BootstrapPart()
    placebos: PlacebosPart = PlacebosPart()
    replay: ReplayPart = ReplayPart()
    robust_certificate: dict | None = field(default=None, hash=False)
    certificate_signal: SignalPart = SignalPart()
    multiturn_gate: SignalPart = SignalPart()
    confidence_signal: ConfidencePart = ConfidencePart()
    correctness: CorrectnessPart = CorrectnessPart()
    comparison_signals: ComparisonPart | None = None
    strata: tuple[str, ...] = DEFAULT_STRATA
    minimum_cell: MinimumCell = MinimumCell()
    recompute: RecomputePart = RecomputePart()
    escalation: EscalationPart = EscalationPart()
    secondary: SecondaryPart = SecondaryPart()
    _registered: dict = field(default_factory=dict, hash=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "delta", _fraction("delta", self.delta))

    #: the parts built from a mapping of their own fields
    PARTS = {"bootstrap": BootstrapPart, "placebos": PlacebosPart, "replay": ReplayPart,
             "certificate_signal": SignalPart, "multiturn_gate": SignalPart, "confidence_signal": ConfidencePart,
             "correctness": CorrectnessPart, "minimum_cell": MinimumCell, "recompute": RecomputePart,
             "escalation": EscalationPart, "secondary": SecondaryPart}

    @classmethod
    def from_dict(cls, data: Mapping) -> "AnalysisPlan":
        """Build from the ``analysis_plan`` mapping of a ``claims.yaml``, refusing an unknown key (one line naming
        it) and a value out of range."""
        registered = _mapping("", data)
        given = copy.deepcopy(registered)
        _reject_unknown("", given, cls)
        if "delta" not in given:
            raise AnalysisPlanError("analysis_plan.delta: missing (the certificate's level δ)")
        kwargs: dict[str, Any] = {}
        for name, part in cls.PARTS.items():
            if name in given:
                kwargs[name] = _part(part, name, given.pop(name), **({"section": name} if part is SignalPart else {}))
        if "comparison_signals" in given:
            kwargs["comparison_signals"] = ComparisonPart.from_dict(given.pop("comparison_signals"))
        kwargs["design"] = _design(given.pop("design", None))
        robust = given.pop("robust_certificate", None)
        if robust is not None:
            kwargs["robust_certificate"] = _robust_certificate(robust)
        strata = given.pop("strata", None)
        if strata:  # none named: DEFAULT_STRATA
            kwargs["strata"] = tuple(str(s) for s in strata)
        return cls(**given, **kwargs, _registered=registered)

    @classmethod
    def of_document(cls, doc: Mapping) -> "AnalysisPlan":
        """The plan of a claims document: a ``claims.yaml`` loaded by :func:`kvcert.config.prereg.load_claims` (typed
        already) or a ``claims.json`` (the registered mapping it records); a document without one is refused."""
        plan = doc.get("analysis_plan")
        if plan is None:
            raise AnalysisPlanError("analysis_plan: the claims document has none")
        return plan if isinstance(plan, AnalysisPlan) else cls.from_dict(plan)

    def to_dict(self) -> dict:
        """The registered mapping, as frozen (what ``claims.json`` records; empty for a plan built from defaults
        rather than from a mapping)."""
        return copy.deepcopy(self._registered)


def check_schema(data: Any, where: str = "analysis_plan") -> None:
    """Refuse, in one line naming the key, an ``analysis_plan`` that does not satisfy :data:`SCHEMA` (then build
    it: the typed checks too)."""
    import jsonschema
    import yaml

    schema = yaml.safe_load(SCHEMA.read_text())
    try:
        jsonschema.validate(data, schema)
    except jsonschema.ValidationError as exc:
        path = ".".join(str(p) for p in exc.absolute_path)
        raise AnalysisPlanError(f"{where}{'.' + path if path else ''}: {exc.message}") from None
    AnalysisPlan.from_dict(data)
