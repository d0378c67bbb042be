"""The ``kvcert`` console command.

Each subcommand lives in the module that owns its work; this file only lists them.
A module listed in ``SUBCOMMANDS`` exposes ``register(subparsers)``, which adds its
parser and sets ``func`` (called with the parsed arguments; its return value is the
exit status).
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
import sys

#: reStructuredText roles and literals of docstrings, as plain text for --help
_RST = [(re.compile(r":(?:func|class|mod|meth|data|attr):`~?([^`]+)`"), r"\1"), (re.compile(r"``([^`]+)``"), r"\1")]


def plain_text(text: str | None) -> str | None:
    """A docstring as --help shows it: roles (:func:`x`) and literals (``x``) reduced to their text."""
    if text is None:
        return None
    for pattern, repl in _RST:
        text = pattern.sub(repl, text)
    return text

# (module path) — each registers one or more subcommands.
SUBCOMMANDS: list[str] = [
    "kvcert.bench.cli",
    "kvcert.analysis.cli",
    "kvcert.generation.cli",
    "kvcert.config.model_store",
    "kvcert.config.prereg",
    "kvcert.commands.cli",
    "kvcert.rehearsal.cli",
    "kvcert.training.cli",
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kvcert",
        description="Randomized KV-cache eviction with error certificates (arXiv 2607.21475).",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    subparsers.required = True
    for module_name in SUBCOMMANDS:
        importlib.import_module(module_name).register(subparsers)
    for sub in subparsers.choices.values():
        sub.description = plain_text(sub.description)
        for action in sub._actions:
            action.help = plain_text(action.help) if isinstance(action.help, str) else action.help
    return parser


def main(argv: list[str] | None = None) -> int:
    if argv is None and os.environ.get("KVCERT_WARM"):  # a job of a local Snakemake run: a fork of a warm process
        from .commands.warm import run_warm

        status = run_warm(sys.argv[1:])
        if status is not None:
            return status
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        status = args.func(args)
    except (ValueError, FileNotFoundError, KeyError, RuntimeError) as exc:  # user errors: one line, no traceback
        print(f"kvcert {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # a full disk, a read-only folder, a folder where a file should be: one line
        from .atomic import WriteError

        if isinstance(exc, WriteError) or exc.filename is None:  # names its path / no path to name
            message = str(exc)
        else:  # the OS's own: "[Errno 28] ...: 'path'" as "path: reason"
            names = " -> ".join(str(n) for n in (exc.filename, exc.filename2) if n is not None)
            message = f"{names}: {exc.strerror or exc}"
        print(f"kvcert {args.command}: error: {' '.join(message.split())}", file=sys.stderr)
        return 2
    return int(status or 0)


if __name__ == "__main__":
    sys.exit(main())
