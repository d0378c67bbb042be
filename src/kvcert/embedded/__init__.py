"""The embedded model: a small Llama the project trains itself and ships as package data.

``kvcert/embedded/model/`` holds it in Hugging Face format (``model.safetensors``,
``config.json``, ``generation_config.json``, the word-level tokenizer with its chat
template) together with ``provenance.json`` (command, seed, training-data SHA-256,
wall time, measured accuracies) and ``loss_curve.png``. It was made by
``kvcert train-model --install``; ``AutoModelForCausalLM`` and ``AutoTokenizer`` load
it from :func:`embedded_model_path`.
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import Any

MODEL_SUBDIR = "model"


def embedded_model_path() -> Path:
    """Directory of the shipped model (inside the installed package)."""
    return Path(str(resources.files("kvcert.embedded").joinpath(MODEL_SUBDIR)))


def embedded_provenance() -> dict[str, Any]:
    """The shipped model's ``provenance.json``."""
    return json.loads((embedded_model_path() / "provenance.json").read_text())


def load_embedded(device: str = "cpu", attn_implementation: str = "sdpa") -> tuple[Any, Any]:
    """``(model, tokenizer)`` of the shipped model, in eval mode on ``device``.

    The model is a ``LlamaForCausalLM`` with grouped-query attention, loaded with
    ``attn_implementation`` (default ``"sdpa"``; ``model.config._attn_implementation``
    may be changed afterwards).
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = embedded_model_path()
    if not (path / "config.json").exists():
        raise FileNotFoundError(
            f"no embedded model in {path}; train one with `kvcert train-model --install`"
        )
    model = AutoModelForCausalLM.from_pretrained(path, attn_implementation=attn_implementation)
    model.to(device)
    model.eval()
    tokenizer = AutoTokenizer.from_pretrained(path)
    return model, tokenizer
