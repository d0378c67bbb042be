"""The thread count of ``kvcert run`` and ``kvcert bench`` (:mod:`kvcert.threads`) and a time-left estimate that
settles before it is shown (:mod:`kvcert.progress`)."""

from __future__ import annotations

import io
import re
import subprocess
import sys
from argparse import Namespace, _SubParsersAction
from types import SimpleNamespace

import pytest
import torch

from kvcert import progress as progress_module
from kvcert.progress import LineProgress, _settling_tqdm
from kvcert.threads import choose_threads, free_cpus, set_threads


@pytest.fixture
def torch_threads():
    """Restores torch's thread count after a test that sets it."""
    before = torch.get_num_threads()
    yield before
    torch.set_num_threads(before)


def test_the_cpus_free_now_are_those_available_less_the_load_rounded_down():
    assert free_cpus(4, 0.0) == 4
    assert free_cpus(4, 0.2) == 3  # a CPU partly taken counts as taken
    assert free_cpus(4, 1.0) == 3
    assert free_cpus(4, 2.99) == 1
    assert free_cpus(2, 5.0) == 1  # at least one
    assert free_cpus(8, None) == 8  # no load average: all of them
    choice = choose_threads(None, cpus=8, load=2.5)
    assert choice.threads == 5
    assert choice.line == "5 threads: the CPUs free now (8 available, load average 2.50 over the last minute); threads=N to choose"
    busy = choose_threads(None, cpus=2, load=1.9)
    assert busy.threads == 1 and busy.line.startswith("1 thread: the CPUs free now (2 available, load average 1.90")
    assert "no load average here" in choose_threads(None, cpus=3, load=None).line


def test_torchs_default_caps_the_choice_and_the_line_says_so():
    capped = choose_threads(None, cpus=16, load=0.0, cap=4)
    assert capped.threads == 4 and "torch's default 4" in capped.line
    under = choose_threads(None, cpus=16, load=14.0, cap=4)
    assert under.threads == 2 and "torch's default" not in under.line
    assert choose_threads(None, cpus=1, load=0.0, cap=0).threads == 1


def test_a_given_count_wins_and_a_bad_one_is_refused_in_one_line():
    given = choose_threads(3, cpus=1, load=9.0, cap=1)  # as given, whatever the machine
    assert given.threads == 3 and given.line == "3 threads (as given: threads=3)"
    assert choose_threads(1, "--threads").line == "1 thread (as given: --threads 1)"
    for bad in (0, -2, True, 2.5, "2"):
        with pytest.raises(ValueError) as caught:
            choose_threads(bad)
        message = str(caught.value)
        assert "\n" not in message and message.startswith(f"threads={bad}: must be an integer of at least 1")
        assert "give threads=1" in message
    with pytest.raises(ValueError, match=r"^--threads 0: .* give --threads 1 or leave it out"):
        choose_threads(0, "--threads")


def test_a_given_count_is_capped_at_four_times_the_machines_cpus(monkeypatch):
    """Round 6 (issue 62, item 8): threads= had no upper bound (10⁹: "libgomp: Out of memory"; 10⁵: a 41-line
    MemoryError). At most four times the machine's CPUs (kvcert.threads.most_threads), refused in one line."""
    from kvcert import threads as threads_module

    monkeypatch.setattr(threads_module.os, "cpu_count", lambda: 2)
    assert threads_module.most_threads() == 8
    assert choose_threads(8).threads == 8  # a deliberate oversubscription is allowed
    for big in (9, 10**5, 10**9):
        with pytest.raises(ValueError) as caught:
            choose_threads(big)
        message = str(caught.value)
        assert "\n" not in message
        assert message == (f"threads={big}: more than 8, 4 times this machine's 2 CPUs (a thread beyond the CPUs only "
                           "waits); give threads=2 or fewer, or leave it out to use the free CPUs")
    with pytest.raises(ValueError, match=r"^--threads 100000: more than 8, .* give --threads 2 or fewer"):
        choose_threads(10**5, "--threads")


def test_kvcert_run_refuses_too_many_threads_before_anything_loads(monkeypatch):
    import kvcert.generation.manifest
    import kvcert.method.models
    from kvcert.commands.oneoff import run_command

    for module, name in ((kvcert.method.models, "load_model"), (kvcert.generation.manifest, "load_tokenizer")):
        monkeypatch.setattr(module, name, lambda *a, **k: pytest.fail("loaded before threads= was checked"))
    with pytest.raises(ValueError, match=r"^threads=1000000000: more than \d+, 4 times this machine's") as caught:
        run_command(Namespace(overrides=["task=needle", "limit=1", "threads=1000000000"], configs=None, prereg=None,
                              quiet=True))
    assert "\n" not in str(caught.value)


def test_set_threads_applies_the_choice_to_torch(torch_threads):
    assert set_threads(1).threads == 1 and torch.get_num_threads() == 1
    choice = set_threads(None)  # torch's default is now 1: it caps the choice
    assert choice.threads == 1 and torch.get_num_threads() == 1


def test_every_benchmark_with_a_threads_option_chooses_and_names_them_first(torch_threads, capsys):
    from kvcert.bench.cli import _with_threads
    from kvcert.cli import build_parser

    seen = []
    fake = _with_threads(lambda args: seen.append(args.threads) or 0, "fake", None)
    assert fake(Namespace(threads=None)) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert re.fullmatch(rf"kvcert bench fake: {seen[0]} threads?: the CPUs free now \(.*\); --threads N to choose", first)
    own = _with_threads(lambda args: seen.append(args.threads) or 0, "own", 1)
    own(Namespace(threads=1))
    assert capsys.readouterr().out.startswith("kvcert bench own: 1 thread (this benchmark's setting")
    assert seen[-1] == 1 and torch.get_num_threads() == 1
    parser = build_parser()
    args = parser.parse_args(["bench", "certificate", "--threads", "0"])
    with pytest.raises(ValueError, match=r"^--threads 0: must be an integer of at least 1"):
        args.func(args)
    commands = next(a for a in parser._actions if isinstance(a, _SubParsersAction))
    bench = next(a for a in commands.choices["bench"]._actions if isinstance(a, _SubParsersAction))
    wrapped = [name for name, sub in bench.choices.items() if any(a.dest == "threads" for a in sub._actions)]
    assert {"decode", "certificate", "coverage", "generate"} <= set(wrapped)
    for name in wrapped:
        assert bench.choices[name].get_default("func").__qualname__.startswith("_with_threads"), name


class Clock:
    """A monotonic clock the test moves."""

    def __init__(self):
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch):
    fake = Clock()
    monkeypatch.setattr(progress_module, "time", SimpleNamespace(monotonic=fake.monotonic))
    return fake


def test_no_time_left_before_the_estimate_settles_and_not_from_the_first_item(clock):
    stream = io.StringIO()
    bar = LineProgress(20, "generate", "generations", interval=10.0, stream=stream)
    clock.now = 30.0  # the first item carries the warm-up: 30 s
    bar.update()
    assert bar.left() is None
    clock.now = 32.0
    bar.update()
    assert bar.left() is None  # two items: not settled
    for _ in range(8):  # then one every 2 s
        clock.now += 2.0
        bar.update()
    assert bar.n == 10 and clock.now == 48.0
    # the items left at the recent rate (2 s each), not the mean one: 48 s / 10 items would say 48 s
    assert bar.left() == pytest.approx(10 * 2.0)
    bar.close()
    assert stream.getvalue().splitlines() == [
        "generate: 1/20 generations (5 %), 30 s",  # every 10 s; no time left from the first item
        "generate: 6/20 generations (30 %), 40 s, ~28 s left",  # 14 items at 2 s
        "generate: 10/20 generations (50 %), 48 s, ~20 s left",  # the line at the close
    ]


def test_the_estimate_follows_the_recent_rate_and_counts_a_burst_as_one(clock):
    bar = LineProgress(100, "generate", interval=1e9, stream=io.StringIO())
    for _ in range(10):
        clock.now += 5.0
        bar.update()
    assert bar.left() == pytest.approx(90 * 5.0)
    for _ in range(12):  # faster now: the window forgets the slow start
        clock.now += 1.0
        bar.update()
    assert bar.left() == pytest.approx(78 * 1.0)
    for _ in range(10):  # four runs of one example written at once, an example every 4 s: 1 s a run
        clock.now += 4.0
        for _ in range(4):
            bar.update()
            clock.now += 0.001
    assert bar.left() == pytest.approx(38 * 1.0, rel=0.01)
    # a steady stream of quick items still gives a rate (bursts span at most a second)
    quick = LineProgress(1000, "build", interval=1e9, stream=io.StringIO())
    for _ in range(200):
        clock.now += 0.1
        quick.update()
    assert quick.left() == pytest.approx(800 * 0.1, rel=0.05)
    bar.n = bar.total
    assert bar.left() is None  # nothing left


def test_the_tqdm_bar_shows_no_rate_until_the_estimate_settles():
    bar = _settling_tqdm()(total=10, desc="x", file=io.StringIO(), mininterval=0)
    bar.update(1)
    assert "?" in str(bar) and "<?" in str(bar)
    bar.update(4)
    bar.start_t -= 60.0  # a minute has passed
    assert "?" not in str(bar)
    bar.close()


@pytest.mark.pipeline
def test_kvcert_run_names_its_thread_choice_first(tmp_path):
    from kvcert.embedded import embedded_model_path

    proc = subprocess.run(
        [sys.executable, "-m", "kvcert.cli", "run", f"model.path={embedded_model_path()}", "task=needle",
         "method=snapkv-topk", "budget=0.5", "limit=1", f"out={tmp_path / 'run'}"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stderr.splitlines()  # the thread line once the inputs have passed, right before the model loads
    first = next(line for line in lines if line.startswith("kvcert run: "))
    assert lines[lines.index(first) + 1].startswith("loading the model ")
    match = re.fullmatch(r"kvcert run: (\d+) threads?: the CPUs free now \((\d+) available, .*\); threads=N to choose",
                         first)
    assert match and 1 <= int(match[1]) <= int(match[2]), first
    assert f"; {match[1]} thread" in proc.stdout.splitlines()[0]
    bad = subprocess.run([sys.executable, "-m", "kvcert.cli", "run", f"model.path={embedded_model_path()}",
                          "task=needle", "threads=0"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and bad.stderr.strip() == "kvcert run: error: threads=0: must be at least 1"
