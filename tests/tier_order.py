"""Several test tiers in one pytest process (a pytest plugin; ``tests/tiers.sh`` loads it with ``-p tier_order``).

``--tiers unit,kernel,pipeline,slow,slurm`` selects every test of those tiers and runs them tier by tier, in the
order given; a tier with a failure stops the run where that tier ends (the later tiers do not start), as separate
``pytest -m …`` runs per tier would, without paying each run's start (torch, transformers and the test modules
imported again) and without building the session fixtures twice (the reduced smoke run the slow and the Slurm
tiers both compare with). The end of the run prints one line per tier: its time and its counts.

A test's tier is decided by its markers, the first that applies of:

=========  ===============================================================
compile    ``gpu_compile``
slurm      ``slurm``
slow       ``slow``
pipeline   ``pipeline``
kernel     ``kernel``
unit       none of them
=========  ===============================================================

which is what the marker expressions of docs/testing.md select. A tier that selects no test fails the run (exit
5) unless ``KVCERT_TIERS_MAY_BE_EMPTY`` names it: a tier that runs nothing does not pass.
"""

from __future__ import annotations

import os
import time

import pytest

TIERS = ("unit", "kernel", "pipeline", "slow", "slurm", "compile")
#: the marker that puts a test in a tier, by precedence (unit: none of them)
PRECEDENCE = (("gpu_compile", "compile"), ("slurm", "slurm"), ("slow", "slow"), ("pipeline", "pipeline"),
              ("kernel", "kernel"))


def tier_of(markers: set[str]) -> str:
    """The tier of a test carrying ``markers`` (their names)."""
    for marker, tier in PRECEDENCE:
        if marker in markers:
            return tier
    return "unit"


def pytest_addoption(parser):
    parser.addoption("--tiers", default=None,
                     help="comma-separated test tiers to run in this order, one pytest process (tests/tier_order.py)")


class TierRun:
    """The tiers of one run: which test is in which, the failures, times and counts per tier."""

    def __init__(self, tiers: list[str]) -> None:
        self.tiers = tiers
        self.of: dict[str, str] = {}
        self.selected = {t: 0 for t in tiers}
        self.counts = {t: {} for t in tiers}
        self.failed: set[str] = set()
        self.started: dict[str, float] = {}
        self.ended: dict[str, float] = {}
        self.stopped_after: str | None = None

    def empty(self) -> list[str]:
        allowed = os.environ.get("KVCERT_TIERS_MAY_BE_EMPTY", "").split()
        return [t for t in self.tiers if self.selected[t] == 0 and t not in allowed]

    def lines(self) -> list[str]:
        out = []
        for tier in self.tiers:
            if tier in self.started:
                seconds = self.ended.get(tier, time.monotonic()) - self.started[tier]
                counts = ", ".join(f"{n} {what}" for what, n in sorted(self.counts[tier].items())) or "no outcome"
                out.append(f"tier {tier} ({seconds:.0f} s): {counts}" + ("  FAILED" if tier in self.failed else ""))
            elif self.selected[tier] == 0:
                out.append(f"tier {tier}: selected no test")
            else:
                out.append(f"tier {tier}: not run ({self.selected[tier]} tests), "
                           f"tier {self.stopped_after} failed before it")
        for tier in self.empty():
            out.append(f"tier {tier} selected no test: a tier that runs nothing does not pass "
                       f"(KVCERT_TIERS_MAY_BE_EMPTY=\"{tier}\" allows it)")
        return out


    # hooks of the run (registered as a plugin by pytest_configure)

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, config, items):
        keep, drop = [], []
        for item in items:
            tier = tier_of({m.name for m in item.iter_markers()})
            if tier in self.selected:
                self.of[item.nodeid] = tier
                self.selected[tier] += 1
                keep.append(item)
            else:
                drop.append(item)
        if drop:
            config.hook.pytest_deselected(items=drop)
        order = {t: i for i, t in enumerate(self.tiers)}
        items[:] = sorted(keep, key=lambda item: order[self.of[item.nodeid]])  # stable: file order within a tier

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item, nextitem):
        tier = self.of.get(item.nodeid)
        if tier is not None:
            self.started.setdefault(tier, time.monotonic())
        yield
        if tier is None or (nextitem is not None and self.of.get(nextitem.nodeid) == tier):
            return
        self.ended[tier] = time.monotonic()
        if tier in self.failed and nextitem is not None:
            self.stopped_after = tier
            item.session.shouldstop = f"tier {tier} failed: the later tiers do not run"

    def pytest_runtest_logreport(self, report):
        tier = self.of.get(report.nodeid)
        if tier is None:
            return
        if report.failed:
            self.failed.add(tier)
            what = "failed" if report.when == "call" else "errors"
        elif report.skipped:
            what = "skipped"
        elif report.when == "call":
            what = "passed"
        else:
            return
        self.counts[tier][what] = self.counts[tier].get(what, 0) + 1

    def pytest_terminal_summary(self, terminalreporter):
        terminalreporter.section("tiers")
        for line in self.lines():
            terminalreporter.write_line(line)

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session):
        if self.stopped_after is not None and session.exitstatus == pytest.ExitCode.INTERRUPTED:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED  # stopped by a failing tier, not by the user
        elif self.empty() and session.exitstatus == 0:
            session.exitstatus = 5  # a tier that selected nothing: the run does not pass
        elif session.exitstatus == 5 and not self.empty():
            session.exitstatus = 0  # nothing selected, and every tier asked for may select nothing


def pytest_configure(config):
    wanted = config.getoption("--tiers")
    if not wanted:
        return
    tiers = [t.strip() for t in wanted.split(",") if t.strip()]
    unknown = [t for t in tiers if t not in TIERS]
    if unknown:
        raise pytest.UsageError(f"--tiers: unknown tier {unknown[0]!r}; the tiers are: {' '.join(TIERS)}")
    config.pluginmanager.register(TierRun(tiers), "kvcert-tiers")
