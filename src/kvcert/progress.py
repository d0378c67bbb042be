"""Progress of long steps: a tqdm bar on a terminal, a plain line every few seconds elsewhere.

Pipeline jobs write to a log that Snakemake also shows on its console (``tee``); there a
redrawn bar is unreadable, so off a terminal :class:`LineProgress` prints one whole line —
done / total, the share, elapsed and remaining time — at most every ``interval`` seconds and
once at the end.

The time left settles before it is shown: none before :data:`SETTLE_ITEMS` items and
:data:`SETTLE_SECONDS` seconds, and never from the first item alone (it carries the warm-up: the first
prefill, lazy initialisation). After that, the items left at the rate of the recent ones: the items done
between the end of the first and the last finished update, over at most the last :data:`RECENT` of them.
Updates that arrive together (a forked generation writes an example's runs one after the other) count as
one: the rate is taken between such bursts, never inside one; a steady stream of quick updates is cut into
bursts of at most :data:`BURST_SPAN` seconds. The tqdm bar shows "?" for its rate and time
left until the estimate settles, then tqdm's own smoothed recent rate.
"""

from __future__ import annotations

import sys
import time
from collections import deque

#: no time-left estimate before this many items are done ...
SETTLE_ITEMS = 3
#: ... and this many seconds have passed
SETTLE_SECONDS = 5.0
#: the rate of the time left: over the last this many updates (bursts)
RECENT = 8
#: updates closer together than this are one burst ...
BURST_SECONDS = 0.25
#: ... that spans at most this long (quick steady updates still give a rate)
BURST_SPAN = 1.0


def settled(n: int, elapsed: float) -> bool:
    """Whether a time-left estimate may be shown after ``n`` items and ``elapsed`` seconds."""
    return n >= SETTLE_ITEMS and elapsed >= SETTLE_SECONDS


class LineProgress:
    """The part of tqdm's interface the steps use (``update``, ``close``), as whole lines on stderr."""

    def __init__(self, total: int, desc: str, unit: str = "it", interval: float = 10.0, stream=None):
        self.total, self.desc, self.unit, self.interval = int(total), desc, unit, float(interval)
        self.stream = stream or sys.stderr
        self.n = 0
        self.start = self.last = time.monotonic()
        # (time, items done) at each burst of updates, the start first; the newest may be a burst under way
        self.recent: deque[tuple[float, int]] = deque([(self.start, 0)], maxlen=RECENT + 2)
        self.burst_start = self.start
        self.closed = False

    def left(self, now: float | None = None) -> float | None:
        """Seconds left at the recent rate; None before the estimate settles (:func:`settled`), before two
        bursts after the first have finished, or when nothing is left."""
        now = time.monotonic() if now is None else now
        if self.n >= self.total or not settled(self.n, now - self.start):
            return None
        finished = list(self.recent)[:-1]  # the newest burst may still be arriving
        if finished[0][1] == 0:
            finished = finished[1:]  # from the end of the first burst: its time is the warm-up's
        if len(finished) < 2:
            return None
        (t0, n0), (t1, n1) = finished[0], finished[-1]
        if n1 <= n0 or t1 <= t0:
            return None
        return (self.total - self.n) * (t1 - t0) / (n1 - n0)

    def _line(self) -> str:
        now = time.monotonic()
        elapsed = now - self.start
        share = self.n / self.total if self.total else 1.0
        left = self.left(now)
        rest = "" if left is None else f", ~{left:.0f} s left"
        return f"{self.desc}: {self.n}/{self.total} {self.unit} ({100 * share:.0f} %), {elapsed:.0f} s{rest}"

    def update(self, n: int = 1) -> None:
        self.n += n
        now = time.monotonic()
        if len(self.recent) > 1 and now - self.recent[-1][0] < BURST_SECONDS and now - self.burst_start < BURST_SPAN:
            self.recent[-1] = (now, self.n)  # the same burst
        else:
            self.recent.append((now, self.n))
            self.burst_start = now
        if now - self.last >= self.interval and self.n < self.total:
            self.last = now
            print(self._line(), file=self.stream, flush=True)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            print(self._line(), file=self.stream, flush=True)


def progress(total: int, desc: str, unit: str = "it", enabled: bool = True):
    """A progress display for ``total`` steps: tqdm on a terminal, :class:`LineProgress` otherwise, or a
    silent one when not ``enabled``."""
    if enabled and not sys.stderr.isatty():
        return LineProgress(total, desc, unit)
    return _settling_tqdm()(total=total, desc=desc, unit=unit, disable=not enabled, file=sys.stderr)


def _settling_tqdm():
    """tqdm with no rate and no time left ("?") until the estimate settles (:func:`settled`)."""
    from tqdm import tqdm

    class SettlingTqdm(tqdm):
        @property
        def format_dict(self):
            d = super().format_dict
            if d.get("total") is not None and not settled(d["n"], d.get("elapsed") or 0.0):
                d["rate"] = 0  # format_meter prints "?" for a rate of 0, and no time left
            return d

    return SettlingTqdm
