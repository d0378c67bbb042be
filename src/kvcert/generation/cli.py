"""``kvcert generate``: one job (a JSON/YAML config) over a records manifest into one shard."""

from __future__ import annotations

import json
from pathlib import Path

import yaml


def load_config(path: str) -> dict:
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"config: {path} does not exist")
    text = p.read_text()
    data = json.loads(text) if p.suffix == ".json" else yaml.safe_load(text)
    if not isinstance(data, dict):
        raise ValueError(f"config: {path} does not hold a mapping")
    return data


def run(args) -> int:
    from .runner import run_job

    out = run_job(load_config(args.config), args.records, args.out, prereg_hash=args.prereg_hash, progress=not args.quiet)
    print(out)
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser("generate", help="run one generation job into a resumable JSONL shard")
    p.add_argument("--config", required=True, help="job config (JSON or YAML): model, method, condition, budget, ...")
    p.add_argument("--records", required=True, help="task records manifest (JSONL)")
    p.add_argument("--out", required=True, help="output shard (JSONL); resumes <out>.partial if present")
    p.add_argument("--prereg-hash", default=None, help="pre-registration hash stamped on every record")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=run)
