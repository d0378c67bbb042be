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

With pytest-xdist (``-n 2 --dist loadscope``, as ``tests/tiers.sh`` runs it) every worker collects the same
tier-ordered list and takes whole modules from it in that order (a module's fixtures are built once). A worker
whose test fails writes the test's tier into the run's folder (``KVCERT_TIERS_RUN_DIR``, made by the controller);
from then on no worker starts a test of a later tier (one already running finishes), and the controller, which
sees every report, prints the tier lines and gives the exit status.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

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


RUN_DIR = "KVCERT_TIERS_RUN_DIR"  # the run's folder, shared by its xdist workers: failed-<tier> files


def is_worker(config) -> bool:
    return hasattr(config, "workerinput")


def is_controller(config) -> bool:
    """The process that hands tests to xdist workers (and runs none itself)."""
    return not is_worker(config) and getattr(config.option, "numprocesses", None) not in (None, 0)


class TierRun:
    """The tiers of one run: which test is in which, the failures, times and counts per tier."""

    def __init__(self, tiers: list[str], config) -> None:
        self.config = config
        self.tiers = tiers
        self.of: dict[str, str] = {}
        self.selected = {t: 0 for t in tiers}
        self.counts = {t: {} for t in tiers}
        self.failed: set[str] = set()
        self.started: dict[str, float] = {}
        self.ended: dict[str, float] = {}
        self.stopped_after: str | None = None
        self.order = {t: i for i, t in enumerate(tiers)}
        self.run_dir = Path(os.environ[RUN_DIR]) if os.environ.get(RUN_DIR) else None

    def failed_anywhere(self) -> set[str]:
        """The tiers with a failure, in this process or (xdist) in any worker of the run."""
        failed = set(self.failed)
        if self.run_dir is not None:
            failed |= {p.name.removeprefix("failed-") for p in self.run_dir.glob("failed-*")}
        return failed & set(self.tiers)

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
            elif self.stopped_after is not None:
                out.append(f"tier {tier}: not run ({self.selected[tier]} tests), "
                           f"tier {self.stopped_after} failed before it")
            else:
                out.append(f"tier {tier}: not run ({self.selected[tier]} tests): the run stopped before it")
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
        items[:] = sorted(keep, key=lambda item: self.order[self.of[item.nodeid]])  # stable: file order within a tier
        if is_worker(config):
            config.workeroutput["kvcert_tiers_selected"] = dict(self.selected)

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item, nextitem):
        tier = self.of.get(item.nodeid)
        if tier is not None:
            self.started.setdefault(tier, time.monotonic())
        yield
        if tier is None:
            return
        if tier in self.failed and self.run_dir is not None:
            (self.run_dir / f"failed-{tier}").touch()
        if nextitem is not None and self.of.get(nextitem.nodeid) == tier:
            return
        self.ended[tier] = time.monotonic()
        if nextitem is None:
            return
        later = self.order[self.of.get(nextitem.nodeid, tier)]
        failed = sorted((t for t in self.failed_anywhere() if self.order[t] < later), key=self.order.get)
        if failed:
            self.stopped_after = failed[0]
            item.session.shouldstop = f"tier {failed[0]} failed: the later tiers do not run"

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item, call):
        outcome = yield
        tier = self.of.get(item.nodeid)
        if tier is not None:  # the controller of an xdist run learns the tier from the report
            outcome.get_result().user_properties.append(("kvcert_tier", tier))

    def pytest_runtest_logreport(self, report):
        tier = self.of.get(report.nodeid) or dict(report.user_properties).get("kvcert_tier")
        if tier is None or tier not in self.selected:
            return
        now = time.monotonic()
        self.started.setdefault(tier, now)
        self.ended[tier] = now
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

    def pytest_testnodedown(self, node, error):
        """xdist: a worker's selection per tier (every worker collects the same list)."""
        selected = getattr(node, "workeroutput", {}).get("kvcert_tiers_selected")
        if selected:
            self.selected.update(selected)

    def pytest_terminal_summary(self, terminalreporter):
        terminalreporter.section("tiers")
        if is_controller(self.config) and self.failed:
            unrun = [t for t in self.tiers if t not in self.started and self.selected[t]]
            if unrun:
                self.stopped_after = min(self.failed, key=self.order.get)
        for line in self.lines():
            terminalreporter.write_line(line)

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session):
        interrupted = session.exitstatus == pytest.ExitCode.INTERRUPTED
        stopped = self.stopped_after is not None or (is_controller(self.config) and self.failed)
        if stopped and interrupted:
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
    if is_controller(config) and not os.environ.get(RUN_DIR):  # the workers inherit it
        os.environ[RUN_DIR] = tempfile.mkdtemp(prefix="kvcert-tiers-")
    config.pluginmanager.register(TierRun(tiers, config), "kvcert-tiers")
