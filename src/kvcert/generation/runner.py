"""Run generation specs over a records manifest into one resumable shard.

Everything that can be wrong with the inputs — the configs, the model path, the
records file — is checked before the first generation, each in one line. A shard may
hold several runs (the full cache and the compressed settings of the same examples);
they share one loaded model. Every example goes through the one generation path
(:func:`kvcert.generation.forked.generate`): its runs that can share a prefill are forked from
one and decoded together; chunked streaming runs are prefilled alone and decoded in the same
loop; with ``forked=False`` every run goes alone (the one-row case; ``kvcert shard --batch-1``).
An example interrupted half written is recomputed whole (every forkable run of it, so the
batch — hence every record's rounding — is the one an uninterrupted run has) and only its
missing records are written: no duplicate, no gap, the same records. A partial shard begun at
another record code is refused, not resumed (:func:`kvcert.generation.shards.check_one_code`).
"""

from __future__ import annotations

import sys
from pathlib import Path

from ..config.digest import content_digest
from ..config.sources import fetched_name
from ..method.models import load_model, resolve_model_path  # noqa: F401  (resolve_model_path: re-exported)
from ..progress import progress as progress_display
from ..provenance import code_digest, config_hash, provenance
from ..tasks.records import load_records  # noqa: F401  (re-exported: kvcert shard reads a manifest so)
from .decode_step import graph_env
from .engine import Engine
from .forked import forkable, generate
from .record import GenerationKey
from .shards import ShardWriter, check_one_code, read_records
from .spec import GenerationSpec


def foreign_reason(record: dict, prereg_hash: str | None, hashes: set[str], planned: set[GenerationKey],
                   model_digest: str | None = None) -> str | None:
    """Why a record found in a shard's partial file is not one of this shard's (None: it is): the hash that
    differs, with the one it should carry (the model folder's content digest too, where it is known), or its
    key the plan puts in no run of this shard."""
    if record.get("prereg_hash") != prereg_hash:
        return f"made under pre-registration {record.get('prereg_hash')}, not {prereg_hash}"
    if record.get("config_hash") not in hashes:
        return f"made under config {record.get('config_hash')}, not {' or '.join(sorted(hashes))}"
    if model_digest is not None and record.get("model_digest") != model_digest:
        return f"made from the model folder of digest {record.get('model_digest')}, not {model_digest}"
    if GenerationKey.of(record) not in planned:
        return f"{GenerationKey.of(record)}, a record of another shard"
    return None


def model_content(path: str, given: bool = False) -> str | None:
    """:func:`~kvcert.config.sources.content_digest` of the model at ``path``; with a model ``given`` by the caller
    (already loaded) a path that names no folder is not refused (its records then carry no digest)."""
    try:
        return content_digest(path)
    except FileNotFoundError:
        if given and fetched_name(path) is None:  # a fetched model's folder is always checked against its pins
            return None
        raise


def run_specs(
    specs: list[GenerationSpec],
    records,
    out_path: str | Path,
    prereg_hash: str | None = None,
    model_and_tokenizer=None,
    progress: bool = True,
    forked: bool = True,
) -> Path:
    """Generate every record of ``records`` under every spec (:class:`GenerationSpec`, validated where it
    was built) into the shard ``out_path`` (resumable)."""
    specs = list(specs)
    if not all(isinstance(s, GenerationSpec) for s in specs):
        raise TypeError("run_specs: give GenerationSpec objects (GenerationSpec.from_dict of a config mapping)")
    if len({s.model for s in specs}) != 1:
        raise ValueError("configs: the runs of one shard must use the same model")
    keys = [GenerationKey.planned(s, r) for r in records for s in specs]
    planned = set(keys)
    if len(planned) != len(keys):
        raise ValueError("configs: two runs of the shard are the same setting")
    out_path = Path(out_path)
    if out_path.exists():  # a finished shard: nothing to do if it holds exactly these records
        done = {GenerationKey.of(r) for r in read_records(out_path)}
        if done == planned:
            return out_path
        raise ValueError(f"{out_path}: the finished shard holds other records than planned; delete it to regenerate")
    # the folder's content: a missing path, or a fetched model whose files differ from their pins, fails here,
    # before anything loads; the digest (read through the digest cache) is stamped on every record
    digest = model_content(specs[0].model.path, given=model_and_tokenizer is not None)
    graph_env()  # KVCERT_DECODE_GRAPH other than 0 or 1: refused here, not after the model loads
    writer = ShardWriter(out_path).open()
    try:
        if writer.recovered_tail:
            print(f"{writer.partial}: dropped a truncated last line; it is recomputed", file=sys.stderr)
        hashes = {config_hash(s.hashed_dict()) for s in specs}
        foreign = {key: why for key, r in writer.done.items()
                   if (why := foreign_reason(r, prereg_hash, hashes, planned, digest)) is not None}
        if foreign:  # written before an amendment or a config change, or for another shard: never mixed in
            aside = writer.set_aside(foreign)
            print(f"{writer.partial}: {len(foreign)} records set aside as {aside.name} "
                  f"(the first {next(iter(foreign.values()))}); the {len(writer.done)} records of this shard "
                  "are kept", file=sys.stderr)
        check_one_code(writer.partial, writer.done.values(), code_digest())  # before anything loads
        todo = [(r, s) for r in records for s in specs if not writer.is_done(GenerationKey.planned(s, r))]
        if todo:
            model, tokenizer = model_and_tokenizer or load_model(specs[0].model)
            engines = [Engine(model, tokenizer, s, provenance(s.hashed_dict(), prereg_hash) | {"model_digest": digest})
                       for s in specs]
            bar = progress_display(len(todo), "generate " + "/".join(out_path.parts[-5:]), "generations", progress)
            for record in records:
                missing = [e for e in engines if not writer.is_done(GenerationKey.planned(e.spec, record))]
                if not missing:
                    continue
                forks = [e for e in engines if forkable(e)] if forked else []
                forks = forks if len(forks) > 1 and any(e in forks for e in missing) else []  # the whole batch again
                runs = [e for e in engines if e in forks or e in missing]
                if forked:
                    results = dict(zip(map(id, runs), generate(runs, record)))
                else:  # every run alone: the one-row case of the same path
                    results = {id(e): generate([e], record)[0] for e in missing}
                for e in missing:
                    writer.write(results[id(e)])
                    bar.update(1)
            bar.close()
    finally:
        writer.close()
    return writer.finalize(keys)


def run_job(
    config: dict,
    records_path: str | Path,
    out_path: str | Path,
    prereg_hash: str | None = None,
    model_and_tokenizer=None,
    progress: bool = True,
) -> Path:
    """One config over a whole manifest (``kvcert generate``)."""
    spec = GenerationSpec.from_dict(config)  # config errors before the records are read
    records = load_records(records_path)
    return run_specs([spec], records, out_path, prereg_hash, model_and_tokenizer, progress)
