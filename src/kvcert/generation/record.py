"""The generation record: one frozen type, defined once.

:class:`GenerationRecord` is what one generation leaves behind. The engine builds it
(:meth:`Engine.record <kvcert.generation.engine.Engine.record>`, for every run of the one
generation path), the shards serialise it (:meth:`GenerationRecord.to_dict`, one
JSON object per line), the analysis validates it (:meth:`GenerationRecord.from_dict`:
every field present, no unknown field) and the test fixtures construct it
(:mod:`kvcert.testing`). A new field goes here and nowhere else.

Fields, in groups:

* identity — the generation key (:class:`GenerationKey`: ``model, task, target_tokens,
  example_id, condition, method, budget, seed``) and the method's parts (scorer, sampler, allocation);
* output — the raw decoded answer, its greedy tokens and their log-probabilities, the
  task's reference answers and score;
* certificates — the paper's plug-in certificate and the robust one
  (:func:`certificate_field` is their layout), what the certificate field means
  (``certificate_status``), the kept fraction per layer;
* comparison signals (definitions in ``claims.yaml``'s
  ``analysis_plan.comparison_signals``) — per decode step the next-token distribution's
  entropy and top-2 margin, the attention entropy over the retained tokens, and the
  share of the scorer's importance mass that compression evicted;
* cost — prefill and decode seconds, decode steps, KV bytes (peak, final), sketch bytes;
* provenance — task metadata, UTC start, config hash, pre-registration hash, git commit,
  kvcert version, and the content digest of the model folder the record was made with
  (``model_digest``: :func:`kvcert.config.sources.content_digest`; None in records written before
  it was stamped, which the loader accepts as they are).

Torch-free: the analysis imports it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any, Mapping, NamedTuple


def _text(value: Any) -> str | None:
    return None if value is None else str(value)


class GenerationKey(NamedTuple):
    """What identifies one generation, the one type of it: the shard writer keys its records by it
    (:class:`~kvcert.generation.shards.ShardWriter`), the runner plans a shard's with it, a job's planned
    records (:meth:`kvcert.generation.jobs.Job.planned_records`) and the loader's key sets are keyed by it.
    Normalised: ``target_tokens`` and ``seed`` ints, ``budget`` a float (None where a record has none).
    A plain tuple of the same values equals it."""

    model: str | None
    task: str | None
    target_tokens: int | None
    example_id: str
    condition: str | None
    method: str | None
    budget: float | None
    seed: int | None

    @classmethod
    def of(cls, record: Mapping[str, Any]) -> "GenerationKey":
        """The key of a record (a shard line, :meth:`GenerationRecord.to_dict`)."""
        tokens, budget, seed = record.get("target_tokens"), record.get("budget"), record.get("seed")
        return cls(_text(record.get("model")), _text(record.get("task")), None if tokens is None else int(tokens),
                   str(record["example_id"]), _text(record.get("condition")), _text(record.get("method")),
                   None if budget is None else float(budget), None if seed is None else int(seed))

    @classmethod
    def planned(cls, spec: Any, example: Any) -> "GenerationKey":
        """The key of the record a :class:`~kvcert.generation.spec.GenerationSpec` writes for the task record
        ``example`` (what :meth:`Engine.record <kvcert.generation.engine.Engine.record>` stamps on it)."""
        tokens = example.metadata.get("target_tokens")
        return cls(spec.model.name, example.task, None if tokens is None else int(tokens), example.id,
                   spec.condition, spec.method.name, float(spec.budget), int(spec.seed))

    def __str__(self) -> str:
        """``model/task/length/example/condition/method/budget/seed`` (a native length: ``native``)."""
        return "/".join("native" if v is None else f"{v:g}" if isinstance(v, float) else str(v) for v in self)


def certificate_field(delta: float, steps: dict, anytime_steps: dict, relative_steps: dict,
                      variance_mean_steps: list, first_step_layers: dict | None) -> dict:
    """The layout of a record's ``certificate`` / ``certificate_robust`` field: per aggregation
    ("max", "mean", "rms") the radius of every decode step (``steps``), its anytime variant,
    its relative variant (ε / ‖ô‖), the mean V̂ per step, and the first certified step per layer."""
    return {
        "delta": delta,
        "steps": steps,
        "anytime_steps": anytime_steps,
        "relative_steps": relative_steps,
        "variance_mean_steps": variance_mean_steps,
        "first_step_layers": first_step_layers,
    }


def evicted_mass_field(realised: dict, expected: dict | None) -> dict:
    """The layout of a record's ``evicted_mass`` field: per aggregation over (layer, KV head),
    the realised share of the scorer's importance mass that compression removed, and (for the
    randomized samplers) its expectation Σ(1 − π)·s / Σ s."""
    return {"realised": realised, "expected": expected}


#: the provenance group (:func:`kvcert.provenance.provenance` stamps them; None where a caller gave none)
PROVENANCE_FIELDS = ("config_hash", "prereg_hash", "git_commit", "kvcert_version", "model_digest", "code_digest")
#: fields a record written by an earlier kvcert may lack ({field: the value it then has}); every other field is
#: required
OPTIONAL_FIELDS = {"model_digest": None, "code_digest": None}


@dataclass(frozen=True)
class GenerationRecord:
    """One generation (see the module docstring for the groups of fields)."""

    # identity
    example_id: str
    task: str
    target_tokens: int | None
    prompt_tokens: int
    question_tokens: int
    model: str
    condition: str
    method: str
    scorer: str | None
    sampler: str | None
    allocation: str | None
    budget: float
    seed: int
    # output
    answer: str
    tokens: list
    token_logprobs: list
    mean_logprob: float | None
    min_logprob: float | None
    answers: list
    score: float | None
    # certificates
    certificate: dict | None
    certificate_status: str | None
    certificate_robust: dict | None
    kept_fraction: list
    # comparison signals
    output_entropy_steps: list
    top2_margin_steps: list
    attention_entropy_steps: list | None
    evicted_mass: dict | None
    # cost
    prefill_seconds: float
    decode_seconds: float
    decode_steps: int
    kv_bytes_peak: int
    kv_bytes_final: int
    sketch_bytes: int
    # provenance
    metadata: dict
    started_utc: str
    config_hash: str | None
    prereg_hash: str | None
    git_commit: str | None
    kvcert_version: str | None
    model_digest: str | None = None
    code_digest: str | None = None  # the code that made it (:func:`kvcert.provenance.code_digest`)

    def to_dict(self) -> dict[str, Any]:
        """The JSON-ready record (what a shard line holds)."""
        return asdict(self)

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "GenerationRecord":
        """The record of a shard line; ValueError naming the first missing or unknown field (a field of
        :data:`OPTIONAL_FIELDS` may be missing: a record of an earlier kvcert, which takes its value there)."""
        names = cls.field_names()
        for name in names:
            if name not in data and name not in OPTIONAL_FIELDS:
                raise ValueError(f"generation record lacks the required field {name!r}")
        unknown = sorted(set(data) - set(names))
        if unknown:
            raise ValueError(f"generation record has unknown field(s) {', '.join(map(repr, unknown))}")
        return cls(**{name: data.get(name, OPTIONAL_FIELDS.get(name)) for name in names})
