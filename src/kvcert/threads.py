"""The thread count of a command that runs a model in its own process (``kvcert run``, ``kvcert bench``).

torch's default is one thread per physical core, whatever else the machine runs. Its parallel regions wait
for every thread at each operation's end, so a thread whose CPU is taken by another process stalls them
all, and on a busy machine torch's default runs a model several times slower than one thread, with the same
records (a measured case: docs/bring-your-own.md). The pipeline's jobs run one thread each
(``threads_per_job`` of the CPU experiments).

The rule (:func:`choose_threads`): **the CPUs free now** — the CPUs this process may run on
(``os.sched_getaffinity``: a container's or ``taskset``'s share, not the machine's count), less the
1-minute load average (the runnable processes, this command's own start negligible), rounded *down*, at
least 1 — and never more than torch's default. A CPU half taken counts as taken: too few threads cost at
most the share of the free CPUs left idle, too many cost a stall at every operation,
and the load average lags the machine by about a minute. On a quiet machine this is torch's default; on one
whose CPUs are all busy, one thread, as the pipeline runs. ``threads=N`` (``--threads N``) overrides it, up to
four times the machine's CPUs (:func:`most_threads`).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass


@dataclass(frozen=True)
class ThreadChoice:
    """The threads a command runs with and why (:attr:`line`, what it prints first)."""

    threads: int
    line: str


def cpus_available() -> int:
    """The CPUs this process may run on (its affinity mask where the platform has one, else the CPU count)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def load_average() -> float | None:
    """The 1-minute load average, or None where the platform has none."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


def free_cpus(cpus: int, load: float | None) -> int:
    """The CPUs wholly free: ``cpus`` less the load, rounded down, at least 1 (all of them without a load)."""
    if load is None:
        return max(1, cpus)
    return max(1, min(cpus, math.floor(cpus - load + 1e-9)))


#: how many times the machine's CPUs a ``threads=`` may ask for (:func:`most_threads`)
THREADS_PER_CPU = 4


def most_threads() -> int:
    """The most threads a command may be given: :data:`THREADS_PER_CPU` × the machine's CPUs (``os.cpu_count()``,
    not the affinity share, so a ``taskset`` run may still ask for the machine's count). A thread beyond the CPUs
    can only wait (torch's parallel regions wait for every thread), so more than a few times their number is
    never a setting anyone means; four times keeps a deliberately oversubscribed measurement possible, and is a
    number of threads every machine can start (10⁹ ran libgomp out of memory, 10⁵ raised a MemoryError). A
    fixed cap (1024, say) would accept 500 threads per CPU on a 2-CPU machine and refuse nothing a typo makes."""
    return THREADS_PER_CPU * (os.cpu_count() or 1)


def choose_threads(given: int | None, option: str = "threads=", cap: int | None = None,
                   cpus: int | None = None, load: float | None | bool = False) -> ThreadChoice:
    """``given`` when given (≥ 1 and at most :func:`most_threads`, else a one-line ValueError naming ``option``),
    else the CPUs free now (:func:`free_cpus`), at most ``cap`` (torch's default thread count). ``cpus`` and ``load`` default to this
    machine's (:func:`cpus_available`, :func:`load_average`)."""
    flag = f"{option}N" if option.endswith("=") else f"{option} N"
    if given is not None:
        if isinstance(given, bool) or not isinstance(given, int) or given < 1:
            raise ValueError(f"{option}{'' if option.endswith('=') else ' '}{given}: must be an integer of at least 1 "
                             f"(the torch threads); give {flag.replace('N', '1')} or leave it out to use the free CPUs")
        if given > most_threads():
            raise ValueError(f"{option}{'' if option.endswith('=') else ' '}{given}: more than {most_threads()}, "
                             f"{THREADS_PER_CPU} times this machine's {os.cpu_count() or 1} CPUs (a thread beyond the "
                             f"CPUs only waits); give {flag.replace('N', str(os.cpu_count() or 1))} or fewer, or leave "
                             "it out to use the free CPUs")
        return ThreadChoice(given, f"{given} thread{'s' if given != 1 else ''} (as given: {flag.replace('N', str(given))})")
    cpus = cpus_available() if cpus is None else cpus
    load = load_average() if load is False else load
    free = free_cpus(cpus, load)
    threads = free if cap is None else max(1, min(free, cap))
    busy = "no load average here" if load is None else f"load average {load:.2f} over the last minute"
    capped = f", torch's default {cap}" if cap is not None and cap < free else ""
    return ThreadChoice(threads, f"{threads} thread{'s' if threads != 1 else ''}: the CPUs free now "
                                 f"({cpus} available, {busy}{capped}); {flag} to choose")


def set_threads(given: int | None, option: str = "threads=") -> ThreadChoice:
    """:func:`choose_threads` with torch's default as the cap, applied to torch (``torch.set_num_threads``)."""
    import torch

    choice = choose_threads(given, option, cap=torch.get_num_threads())
    torch.set_num_threads(choice.threads)
    return choice
