"""Run one generation job over a records manifest into one resumable shard.

Everything that can be wrong with the inputs — the config, the model path, the
records file — is checked before the first generation, each in one line.
"""

from __future__ import annotations

import sys
from pathlib import Path

from tqdm import tqdm

from ..models import load_model, resolve_model_path
from ..tasks.records import read_jsonl
from .engine import Engine
from .provenance import provenance
from .shards import KEY, ShardWriter, read_records
from .spec import GenerationSpec


def run_job(
    config: dict,
    records_path: str | Path,
    out_path: str | Path,
    prereg_hash: str | None = None,
    model_and_tokenizer=None,
    progress: bool = True,
) -> Path:
    """Generate every record of ``records_path`` under ``config`` into the shard ``out_path``.

    Resumes a ``.partial`` shard left by an interrupted run; returns the final path.
    """
    spec = GenerationSpec.from_dict(config)
    records_path = Path(records_path)
    if not records_path.exists():
        raise FileNotFoundError(f"records: {records_path} does not exist; build the task manifest first")
    records = read_jsonl(records_path)
    ids = [r.id for r in records]
    if len(set(ids)) != len(ids):
        raise ValueError(f"records: {records_path} holds duplicate ids")
    out_path = Path(out_path)
    if out_path.exists():  # a finished shard: nothing to do if it holds exactly these records
        done = {str(r[KEY]) for r in read_records(out_path)}
        if done == set(ids):
            return out_path
        raise ValueError(f"{out_path}: finished shard holds other records than {records_path}; delete it to regenerate")
    if model_and_tokenizer is None:
        resolve_model_path(spec.model.path)  # a missing path fails here, before loading anything
    writer = ShardWriter(out_path).open()
    try:
        todo = [r for r in records if not writer.is_done(r.id)]
        if writer.recovered_tail:
            print(f"{writer.partial}: dropped a truncated last line; it is recomputed", file=sys.stderr)
        if todo:
            model, tokenizer = model_and_tokenizer or load_model(spec.model)
            engine = Engine(model, tokenizer, spec, provenance(spec.to_dict(), prereg_hash))
            bar = tqdm(todo, desc=Path(out_path).name, unit="gen", disable=not progress, file=sys.stderr)
            for record in bar:
                writer.write(engine.run(record))
    finally:
        writer.close()
    return writer.finalize(ids)
