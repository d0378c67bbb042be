"""``kvcert make-rehearsal``: write stand-ins of an experiment's models and data."""

from __future__ import annotations

from pathlib import Path


def make_rehearsal_command(args) -> int:
    from . import checkpoints, make_rehearsal

    sources = make_rehearsal(args.out, args.experiment, rows=args.rows, context_words=args.context_words,
                             configs=Path(args.configs) if args.configs else None,
                             prereg=Path(args.prereg) if args.prereg else None, seed=args.seed)
    for name, folder in sources.models.items():
        info = checkpoints.describe(folder)
        print(f"model {name}: {folder} ({info['architectures'][0]}, {info['layers']} layers, "
              f"vocabulary {info['vocab_size']})")
    for name, path in sources.longbench.items():
        print(f"task {name}: {path}")
    if sources.locomo is not None:
        print(f"task locomo: {sources.locomo}")
    print(f"point the shipped configs at them: . {sources.root / 'env.sh'}")
    for key, value in sources.env.items():
        print(f"  export {key}={value}")
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "make-rehearsal", help="write stand-in checkpoints and data files of an experiment (default: rehearsal)",
        description=__import__("kvcert.rehearsal", fromlist=["x"]).__doc__,
        formatter_class=__import__("argparse").RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="folder to write (models/, longbench/, locomo/, env.sh)")
    p.add_argument("--experiment", default="rehearsal", help="whose grid names the models and tasks")
    p.add_argument("--rows", type=int, default=None, help="LongBench rows per data set and LoCoMo QA items (default: the grid's examples)")
    p.add_argument("--context-words", type=int, default=None,
                   help="words per LongBench context (default: twice the grid's longest LongBench length)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--prereg", default=None, help="pre-registration folder (default: as kvcert plan)")
    p.add_argument("--configs", default=None, help="hydra configs folder (default: as kvcert plan)")
    p.set_defaults(func=make_rehearsal_command)
