"""kvcert_kernels: Triton kernels for kvcert (the repository's ``kernels/kvcert_kernels/`` folder).

* :func:`certified_decode` — fused decode attention over the compacted cache: the
  Hájek-corrected output, its log-sum-exp, the variance estimate V̂ and the range term
  b̂_c of the certificate in one pass (split-K with an exact merge; grouped-query
  attention; ragged per-head lengths; fp16 / bf16 / fp32 inputs, fp32 accumulation);
* :func:`wave_efficiency` — programs / (waves × resident program slots) of its grid under the split policy
  (or a given split count) on a GPU of so many multiprocessors.

The package imports nothing of kvcert (kvcert imports it: :mod:`kvcert.method.attention`). Its
float64 torch reference is :mod:`kvcert.method.kernel_reference`, its benchmark ``kvcert bench
kernel`` (:mod:`kvcert.bench.kernel_timing`, GPU timing by CUDA-graph replay).

See ``kernels/NOTES.md`` for the design and what has been verified where.

Without Triton (the CPU install: Triton is the ``gpu`` extra) the package still imports, and its
functions say how to get Triton when called.
"""

__all__ = ["certified_decode", "decode_bytes", "default_num_splits", "interpreting", "wave_efficiency"]

try:
    from .certified_decode import certified_decode, decode_bytes, default_num_splits, interpreting, wave_efficiency
except ImportError as _missing:  # no Triton here
    _reason = f"kvcert_kernels needs Triton ({_missing}): pip install 'kvcert[gpu]' (or pip install triton)"

    def _unavailable(*args, **kwargs):
        raise ImportError(_reason)

    certified_decode = decode_bytes = default_num_splits = interpreting = wave_efficiency = _unavailable
