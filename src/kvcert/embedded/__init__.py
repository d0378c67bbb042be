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
