"""``kvcert bench <name>``: each benchmark module registers one name.

Every benchmark with a ``--threads`` option runs with the thread count :func:`kvcert.threads.choose_threads`
picks, and prints it first: ``--threads N`` as given; else the benchmark's own default where it has one (1 for
those whose documented numbers are per thread: ``generate``, ``host``, ``coverage``, ``design``); else the
CPUs free now (those the process may use less the load average, at most torch's default).
"""

from __future__ import annotations

import importlib

BENCHMARKS = ["kvcert.bench.borrowed_variance", "kvcert.bench.certificate_cost", "kvcert.bench.coverage", "kvcert.bench.decode", "kvcert.bench.design", "kvcert.bench.generate", "kvcert.bench.host", "kvcert.bench.kernel", "kvcert.bench.report_timing"]


def register(subparsers) -> None:
    parser = subparsers.add_parser("bench", help="benchmarks: ratios measured side by side in one run")
    inner = parser.add_subparsers(dest="benchmark", metavar="BENCHMARK")
    inner.required = True
    for module_name in BENCHMARKS:
        importlib.import_module(module_name).register(inner)
    for name, sub in inner.choices.items():
        if any(a.dest == "threads" for a in sub._actions):
            sub.set_defaults(func=_with_threads(sub.get_default("func"), name, sub.get_default("threads")))


def _with_threads(func, name: str, default: int | None):
    """``func`` run with the thread count chosen first and named on the first line (stdout, as the table)."""

    def run(args) -> int:
        from ..threads import ThreadChoice, set_threads

        if default is not None and args.threads == default:  # the benchmark's own setting (or given as it)
            import torch

            choice = ThreadChoice(default, f"{default} thread{'s' if default != 1 else ''} (this benchmark's setting: "
                                           "its documented numbers are at it; --threads N to choose)")
            torch.set_num_threads(choice.threads)
        else:
            choice = set_threads(args.threads, "--threads")
        args.threads = choice.threads
        print(f"kvcert bench {name}: {choice.line}", flush=True)
        return func(args)

    return run
