"""Progress of long steps: a tqdm bar on a terminal, a plain line every few seconds elsewhere.

Pipeline jobs write to a log that Snakemake also shows on its console (``tee``); there a
redrawn bar is unreadable, so off a terminal :class:`LineProgress` prints one whole line —
done / total, the share, elapsed and remaining time — at most every ``interval`` seconds and
once at the end.
"""

from __future__ import annotations

import sys
import time


class LineProgress:
    """The part of tqdm's interface the steps use (``update``, ``close``), as whole lines on stderr."""

    def __init__(self, total: int, desc: str, unit: str = "it", interval: float = 10.0, stream=None):
        self.total, self.desc, self.unit, self.interval = int(total), desc, unit, float(interval)
        self.stream = stream or sys.stderr
        self.n = 0
        self.start = self.last = time.monotonic()
        self.closed = False

    def _line(self) -> str:
        elapsed = time.monotonic() - self.start
        share = self.n / self.total if self.total else 1.0
        left = elapsed / share - elapsed if share > 0 else float("nan")
        rest = "" if self.n >= self.total or left != left else f", ~{left:.0f} s left"
        return f"{self.desc}: {self.n}/{self.total} {self.unit} ({100 * share:.0f} %), {elapsed:.0f} s{rest}"

    def update(self, n: int = 1) -> None:
        self.n += n
        now = time.monotonic()
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
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit=unit, disable=not enabled, file=sys.stderr)
