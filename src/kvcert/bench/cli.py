"""``kvcert bench <name>``: each benchmark module registers one name."""

from __future__ import annotations

import importlib

BENCHMARKS = ["kvcert.bench.certificate_cost", "kvcert.bench.coverage", "kvcert.bench.decode", "kvcert.bench.design", "kvcert.bench.generate", "kvcert.bench.host", "kvcert.bench.kernel", "kvcert.bench.report_timing"]


def register(subparsers) -> None:
    parser = subparsers.add_parser("bench", help="benchmarks: ratios measured side by side in one run")
    inner = parser.add_subparsers(dest="benchmark", metavar="BENCHMARK")
    inner.required = True
    for module_name in BENCHMARKS:
        importlib.import_module(module_name).register(inner)
