"""The files a step writes besides the records: Parquet tables that carry their provenance, and plain JSON.

A table's provenance (the pre-registration hash, the configs it was made under, …) is JSON in the Parquet
file's schema metadata under :data:`METADATA_KEY`, so a table and what it was made from cannot part. Every file
is written to a temporary file and renamed over the target (:mod:`kvcert.atomic`). Torch-free, importable from
every stage (the replay step of generation and the score and claims steps of the analysis write these).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from .atomic import atomic_path, write_text

#: the schema-metadata key of a table's provenance
METADATA_KEY = b"kvcert"


def write_table(df: pd.DataFrame, path: str | Path, provenance: Mapping) -> Path:
    """Write ``df`` as Parquet with ``provenance`` (JSON) in the file's schema metadata."""
    path = Path(path)
    table = pa.Table.from_pandas(df, preserve_index=False)
    meta = dict(table.schema.metadata or {})
    meta[METADATA_KEY] = json.dumps(provenance, sort_keys=True, default=str).encode()
    with atomic_path(path) as tmp:
        pq.write_table(table.replace_schema_metadata(meta), tmp)
    return path


def read_table(path: str | Path, columns: list[str] | None = None) -> tuple[pd.DataFrame, dict]:
    """A Parquet table written by :func:`write_table` and its provenance."""
    table = pq.read_table(path, columns=columns)
    meta = (table.schema.metadata or {}).get(METADATA_KEY)
    return table.to_pandas(), (json.loads(meta) if meta else {})


def jsonable(obj: Any) -> Any:
    """Plain JSON: numpy scalars to Python, NaN/inf to null, tuples to lists, paths to str."""
    if isinstance(obj, Mapping):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return [jsonable(v) for v in obj.tolist()]
    if isinstance(obj, (np.bool_, bool)):
        return bool(obj)
    if isinstance(obj, (np.integer,)):
        return int(obj)
    if isinstance(obj, (float, np.floating)):
        return float(obj) if math.isfinite(float(obj)) else None
    if isinstance(obj, Path):
        return str(obj)
    return obj


def write_json(data: Any, path: str | Path) -> Path:
    return write_text(path, json.dumps(jsonable(data), indent=2, sort_keys=False, allow_nan=False) + "\n")
