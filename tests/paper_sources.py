"""Stand-ins for the paper profile's models and data, for tests that need the
pre-flight to pass: tiny checkpoints of the real architectures (random weights,
``save_pretrained``) with the embedded word-level tokenizer, one-row LongBench v1 files
and a one-conversation LoCoMo file, in the folder layout the README documents. The
environment variables returned point the shipped configs at them."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
ARCHITECTURES = {"qwen2": "Qwen2", "llama": "Llama", "mistral": "Mistral"}


def _architecture(name: str) -> str:
    return next(cls for key, cls in ARCHITECTURES.items() if name.startswith(key))


def make_model_dir(folder: Path, architecture: str) -> Path:
    import transformers

    from kvcert.training.tokenizer import build_tokenizer

    tokenizer = build_tokenizer()
    config = getattr(transformers, f"{architecture}Config")(
        vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=32768)
    getattr(transformers, f"{architecture}ForCausalLM")(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def paper_sources(root: Path) -> dict[str, str]:
    """Build the stand-ins under ``root``; returns KVCERT_MODEL_DIR, LONGBENCH_DIR, LOCOMO_JSON."""
    grid = yaml.safe_load((REPO / "preregistration" / "grids" / "paper.yaml").read_text())
    models = root / "models"
    for name in grid["models"]:
        make_model_dir(models / name, _architecture(name))
    longbench = root / "longbench"
    longbench.mkdir(parents=True)
    for task in grid["tasks"]:
        if task.startswith("longbench_"):
            dataset = task[len("longbench_"):]
            row = {"input": "Which lamp?", "context": "Passage 1:\nThe lamp is green.", "answers": ["green"],
                   "length": 5, "dataset": dataset, "language": "en", "all_classes": None, "_id": "id-0"}
            (longbench / f"{dataset}.jsonl").write_text(json.dumps(row) + "\n")
    locomo = root / "locomo" / "locomo10.json"
    locomo.parent.mkdir(parents=True)
    locomo.write_text(json.dumps([{
        "sample_id": "conv-1",
        "conversation": {"speaker_a": "Ann", "speaker_b": "Bo", "session_1_date_time": "1:56 pm on 8 May, 2023",
                         "session_1": [{"speaker": "Ann", "dia_id": "D1:1", "text": "I like tea."}]},
        "qa": [{"question": "What does Ann like?", "answer": "tea", "evidence": ["D1:1"], "category": 4}],
    }]))
    return {"KVCERT_MODEL_DIR": str(models), "LONGBENCH_DIR": str(longbench), "LOCOMO_JSON": str(locomo)}
