"""When a press compresses, and which slots it decides: the armed press.

In the way a kvpress press owns its forward hook, a :class:`PressSchedule` owns a press's
schedule: it is armed for the next forward (:meth:`~PressSchedule.arm`), and the attention
hook (:func:`kvcert.method.integration.kvcert_attention_forward`, through
:meth:`kvcert.method.cache.CertifiedCache.after_attention`) hands it each layer right after that
layer's attention in a forward that prefills more than one token. It decides which slots
the round decides (all of them; or, with ``keep_recent``, those appended since the last
round except the recent window), what the design's sinks and window protect in that
segment (:func:`segment_design`), counts the rounds (the seed of each round's draws), and
disarms once the forward is over. The press itself (:class:`kvcert.method.press.EvictionPress`)
scores, allocates, samples and compacts the segment it is given.

:class:`ForkSchedule` is the other schedule: the variants forked from one prefill
(:mod:`kvcert.method.fork`) each compress their own copy of the layer.
"""

from __future__ import annotations

from dataclasses import replace

from .design import RetentionDesign


def segment_design(design: RetentionDesign, start: int, end: int, length: int) -> RetentionDesign:
    """Sinks only protect a segment that starts the sequence; the window only one that ends it."""
    return replace(design, sinks=design.sinks if start == 0 else 0, window=design.window if end == length else 0)


class PressSchedule:
    """An :class:`~kvcert.method.press.EvictionPress` armed for the next multi-token forward.

    press: armed from the start (question-aware use with ``model.generate``: the first
    forward that prefills more than one token compresses every layer).
    """

    def __init__(self, press=None):
        self.press = press
        self.keep_recent: int | None = None
        self.fired = False
        self.rounds = 0

    def arm(self, press, keep_recent: int | None = None) -> None:
        """Compact every layer after its attention in the next forward.

        By default all stored slots are (re)decided, sinks and window included. With
        ``keep_recent`` (streaming multi-turn), only the slots appended since the last
        compaction are decided, except the last ``keep_recent`` tokens, which stay
        certain until a later round; older slots keep their π.
        """
        self.press = press
        self.keep_recent = keep_recent

    def arm_chunk(self, press) -> None:
        """Arm for one chunk of a streamed context: each token is decided once, when it leaves the
        press's recent window (its design's ``window``), its π fixed from then on."""
        self.arm(press, keep_recent=None if press is None else press.design.window)

    @property
    def armed(self) -> bool:
        return self.press is not None

    def fires(self, num_queries: int) -> bool:
        """Whether this forward's layers are compressed after their attention."""
        return self.press is not None and num_queries > 1

    def segment(self, layer) -> tuple[int, int]:
        """The slots [start, end) of ``layer`` this round decides."""
        start, end = 0, layer.length
        if self.keep_recent is not None:
            start = layer.length - layer.undecided
            end = max(start, layer.length - self.keep_recent)
        return start, end

    def after_attention(self, layer, obs) -> None:
        """Compress ``layer`` (its observation ``obs``) once its attention is computed."""
        start, end = self.segment(layer)
        if end > start:
            design = segment_design(self.press.design, start, end, layer.length)
            self.press.compress_layer(layer, obs, start=start, end=end, round_index=self.rounds, design=design)
        self.fired = True

    def end_forward(self) -> None:
        """A press fires for one forward: disarm after it, counting the round."""
        if self.press is not None and self.fired:
            self.press = None
            self.keep_recent = None
            self.rounds += 1
        self.fired = False
