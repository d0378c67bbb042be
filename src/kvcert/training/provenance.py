"""The record of how a trained model was made (``provenance.json`` in its directory).

Fields: the command, seed, recipe, training-data SHA-256 (hash chain over every batch),
training wall time, evaluation lengths and per-task full-cache accuracy
(``accuracy_full_cache`` = {task: {length: accuracy}}), parameter count, size on disk,
library versions and the machine's CPU count. Later measurements (such as the
accuracy under 12.5 % streaming top-k eviction) are merged in with :func:`update`.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
from pathlib import Path
from typing import Any

import tokenizers
import torch
import transformers
from kvcert.atomic import write_text

PROVENANCE = "provenance.json"


def build(
    *,
    command: str,
    seed: int,
    recipe: dict[str, Any],
    data_sha256: str,
    wall_time_s: float,
    steps: int,
    model: Any,
    model_dir: Path,
    model_files: tuple[str, ...],
    final_losses: dict[str, float | None],
) -> dict[str, Any]:
    size = sum((Path(model_dir) / name).stat().st_size for name in model_files
               if (Path(model_dir) / name).is_file())
    return {
        "command": command,
        "seed": seed,
        "recipe": recipe,
        "steps": steps,
        "training_data_sha256": data_sha256,
        "training_wall_time_s": round(wall_time_s, 1),
        "final_losses": final_losses,
        "num_parameters": sum(p.numel() for p in model.parameters()),
        "model_files_bytes": size,
        "created_utc": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "versions": {
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "tokenizers": tokenizers.__version__,
            "python": platform.python_version(),
        },
        "machine": {"cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(),
                    "processor": platform.machine()},
    }


def write(model_dir: str | Path, data: dict[str, Any]) -> Path:
    path = Path(model_dir) / PROVENANCE
    write_text(path, json.dumps(data, indent=2, sort_keys=False) + "\n")
    return path


def read(model_dir: str | Path) -> dict[str, Any]:
    return json.loads((Path(model_dir) / PROVENANCE).read_text())


def update(model_dir: str | Path, **fields: Any) -> dict[str, Any]:
    """Merge ``fields`` into an existing provenance record and rewrite it."""
    data = read(model_dir)
    data.update(fields)
    write(model_dir, data)
    return data
