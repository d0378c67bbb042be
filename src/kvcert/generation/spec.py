"""A generation job, validated before anything runs.

One job = one model × condition × method × budget × seed, applied to a list of task
records. Every mistake — an unknown key, an out-of-range budget, an unknown scorer —
raises a ``ValueError`` with one line naming the key and how to fix it.

The budget enters here: :func:`generation_budget` is its one conversion from kvpress's
``compression_ratio`` and its one range check, for the pipeline's specs
(:meth:`GenerationSpec.from_dict`, :meth:`GenerationSpec.__post_init__`), ``kvcert run``'s
``budget=`` / ``compression_ratio=`` and :func:`kvcert.generate_answer`; the engine hands the
spec's own budget to its press.

Nothing here imports torch: the names a config may use come from :mod:`kvcert.config.names`, so that
Snakemake plans a run and the scoring step reads the plan without loading it.
"""

from __future__ import annotations

import difflib
from dataclasses import asdict, dataclass, field
from numbers import Real
from typing import Any

from ..budget import ROUNDINGS, kept_budget
from ..config.design_params import RetentionDesign
from ..config.names import AGGREGATIONS, ALLOCATIONS, KVPRESS_PREFIX, SAMPLERS, SCORER_OPTIONS
from ..config.sources import ModelSpec, model_run_settings

CONDITIONS = ("full", "aware", "streaming")


def generation_budget(budget: Any = None, compression_ratio: Any = None, default: Any = None) -> float:
    """A generation's budget, the fraction of the cache kept, checked where it enters: ``budget`` (kvcert's
    convention) or ``compression_ratio`` (kvpress's: the fraction *removed*, ``budget = 1 − it``), at most one of
    the two (neither: ``default``); a fraction in (0, 1], else ``ValueError`` in one line. The value itself is
    returned as given (a ratio converted), so a spec's hash does not move."""
    value = kept_budget(budget, compression_ratio, default)
    if isinstance(value, bool) or not isinstance(value, Real) or not (0.0 < float(value) <= 1.0):
        raise ValueError(f"budget: must be a fraction in (0, 1], got {value!r}")
    return value


def _scorer_options(scorer: str) -> set[str]:
    """The options a scorer takes: from :data:`kvcert.config.names.SCORER_OPTIONS` (no torch); a ``kvpress:`` scorer's are
    its press's fields, read from kvpress (imported only for such a scorer)."""
    if scorer.startswith(KVPRESS_PREFIX):
        from ..method.scorers.kvpress_scorer import press_options

        return press_options(scorer)
    return set(SCORER_OPTIONS[scorer])


def _reject_unknown(section: str, given: dict, allowed: set[str]) -> None:
    for key in given:
        if key not in allowed:
            close = difflib.get_close_matches(key, sorted(allowed), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            where = f"{section}." if section else ""
            raise ValueError(f"config key {where}{key}: unknown{hint}; allowed keys: {', '.join(sorted(allowed))}")


@dataclass(frozen=True)
class MethodSpec:
    """Eviction method: scorer × sampler × allocation (ignored for the full cache).

    ``scorer_options`` are keyword arguments of the scorer (e.g. SnapKV's observation
    ``window``); ``rounding`` turns a fractional budget into tokens: ``round`` (kvcert's
    default) or ``floor`` (kvpress's ``int(N · (1 − compression_ratio))``). Both exist for
    the kvpress-matched method configs (``configs/method/*-kvpress.yaml``).
    """

    name: str = "full"
    scorer: str | None = None
    sampler: str | None = None
    allocation: str = "uniform"
    design: RetentionDesign = field(default_factory=RetentionDesign)
    scorer_options: dict = field(default_factory=dict, hash=False)
    rounding: str = "round"

    def __post_init__(self) -> None:
        if self.name == "full":
            return
        if not isinstance(self.scorer, str) or not (self.scorer in SCORER_OPTIONS or self.scorer.startswith(KVPRESS_PREFIX)):
            raise ValueError(f"method.scorer: {self.scorer!r} is not one of {sorted(SCORER_OPTIONS)} "
                             f"nor {KVPRESS_PREFIX}<a kvpress ScorerPress>")
        if self.sampler not in SAMPLERS:
            raise ValueError(f"method.sampler: {self.sampler!r} is not one of {SAMPLERS}")
        if self.allocation not in ALLOCATIONS:
            raise ValueError(f"method.allocation: {self.allocation!r} is not one of {sorted(ALLOCATIONS)}")
        if self.rounding not in ROUNDINGS:
            raise ValueError(f"method.rounding: {self.rounding!r} is not one of {ROUNDINGS}")
        if self.scorer_options:
            _reject_unknown("method.scorer_options", self.scorer_options, _scorer_options(self.scorer))

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "MethodSpec":
        """Build from a method config (``configs/method/<name>.yaml``, :func:`kvcert.config.methods.method_config`),
        rejecting unknown keys."""
        method = dict(data or {})
        _reject_unknown("method", method, set(cls.__dataclass_fields__))
        design = dict(method.pop("design", {}) or {})
        _reject_unknown("method.design", design, set(RetentionDesign.__dataclass_fields__))
        return cls(**method, design=RetentionDesign(**design))

    @property
    def is_full(self) -> bool:
        return self.name == "full"

    @property
    def randomized(self) -> bool:
        return not self.is_full and self.sampler != "topk"


@dataclass(frozen=True)
class CertificateSpec:
    delta: float = 0.1
    aggregations: tuple[str, ...] = ("max", "mean", "rms")

    def __post_init__(self) -> None:
        if not (0.0 < self.delta < 1.0):
            raise ValueError(f"certificate.delta: must lie in (0, 1), got {self.delta}")
        for agg in self.aggregations:
            if agg not in AGGREGATIONS:
                raise ValueError(f"certificate.aggregations: {agg!r} is not one of {AGGREGATIONS}")


@dataclass(frozen=True)
class GenerationSpec:
    """Everything that determines the records of one job (its hash is the config hash)."""

    model: ModelSpec
    method: MethodSpec
    condition: str = "aware"
    budget: float = 1.0
    seed: int = 0
    max_new_tokens: int = 32
    chunk_tokens: int | None = None
    certificate: CertificateSpec = field(default_factory=CertificateSpec)

    def __post_init__(self) -> None:
        if self.condition not in CONDITIONS:
            raise ValueError(f"condition: {self.condition!r} is not one of {CONDITIONS}")
        generation_budget(self.budget)
        if self.method.is_full != (self.condition == "full"):
            raise ValueError("condition: 'full' goes with method 'full' (and only with it)")
        if self.condition == "full" and float(self.budget) != 1.0:
            raise ValueError("budget: the full cache has budget 1.0")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens: must be >= 1, got {self.max_new_tokens}")
        if self.chunk_tokens is not None and (self.condition != "streaming" or self.chunk_tokens < 1):
            raise ValueError("chunk_tokens: only for the streaming condition, and >= 1")

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["certificate"]["aggregations"] = list(self.certificate.aggregations)
        return d

    def hashed_dict(self) -> dict[str, Any]:
        """What a record's ``config_hash`` covers: :meth:`to_dict` with the model's local path reduced
        to what identifies it (:func:`kvcert.config.sources.path_identity`), not where it lives."""
        from ..config.sources import path_identity

        d = self.to_dict()
        d["model"]["path"] = path_identity(d["model"]["path"])
        return d

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "GenerationSpec":
        """Build from a plain mapping (e.g. a composed hydra config), rejecting unknown keys."""
        data = dict(data)
        if "compression_ratio" in data:  # kvpress's convention: the fraction removed
            data["budget"] = generation_budget(data.get("budget"), data.pop("compression_ratio"))
        _reject_unknown("", data, {f for f in cls.__dataclass_fields__} | {"compression_ratio"})
        model = model_run_settings(data.pop("model", {}) or {})  # a fetched model's pins are its content's
        _reject_unknown("model", model, set(ModelSpec.__dataclass_fields__))
        method = MethodSpec.from_dict(data.pop("method", {}))
        cert = dict(data.pop("certificate", {}) or {})
        _reject_unknown("certificate", cert, set(CertificateSpec.__dataclass_fields__))
        if "aggregations" in cert:
            cert["aggregations"] = tuple(cert["aggregations"])
        return cls(
            model=ModelSpec(**model),
            method=method,
            certificate=CertificateSpec(**cert),
            **data,
        )
