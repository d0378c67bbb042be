"""LongBench v1 stand-in files: synthetic rows with the official schema and layouts.

A row has the eight official fields (:data:`kvcert.tasks.longbench.REQUIRED_FIELDS`):
``input`` (the question), ``context`` (the document), ``answers`` (a list),
``length`` (the context's word count, as LongBench counts English), ``dataset``,
``language`` ("en"), ``all_classes`` (null for QA) and ``_id`` (48 hex digits). The
document is shaped like its data set's: numbered passages with a title line for the
multi-document sets (hotpotqa, 2wikimqa, musique), a sectioned article for qasper, plain
prose otherwise. The facts a question needs sit near both ends, so a middle truncation
keeps them while the filler in between is what it cuts.

:func:`write_dataset` writes one data set in one of the layouts
:func:`kvcert.tasks.longbench.load_longbench` reads: ``<dir>/<dataset>.jsonl`` (the
released zip) or ``<dir>/<dataset>/test/0000.parquet`` (the Hub's Parquet conversion,
with its column types: ``answers`` and ``all_classes`` lists of strings).
"""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path
from typing import Any

from .text import fact, filler, title
from ..atomic import atomic_path, write_text

LAYOUTS = ("jsonl", "parquet")
MULTI_DOC = frozenset({"hotpotqa", "2wikimqa", "musique"})


def _document(rng: random.Random, dataset: str, words: int, facts: list[str]) -> str:
    head, tail = facts[: len(facts) // 2 + 1], facts[len(facts) // 2 + 1:]
    body = filler(rng, words)
    sentences = head + body + tail
    if dataset in MULTI_DOC:
        per = max(1, len(sentences) // 8)
        chunks = [sentences[i:i + per] for i in range(0, len(sentences), per)]
        return "\n".join(f"Passage {n}:\n{title(rng)}\n{' '.join(chunk)}" for n, chunk in enumerate(chunks, 1))
    if dataset == "qasper":
        sections = ("Introduction", "Related Work", "Method", "Experiments", "Conclusion")
        per = max(1, len(sentences) // len(sections))
        parts = [sentences[i * per:(i + 1) * per] if i < len(sections) - 1 else sentences[i * per:]
                 for i in range(len(sections))]
        return "\n\n".join(f"{name}\n{' '.join(part)}" for name, part in zip(sections, parts))
    return " ".join(sentences)


def row(rng: random.Random, dataset: str, index: int, words: int) -> dict[str, Any]:
    """One row of ``dataset`` whose context has about ``words`` words."""
    asked = fact(rng)
    others = [fact(rng).sentence for _ in range(3)]
    facts = [asked.sentence, *others] if index % 2 == 0 else [*others, asked.sentence]
    context = _document(rng, dataset, words, facts)
    answers = [asked.answer]
    if dataset == "qasper" and index % 3 == 2:  # qasper lists several gold answers, "unanswerable" among them
        answers = [asked.answer, "unanswerable"]
    ident = hashlib.sha256(f"{dataset}:{index}:{asked.question}".encode()).hexdigest()[:48]
    return {
        "input": asked.question,
        "context": context,
        "answers": answers,
        "length": len(context.split()),
        "dataset": dataset,
        "language": "en",
        "all_classes": None,
        "_id": ident,
    }


def rows(dataset: str, count: int, words: int, seed: int = 0) -> list[dict[str, Any]]:
    """``count`` rows of ``dataset`` (deterministic in ``seed``)."""
    rng = random.Random(f"{seed}:{dataset}")
    return [row(rng, dataset, index, words) for index in range(count)]


def write_dataset(folder: str | Path, dataset: str, data: list[dict[str, Any]], layout: str) -> Path:
    """Write ``data`` under ``folder`` in ``layout`` (``jsonl`` or ``parquet``); returns the file."""
    folder = Path(folder)
    if layout == "jsonl":
        path = folder / f"{dataset}.jsonl"
        write_text(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in data))
        return path
    if layout == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        schema = pa.schema([
            ("input", pa.string()), ("context", pa.string()), ("answers", pa.list_(pa.string())),
            ("length", pa.int32()), ("dataset", pa.string()), ("language", pa.string()),
            ("all_classes", pa.list_(pa.string())), ("_id", pa.string()),
        ])
        path = folder / dataset / "test" / "0000.parquet"
        with atomic_path(path) as tmp:
            pq.write_table(pa.Table.from_pylist(data, schema=schema), tmp)
        return path
    raise ValueError(f"layout: {layout!r} is not one of {LAYOUTS}")
