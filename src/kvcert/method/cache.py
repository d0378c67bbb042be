"""A compacted KV cache that stores log π per retained token.

:class:`CertifiedCache` is a ``transformers`` :class:`~transformers.Cache` whose layers
(:class:`CompactLayer`) really remove evicted tokens: after compaction a layer holds only
the kept keys and values, so its memory falls with the budget. Per kept token it stores
``log π`` (fp32, the design's one extra scalar: 0 for certain tokens) and two cached
fp32 scalars that only make the certificate cheaper — 1 − π_i and ‖v_i − c‖ — so a
decode step needs no extra pass over the values; per head a value centre c. KV heads may keep different counts: each layer is padded to its longest
head, and padding carries log π = +inf (attention bias −inf), never a full-size mask.
Tokens appended after compaction (decoding, or a question in the streaming condition)
enter with π = 1.

Positions: ``get_seq_length`` reports the number of tokens *seen* (the original,
uncompressed length plus appended tokens), so position ids — and RoPE — continue from
the original context length; the physical number of stored slots is ``stored_length``.

Crops: ``layer.keys = layer.keys[:, :, :n]`` (what kvpress's pipeline does between
questions, with ``n`` a length it read from ``get_seq_length``) removes the tokens
appended after the first ``n`` tokens seen (:meth:`CompactLayer.crop`). A slice cannot say
an ``n`` beyond the stored slots; a full-length slice of a compacted layer therefore crops
back to the layer as its last compaction left it. Any other assignment (a press that
gathers keys, e.g. a kvpress ``ScorerPress``) raises: a kvcert cache is compressed by
kvcert's presses only.

A compaction given the tokens' selection score (:func:`kvcert.method.sketch.sketch_potential`;
the press passes it for randomized samplers) also keeps the layer's eviction sketch
(:mod:`kvcert.method.sketch`): the shadow of the evicted tokens the robust certificate bounds
under later queries, within
:data:`kvcert.method.sketch.SKETCH_FRACTION` of the uncompressed layer's key + value bytes, and
counted in :meth:`CompactLayer.nbytes`.

The cache stores and counts; what happens around attention belongs to the objects it
carries: the armed press (:class:`kvcert.method.schedule.PressSchedule`) compacts each layer
right after that layer's attention in the next forward (question-aware: prefill context +
question with the press armed; streaming: prefill the context armed, then feed the
question), and the recorder (:class:`kvcert.method.recorder.StepRecorder`) keeps the per-step
certificates of layers with a sampled tail and the attention inputs of chosen layers
(for replay).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

from .attention import squared_deviation
from .design import Sample, pack
from .recorder import StepCertificates, StepRecorder
from .schedule import PressSchedule
from .scorers.base import LayerObservation
from .sketch import EvictionSketch, build_sketch, shadow_count


@dataclass
class ScoreMass:
    """The scorer's importance mass of the tokens a layer's compactions decided, per (row, KV head),
    summed over rounds (float64 [B, Hkv]): in all, evicted, and the expected evicted mass
    Σ(1 − π_i) s_i (None for a deterministic sampler). Read by the evicted-score-mass signal."""

    total: torch.Tensor
    evicted: torch.Tensor
    expected: torch.Tensor | None = None

    def add(self, other: "ScoreMass") -> "ScoreMass":
        expected = None if self.expected is None or other.expected is None else self.expected + other.expected
        return ScoreMass(self.total + other.total, self.evicted + other.evicted, expected)


#: a full layer's storage grows to ``GROWTH`` × its capacity plus its reserve. A decode step appends one slot and
#: reads all C of them, so growth only needs to keep the copies rare — one copy of the layer every C/16 appended
#: tokens, 16 slots copied per token against the C it reads — and what it leaves unused small: at most C/16
#: slots plus the reserve (at 1.25 a long generation over a 32k-slot GPU cache could hold 8k slots it never used)
GROWTH = 1.0625


def _held(which: int) -> property:
    """:class:`CompactLayer`'s ``keys`` (0) or ``values`` (1): the slots in use; assigning a tensor goes through
    :meth:`CompactLayer._assign` (a prefix of the stored slots crops them)."""

    def get(self: "CompactLayer") -> torch.Tensor | None:
        return self.__dict__.get("_views", (None, None))[which]

    def put(self: "CompactLayer", tensor: torch.Tensor | None) -> None:
        self._assign(which, tensor)

    return property(get, put)


class CompactLayer(CacheLayerMixin):
    """One layer's compacted cache: keys/values [B, Hkv, stored, D] plus log π and ‖v−c‖²."""

    is_sliding = False
    is_compileable = False
    is_croppable = False

    def __init__(self, reserve: int = 64, growth: float = GROWTH):
        super().__init__()
        self.reserve = reserve
        self.growth = growth
        self.length = 0  # stored slots in use (including padding)
        self.seen = 0  # tokens seen (logical length)
        self._aux_views: tuple | None = None  # log π, 1 − π, ‖v − c‖ of the slots in use, made when first read
        self.centre: torch.Tensor | None = None
        self.kept: torch.Tensor | None = None  # [B, Hkv] real tokens per head
        self.has_tail = False  # some kept token has π < 1
        self.has_padding = False
        self.compactions = 0
        self.compacted_seen = 0  # tokens seen when the last compaction ran
        self.undecided = 0  # trailing slots appended since the last compaction (π = 1, not yet decided)
        self.sketch: EvictionSketch | None = None
        self.score_mass: ScoreMass | None = None  # what compaction evicted of the scorer's importance
        self._k = self._v = self._lp = self._om = self._dev = self._aux = None
        self._len_dev: torch.Tensor | None = None  # the slots in use on the device, once a kernel plan reads them

    # --- storage -------------------------------------------------------------------
    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.device = key_states.device
        b, h, n, d = key_states.shape
        self._allocate(b, h, n + self.reserve, d, key_states.dtype, value_states.shape[-1])
        self.kept = torch.zeros(b, h, dtype=torch.long, device=self.device)
        self.is_initialized = True

    def _allocate(self, b, h, capacity, d, dtype, dv) -> None:
        self._k = torch.empty(b, h, capacity, d, dtype=dtype, device=self.device)
        self._v = torch.empty(b, h, capacity, dv, dtype=dtype, device=self.device)
        # log π, 1 − π and ‖v − c‖ in one [3, B, H, capacity] block: an append zeroes its slot of all three at once
        self._aux = torch.zeros(3, b, h, capacity, dtype=torch.float32, device=self.device)
        self._lp, self._om, self._dev = self._aux.unbind(0)

    def fork(self, end: int) -> "CompactLayer":
        """A batch-1 layer holding the first ``end`` slots of this uncompressed layer (a fork of a shared
        prefill, :mod:`kvcert.method.fork`). Its storage views this layer's (capacity exactly ``end``): compaction
        gathers into new storage and any append reallocates, so this layer is never written."""
        if self.compactions or self.length < end:
            raise ValueError("fork: forks start from an uncompressed layer holding the prefix")
        out = CompactLayer(reserve=self.reserve, growth=self.growth)
        out.device = self.device
        out._k, out._v = self._k[:, :, :end], self._v[:, :, :end]
        out._lp, out._om, out._dev = self._lp[:, :, :end], self._om[:, :, :end], self._dev[:, :, :end]
        out.length = out.seen = out.undecided = end
        out.kept = torch.full_like(self.kept, end)
        out.is_initialized = True
        out._refresh_views()
        return out

    @property
    def capacity(self) -> int:
        return 0 if self._k is None else self._k.shape[2]

    def _refresh_views(self, device_length: bool = True) -> None:
        n = self.length
        self._views = (self._k.narrow(2, 0, n), self._v.narrow(2, 0, n))
        self._aux_views = None  # a full cache's decode step reads log π alone: its views are made when read
        if device_length and self._len_dev is not None:  # the device's count, set to the host's
            self._len_dev.fill_(n)

    def lengths_on_device(self) -> torch.Tensor:
        """The slots in use as an int64 tensor [1] on the layer's device, kept equal to ``length`` from now on:
        what the fused kernel's plans read (:mod:`kvcert.method.decode_plans`), so that a decode step's launch
        does not change with the cache's length."""
        if self._len_dev is None:
            self._len_dev = torch.full((1,), self.length, dtype=torch.int64, device=self.device)
        return self._len_dev

    def _aux_view(self, which: int) -> torch.Tensor | None:
        views = self._aux_views
        if views is None:
            if self._lp is None:
                return None
            n = self.length
            views = self._aux_views = (self._lp.narrow(2, 0, n), self._om.narrow(2, 0, n), self._dev.narrow(2, 0, n))
        return views[which]

    @property
    def log_pi(self) -> torch.Tensor | None:
        """[B, Hkv, slots in use]: log π of each slot (0 for a token kept with certainty, +inf on padding)."""
        return self._aux_view(0)

    @property
    def one_minus(self) -> torch.Tensor | None:
        """[B, Hkv, slots in use]: 1 − π (0 on padding)."""
        return self._aux_view(1)

    @property
    def dev(self) -> torch.Tensor | None:
        """[B, Hkv, slots in use]: ‖v − c‖ about the layer's centre c."""
        return self._aux_view(2)

    # --- keys and values: what the layer holds; assigning a prefix crops ------------------
    keys = _held(0)
    values = _held(1)

    def _assign(self, which: int, tensor: torch.Tensor | None) -> None:
        """``keys`` (0) or ``values`` (1) assigned: a crop when ``tensor`` is a prefix of the stored slots."""
        views = self.__dict__.get("_views", (None, None))
        if views[which] is None or tensor is views[which]:
            if views[which] is None:
                self._views = (tensor, views[1]) if which == 0 else (views[0], tensor)
            return
        storage = self._k if which == 0 else self._v
        prefix = (isinstance(tensor, torch.Tensor) and tensor.data_ptr() == storage.data_ptr()
                  and tensor.stride() == storage.stride() and tensor.shape[:2] == storage.shape[:2]
                  and tensor.shape[3:] == storage.shape[3:] and tensor.shape[2] <= self.length)
        if not prefix:
            raise ValueError(
                f"layer {'keys' if which == 0 else 'values'}: a kvcert CompactLayer can only be cropped "
                "(layer.keys = layer.keys[:, :, :n]); a press that gathers or masks keys (a kvpress press) cannot "
                "compress a CertifiedCache: use a kvcert press (docs/kvpress.md) or a DynamicCache")
        n = tensor.shape[2]
        if which == 1:  # the keys decide a crop; the values' slice must agree with them
            if n < self.length:
                self.crop(n)
            return
        if n < self.length:
            self.crop(n)
        elif self.compactions and self.seen > self.length:  # the slice hides n >= the stored slots
            self.crop(self.compacted_seen)

    def crop(self, seen: int) -> None:
        """Keep the first ``seen`` tokens seen: remove the tokens appended after them. Only tokens
        appended since the last compaction can go (a compaction's decisions cannot be undone)."""
        removed = self.seen - seen
        if removed <= 0:
            return
        if removed > self.undecided:
            raise ValueError(f"crop: the layer keeps {self.seen - self.undecided} decided tokens of the "
                             f"{self.seen} seen; it cannot be cropped to {seen}")
        self.length -= removed
        self.seen = seen
        self.kept -= removed
        self.undecided -= removed
        self._refresh_views()

    def _grow(self, needed: int) -> None:
        old = (self._k, self._v, self._lp, self._om, self._dev)
        b, h, _, d = self._k.shape
        capacity = max(needed, int(self.capacity * self.growth) + self.reserve)
        self._allocate(b, h, capacity, d, self._k.dtype, self._v.shape[-1])
        for new, prev in zip((self._k, self._v, self._lp, self._om, self._dev), old):
            new[:, :, : self.length] = prev[:, :, : self.length]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        """Append new tokens (π = 1) and return the keys and values in use.

        A layer whose slots in use live on the device (:meth:`lengths_on_device`: a kernel plan reads them)
        appends a decode step's token there, at the device's own count, and advances it on the device: the
        step's operations then do not change from one step to the next (what a CUDA graph replays); the
        host's count follows in :meth:`advance`."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        n = key_states.shape[2]
        if self.length + n > self.capacity:
            self._grow(self.length + n)
        if n == 1 and self._len_dev is not None:
            self._append_on_device(key_states, value_states)
            self.advance(1)
            return self.keys, self.values
        end, start = self.length + n, self.length
        # narrow + copy_ / fill_: a decode step appends one slot to five tensors, and Python indexing costs
        # several times the write
        self._k.narrow(2, start, n).copy_(key_states)
        self._v.narrow(2, start, n).copy_(value_states)
        aux = self._aux
        if aux is not None and self._lp._base is aux and self._om._base is aux and self._dev._base is aux:
            aux.narrow(3, start, n).fill_(0.0)  # log π = 0; 1 − π = 0: certain tokens never enter V̂ or b̂
        else:  # the three were replaced one by one (a fork's views, a reorder)
            self._lp.narrow(2, start, n).fill_(0.0)
            self._om.narrow(2, start, n).fill_(0.0)
            self._dev.narrow(2, start, n).fill_(0.0)
        self.length = end
        self.seen += n
        self.kept += n
        self.undecided += n
        self._refresh_views()
        return self.keys, self.values

    def _append_on_device(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        """One token written at the slot the device's count names (π = 1: log π, 1 − π, ‖v − c‖ zeroed there),
        the count and the kept tokens advanced on the device."""
        at = self._len_dev
        self._k.index_copy_(2, at, key_states)
        self._v.index_copy_(2, at, value_states)
        aux = self._aux
        if aux is not None and self._lp._base is aux and self._om._base is aux and self._dev._base is aux:
            aux.index_fill_(3, at, 0.0)
        else:  # the three were replaced one by one (a fork's views, a reorder)
            for t in (self._lp, self._om, self._dev):
                t.index_fill_(2, at, 0.0)
        at.add_(1)
        self.kept += 1

    def set_counts(self, length: int, seen: int, undecided: int) -> None:
        """The host's counts (slots in use, tokens seen, undecided) set back to these, the device's left alone:
        what undoing the host's side of a captured decode step takes (:mod:`kvcert.generation.decode_step`)."""
        self.length, self.seen, self.undecided = length, seen, undecided
        self._refresh_views(device_length=False)

    def advance(self, n: int) -> None:
        """The host's side of ``n`` tokens appended on the device (:meth:`_append_on_device`): the counts of
        slots in use, tokens seen and undecided, and the views of the slots in use. A replayed decode step
        (:mod:`kvcert.generation.decode_step`) runs this alone: its device work is the graph's."""
        self.length += n
        self.seen += n
        self.undecided += n
        self._refresh_views(device_length=False)

    # --- compaction ------------------------------------------------------------------
    def compact(self, sample: Sample, start: int = 0, end: int | None = None,
                potential: torch.Tensor | None = None) -> None:
        """Keep the sampled tokens of slots [start, end); slots outside keep their state.

        ``sample`` is drawn over the segment (positions relative to ``start``); a kept
        token's stored log π becomes old log π + sampled log π (the stages are independent,
        so inclusion probabilities multiply). Storage is rebuilt at the new size.
        ``potential`` [B, Hkv, end − start]: the segment's selection score ψ̃; with it the
        evicted tokens compete for the eviction sketch (with the previous sketch's shadow).
        """
        end = self.length if end is None else end
        b, h = self._k.shape[:2]
        lp_old = self.log_pi.reshape(b * h, self.length)
        valid = torch.isfinite(lp_old)
        seg_mask = sample.kept_mask().reshape(b * h, end - start)
        seg_lp = torch.zeros(b * h, end - start + 1, dtype=torch.float32, device=self.device)
        seg_target = torch.where(sample.valid, sample.indices, torch.full_like(sample.indices, end - start))
        seg_lp.scatter_(-1, seg_target.reshape(b * h, -1), sample.log_pi.reshape(b * h, -1))
        keep = valid.clone()
        keep[:, start:end] &= seg_mask
        evicted = (valid[:, start:end] & ~seg_mask).reshape(b, h, end - start)
        seg_keys, seg_values = self.keys[:, :, start:end], self.values[:, :, start:end]
        lp_new = lp_old.clone()
        lp_new[:, start:end] = lp_new[:, start:end] + seg_lp[:, : end - start]
        # each head's kept slots of [0, end) first, then padding to the longest head, then the
        # slots after the segment (the recent tokens a keep-recent round leaves undecided), at the
        # same offset in every head: the next round's segment starts at one position for all
        packed = pack(keep[:, :end], None, (b * h,))
        tail = self.length - end
        indices = torch.cat([packed.indices, torch.arange(end, self.length, device=self.device).expand(b * h, tail)], -1)
        valid_new = torch.cat([packed.valid, torch.ones(b * h, tail, dtype=torch.bool, device=self.device)], -1)
        k_new = indices.shape[-1]
        indices, valid_new, lengths = indices.reshape(b, h, k_new), valid_new.reshape(b, h, k_new), packed.lengths + tail
        log_pi_new = torch.where(valid_new, lp_new.gather(-1, indices.reshape(b * h, k_new)).reshape(b, h, k_new),
                                 float("inf"))
        idx = indices.unsqueeze(-1)
        keys = self.keys.gather(2, idx.expand(-1, -1, -1, self._k.shape[-1]))
        values = self.values.gather(2, idx.expand(-1, -1, -1, self._v.shape[-1]))
        vmask = valid_new.unsqueeze(-1).to(torch.float32)
        centre = (values.to(torch.float32) * vmask).sum(2) / vmask.sum(2).clamp(min=1)
        self._allocate(b, h, k_new + self.reserve, self._k.shape[-1], keys.dtype, values.shape[-1])
        self._k[:, :, :k_new] = keys
        self._v[:, :, :k_new] = values
        self._lp[:, :, :k_new] = log_pi_new
        self._om[:, :, :k_new] = torch.expm1(log_pi_new).neg_().clamp_(min=0)  # 0 on padding (+inf)
        self._dev[:, :, :k_new] = squared_deviation(values, centre).sqrt_()
        if potential is not None:
            previous = self.sketch
            if previous is not None and self.centre is not None:
                previous = previous.recentre(torch.linalg.vector_norm(centre - self.centre.to(centre.dtype), dim=-1))
            slots = shadow_count(self.seen, self.kv_slot_nbytes(), self._k.shape[-1])
            self.sketch = build_sketch(seg_keys, seg_values, evicted, potential, centre, slots, previous)
        self.centre = centre
        self.undecided = self.length - end
        self.length = k_new
        self.kept = lengths.reshape(b, h)
        self.has_padding = bool((self.kept < k_new).any())
        self.has_tail = bool(((log_pi_new < 0) & valid_new).any())
        self.compactions += 1
        self.compacted_seen = self.seen
        self._refresh_views()

    # --- CacheLayerMixin API ---------------------------------------------------------
    def get_seq_length(self) -> int:
        return self.seen

    def get_mask_sizes(self, query_length) -> tuple[int, int]:
        """(key length, offset) of the attention mask; ``query_length`` is the query's length
        (transformers 5.24) or its cache positions (5.2)."""
        if isinstance(query_length, torch.Tensor):
            query_length = query_length.shape[0]
        return self.length + query_length, 0

    def get_max_length(self) -> int:
        return -1

    def get_max_cache_shape(self) -> int:  # get_max_length under its name in transformers 5.2
        return -1

    def reset(self) -> None:
        self.__dict__.pop("_views", None)
        self.__init__(reserve=self.reserve, growth=self.growth)

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        if not self.is_initialized:
            return
        idx = beam_idx.to(self.device)
        for name in ("_k", "_v", "_lp", "_om", "_dev"):
            setattr(self, name, getattr(self, name).index_select(0, idx))
        self.kept = self.kept.index_select(0, idx)
        if self.centre is not None:
            self.centre = self.centre.index_select(0, idx)
        if self.sketch is not None:
            self.sketch = self.sketch.index_select(idx)
        if self.score_mass is not None:
            m = self.score_mass
            self.score_mass = ScoreMass(m.total.index_select(0, idx), m.evicted.index_select(0, idx),
                                        None if m.expected is None else m.expected.index_select(0, idx))
        self._refresh_views()

    @property
    def needs_bias(self) -> bool:
        """Whether attention must add −log π (a sampled tail, or padding between heads)."""
        return self.has_tail or self.has_padding

    def kv_slot_nbytes(self) -> int:
        """Bytes of one slot's key and value (one KV head)."""
        return self._k.shape[-1] * self._k.element_size() + self._v.shape[-1] * self._v.element_size()

    def slot_nbytes(self) -> int:
        """Bytes of one slot (one KV head): key, value, and log π, 1 − π, ‖v − c‖ in fp32."""
        return self.kv_slot_nbytes() + 12

    def nbytes(self) -> int:
        """Bytes of the slots in use: keys, values, log π, 1 − π and ‖v − c‖ (padding included), and the sketch."""
        if not self.is_initialized:
            return 0
        return self._k.shape[0] * self._k.shape[1] * self.length * self.slot_nbytes() + self.sketch_nbytes()

    def sketch_nbytes(self) -> int:
        """Bytes of the eviction sketch (0 without one)."""
        return 0 if self.sketch is None else self.sketch.nbytes()

    def kv_nbytes(self) -> int:
        """Bytes of keys and values alone in the slots in use."""
        if not self.is_initialized:
            return 0
        return self._k.shape[0] * self._k.shape[1] * self.length * self.kv_slot_nbytes()


class CertifiedCache(Cache):
    """KV cache with compaction and per-token log π; it stores and counts bytes.

    What happens around attention belongs to two objects it carries: ``schedule``, the
    armed press (:class:`~kvcert.method.schedule.PressSchedule`: when a press compresses, which
    slots it decides), and ``recorder`` (:class:`~kvcert.method.recorder.StepRecorder`: the
    per-forward certificates, attention entropy and captured attention inputs).

    press: an :class:`~kvcert.method.press.EvictionPress` armed for the first forward that
        prefills more than one token (question-aware use with ``model.generate``).
    record_certificates: record V̂ and b̂_c of every forward over a layer with a sampled
        tail (in ``step_log``, one :class:`~kvcert.method.recorder.StepCertificates` per forward).
    capture_layers: layer indices whose attention inputs are kept after each forward
        (``captured[layer]``, a :class:`~kvcert.method.scorers.base.LayerObservation`).
    record_entropy: record the entropy of the attention weights of every forward over a
        compressed layer (a comparison signal), in the same ``step_log``.
    schedule: instead of ``press``, the schedule itself (:class:`kvcert.method.fork.ForkSchedule`).
    reserve: spare slots each layer allocates past the prompt and past each compaction, for the tokens
        appended later (the generation path passes its ``max_new_tokens``, and the question a streaming
        run feeds after compression); a layer that outgrows them grows by ``GROWTH``.
    static_decode: on a device the fused kernel serves, every decode step takes the kernel's plans — an
        uncompressed layer too, which otherwise takes PyTorch's SDPA — so that each step launches the same
        work at the same addresses (:mod:`kvcert.generation.decode_step` captures it in a CUDA graph).
    """

    def __init__(self, press=None, record_certificates: bool = True, capture_layers=(), reserve: int = 64,
                 record_entropy: bool = False, schedule=None, static_decode: bool = False):
        super().__init__(layer_class_to_replicate=lambda: CompactLayer(reserve=reserve))
        self.static_decode = static_decode
        self.schedule = PressSchedule(press) if schedule is None else schedule
        self.recorder = StepRecorder(record_certificates, record_entropy, capture_layers, steps_hint=reserve + 4)
        self.peak_nbytes = 0

    # --- the public API of the schedule and the recorder -------------------------------
    def arm(self, press, keep_recent: int | None = None) -> None:
        """Arm ``press`` for the next forward (:meth:`kvcert.method.schedule.PressSchedule.arm`)."""
        self.schedule.arm(press, keep_recent)

    @property
    def armed(self) -> bool:
        return self.schedule.armed

    @property
    def step_log(self) -> list[StepCertificates]:
        return self.recorder.step_log

    @property
    def captured(self) -> dict[int, LayerObservation]:
        return self.recorder.captured

    def pop_steps(self) -> list[StepCertificates]:
        return self.recorder.pop_steps()

    # --- hooks used by the attention function ----------------------------------------
    def begin_forward(self) -> None:
        self.recorder.begin_forward()

    def end_forward(self) -> None:
        self.recorder.end_forward()
        self.schedule.end_forward()
        self.peak_nbytes = max(self.peak_nbytes, self.nbytes())

    def after_attention(self, module, query: torch.Tensor, scaling: float) -> None:
        """Called by the attention function once a layer's attention is computed: the recorder
        captures the layer's inputs, the schedule compresses the layer."""
        layer_idx = module.layer_idx
        fires = self.schedule.fires(query.shape[2])
        if not (fires or self.recorder.captures(layer_idx)):
            return
        layer = self.layers[layer_idx]
        num_layers = getattr(module.config, "num_hidden_layers", len(self.layers))
        inputs = getattr(module, "_kvcert_inputs", None) or (None, None)
        obs = LayerObservation(
            query=query, key=layer.keys, value=layer.values,
            log_pi=layer.log_pi if layer.needs_bias else None,
            scaling=scaling, layer_idx=layer_idx, num_layers=num_layers,
            module=module, hidden_states=inputs[0], position_embeddings=inputs[1],
        )
        self.recorder.capture(obs)
        if fires:
            self.peak_nbytes = max(self.peak_nbytes, self.nbytes())  # this layer is still full here
            self.schedule.after_attention(layer, obs)

    # --- rewinding: what a benchmark decodes, dropped again ----------------------------
    def snapshot(self) -> tuple:
        """A mark of what every layer holds now (tokens seen, compactions) for :meth:`restore`."""
        return tuple((layer.seen, layer.compactions) for layer in self.layers)

    def restore(self, mark: tuple) -> None:
        """Drop the tokens appended since ``mark`` (:meth:`snapshot`) and the steps recorded since: each layer
        is cropped back (:meth:`CompactLayer.crop`). A layer compacted since cannot be rewound (its evictions
        are not undone): refused."""
        if len(mark) != len(self.layers):
            raise ValueError(f"restore: the mark holds {len(mark)} layers, the cache {len(self.layers)}")
        for i, (layer, (seen, compactions)) in enumerate(zip(self.layers, mark)):
            if layer.compactions != compactions:
                raise ValueError(f"restore: layer {i} was compacted after the mark; only appended tokens are dropped")
            layer.crop(seen)
        self.recorder.clear()

    # --- reporting -------------------------------------------------------------------
    def nbytes(self) -> int:
        return sum(layer.nbytes() for layer in self.layers if isinstance(layer, CompactLayer))

    def allocated_tensors(self) -> list[torch.Tensor]:
        """Every tensor the layers hold (keys, values, log π, 1 − π, ‖v − c‖ with their spare slots, the kept
        counts), the sketch apart: what a memory comparison counts."""
        return [t for layer in self.layers if isinstance(layer, CompactLayer)
                for t in (layer._k, layer._v, layer._lp, layer._om, layer._dev, layer.kept) if t is not None]

    def kv_nbytes(self) -> int:
        return sum(layer.kv_nbytes() for layer in self.layers if isinstance(layer, CompactLayer))

    def sketch_nbytes(self) -> int:
        return sum(layer.sketch_nbytes() for layer in self.layers if isinstance(layer, CompactLayer))

    def kept_fraction(self) -> list[float]:
        """Per layer: real kept tokens / tokens seen, averaged over batch and heads."""
        out = []
        for layer in self.layers:
            if isinstance(layer, CompactLayer) and layer.is_initialized and layer.seen:
                out.append(float(layer.kept.float().mean()) / layer.seen)
        return out

