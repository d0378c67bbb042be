"""What a method config may name, without torch: samplers, certificate aggregations,
allocation policies, scorers and their options.

:class:`kvcert.generation.spec.GenerationSpec` validates a config against these names, so
that a spec is built — and Snakemake plans a run, and the scoring and claims steps read the
plan — without importing torch. The modules that implement the names take them from here
and check at import that they implement exactly these (:mod:`kvcert.method.design`,
:mod:`kvcert.method.certificate`, :mod:`kvcert.method.allocation`, :mod:`kvcert.method.scorers`): a name added
in one place and not the other fails on the first import, in one line.
"""

from __future__ import annotations

#: how the tail is drawn (kvcert.method.design): Poisson and priority sampling are randomized and certified
SAMPLERS = ("poisson", "priority", "topk")
#: how a step's per-layer certificates combine into one (kvcert.method.certificate)
AGGREGATIONS = ("max", "mean", "rms")
#: budget allocation policies over any scorer (kvcert.method.allocation)
ALLOCATIONS = ("uniform", "pyramid", "adakv")
#: importance scorers (kvcert.method.scorers) → the options a config may give each (its dataclass fields)
SCORER_OPTIONS: dict[str, frozenset[str]] = {
    "streaming_llm": frozenset(),
    "h2o": frozenset({"query_block"}),
    "snapkv": frozenset({"window", "kernel_size", "pooling"}),
    "tova": frozenset(),
    "knorm": frozenset({"eps"}),
    "value_aware": frozenset({"window"}),
}
#: ``kvpress:<ScorerPress class>``: a kvpress press as a scorer (kvcert.method.scorers.kvpress_scorer)
KVPRESS_PREFIX = "kvpress:"


def check_implemented(what: str, names, implemented) -> None:
    """Refuse, in one line, a registry whose implementations differ from its names here."""
    if set(names) != set(implemented):
        raise ImportError(f"{what}: kvcert.config.names lists {sorted(names)} but the implementations are "
                          f"{sorted(implemented)}; keep kvcert/config/names.py and the registry equal")
