"""Method names: one grammar for the pipeline's configs, ``kvcert run`` and :func:`kvcert.generate_answer`.

A method is a scorer × a sampler × an allocation policy, named ``<policy>-<sampler>``:

* ``<policy>`` — a scorer (``snapkv``, ``h2o``, ``tova``, ``knorm``, ``value_aware``,
  ``streaming_llm``; ``kvpress:<ScorerPress>`` for a kvpress press), with the uniform
  allocation; or an allocation family over SnapKV's scores: ``adakv`` (per head, Ada-KV),
  ``pyramidkv`` (per layer, PyramidKV);
* ``<sampler>`` — ``topk`` (the deterministic baseline), ``poisson`` or ``priority`` (randomized,
  certified); or ``kvpress``: top-k with kvpress's own protected tokens and rounding, which
  differ per press, so only the shipped ``configs/method/<policy>-kvpress.yaml`` define it;
* ``full`` — no eviction.

:func:`method_config` gives a name's method config (the mapping of ``configs/method/<name>.yaml``):
the shipped file where there is one — every shipped file follows the grammar (a test checks
it) — else the grammar's reading of the name, so ``kvcert run method=adakv-priority`` and
``generate_answer(method="kvpress:SnapKVPress-poisson")`` work without a file. The scorer,
sampler and allocation names are validated where the method is built
(:class:`kvcert.generation.spec.MethodSpec`), with the known names in the message.
"""

from __future__ import annotations

from pathlib import Path
from typing import Mapping

#: policy → (scorer, allocation) for the allocation families; any other policy is a scorer name
ALLOCATION_FAMILIES: dict[str, tuple[str, str]] = {"adakv": ("snapkv", "adakv"), "pyramidkv": ("snapkv", "pyramid")}
#: the samplers a name may end with (``kvpress``: the shipped kvpress-matched configs only)
NAME_SAMPLERS = ("topk", "poisson", "priority")
KVPRESS_VARIANT = "kvpress"
GRAMMAR = ("<policy>-<sampler>: policy a scorer (snapkv, h2o, tova, knorm, value_aware, streaming_llm, "
           "kvpress:<ScorerPress>) or adakv / pyramidkv; sampler topk, poisson or priority; or full")


def parse_method_name(name: str) -> dict:
    """The method config that ``name`` says (``name``, ``scorer``, ``sampler``, ``allocation``); a name
    outside the grammar raises a one-line ``ValueError`` that states it."""
    if name == "full":
        return {"name": "full"}
    policy, sep, sampler = str(name).rpartition("-")
    if not sep or not policy:
        raise ValueError(f"method {name!r}: not a method name ({GRAMMAR})")
    if sampler == KVPRESS_VARIANT:
        raise ValueError(f"method {name!r}: the kvpress-matched variants are the shipped "
                         f"configs/method/*-{KVPRESS_VARIANT}.yaml (kvpress protects different tokens per press)")
    if sampler not in NAME_SAMPLERS:
        raise ValueError(f"method {name!r}: sampler {sampler!r} is not one of {', '.join(NAME_SAMPLERS)} ({GRAMMAR})")
    scorer, allocation = ALLOCATION_FAMILIES.get(policy, (policy, "uniform"))
    return {"name": name, "scorer": scorer, "sampler": sampler, "allocation": allocation}


def method_name(scorer: str, sampler: str, allocation: str = "uniform") -> str:
    """The grammar's name of a scorer × sampler × allocation (the inverse of :func:`parse_method_name`; an
    allocation without a family name of its own over this scorer is named after the scorer alone)."""
    family = next((p for p, (s, a) in ALLOCATION_FAMILIES.items() if (s, a) == (scorer, allocation)), None)
    return f"{family or scorer}-{sampler}"


def shipped_methods(configs: str | Path) -> list[str]:
    """The method configs shipped in ``configs/method/``."""
    return sorted(p.stem for p in (Path(configs) / "method").glob("*.yaml"))


def method_config(name: str, configs: str | Path | None = None) -> dict:
    """The method config of ``name``: ``configs/method/<name>.yaml`` where it exists (``configs``: the
    configs folder, default :func:`kvcert.config.paths.configs_dir`), else :func:`parse_method_name`."""
    import yaml

    if configs is None:
        from .paths import configs_dir

        try:
            configs = configs_dir()
        except FileNotFoundError:
            return parse_method_name(name)
    path = Path(configs) / "method" / f"{name}.yaml"
    if path.is_file():
        return dict(yaml.safe_load(path.read_text()) or {})
    return parse_method_name(name)


def follows_grammar(config: Mapping) -> bool:
    """Whether a method config's name says what it holds (the test of every shipped config)."""
    name = str(config.get("name"))
    if name == "full":
        return set(config) == {"name"}
    policy, _, sampler = name.rpartition("-")
    if sampler == KVPRESS_VARIANT:
        scorer, allocation = ALLOCATION_FAMILIES.get(policy, (policy, "uniform"))
        return (config.get("scorer"), config.get("sampler"), config.get("allocation", "uniform"),
                config.get("rounding")) == (scorer, "topk", allocation, "floor")
    try:
        said = parse_method_name(name)
    except ValueError:
        return False
    return all(config.get(k, "uniform" if k == "allocation" else None) == v for k, v in said.items())
