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
    "kvcert.commands.reference",
    "kvcert.rehearsal.cli",
    "kvcert.training.cli",
]


class Parser(argparse.ArgumentParser):
    """argparse's parser, but an option the command does not have is named first: ``kvcert bench design
    --lengths 0`` says ``unrecognized arguments: --lengths`` (with the nearest option), not that ``0`` is an
    invalid choice of the positional argument it fell to. :attr:`argv` is the command line being parsed."""

    argv: list[str] = []

    def error(self, message: str):  # noqa: D401 — argparse's hook: prints usage and exits 2
        parser = self.deepest(Parser.argv)  # the command the line names (the top parser reports leftovers)
        unknown = parser.unknown_options(Parser.argv)
        if unknown:
            import difflib

            known = sorted(o for o in parser._option_string_actions if o.startswith("--"))
            close = difflib.get_close_matches(unknown[0].split("=", 1)[0], known, n=1)
            message = (f"unrecognized arguments: {' '.join(unknown)}"
                       + (f" (did you mean {close[0]}?)" if close else "")
                       + (f"; the options of {parser.prog}: {', '.join(known)}" if known else ""))
            if parser is not self:
                parser.error(message)
        super().error(message)

    def deepest(self, argv: list[str]) -> "Parser":
        """The subcommand's parser that ``argv`` names (this one where it names none)."""
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction):
                for word in argv:
                    if word in action.choices and isinstance(action.choices[word], Parser):
                        rest = argv[argv.index(word) + 1:]
                        return action.choices[word].deepest(rest)
        return self

    def unknown_options(self, argv: list[str]) -> list[str]:
        """The ``-x`` / ``--name`` items of ``argv`` after this parser's own command words that are none of its
        options (nor an unambiguous abbreviation of one, as argparse accepts); negative numbers are values."""
        words = self.prog.split()[1:]  # "kvcert bench design" -> the command words to skip past
        rest, at = list(argv), 0
        for word in words:
            if word in rest[at:]:
                at = rest.index(word, at) + 1
        found = []
        for item in rest[at:]:
            if item == "--":
                break
            if not item.startswith("-") or item == "-" or _NUMBER.match(item):
                continue
            name = item.split("=", 1)[0]
            if name in self._option_string_actions:
                continue
            if name.startswith("--") and self.allow_abbrev and \
                    sum(o.startswith(name) for o in self._option_string_actions) == 1:
                continue
            found.append(item)
        return found


_NUMBER = re.compile(r"^-\d+$|^-\d*\.\d+$")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="kvcert",
        description="Randomized KV-cache eviction with error certificates (arXiv 2607.21475).",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
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
    Parser.argv = list(sys.argv[1:] if argv is None else argv)
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
