"""kvcert_kernels: Triton kernels for kvcert (the repository's top-level ``kernels/`` folder).

* :func:`certified_decode` — fused decode attention over the compacted cache: the
  Hájek-corrected output, its log-sum-exp, the variance estimate V̂ and the range term
  b̂_c of the certificate in one pass (split-K with an exact merge; grouped-query
  attention; ragged per-head lengths; fp16 / bf16 / fp32 inputs, fp32 accumulation).

The package imports nothing of kvcert (kvcert imports it: :mod:`kvcert.attention`). Its
float64 torch reference is :mod:`kvcert.kernel_reference`, its benchmark ``kvcert bench
kernel`` (:mod:`kvcert.bench.kernel_timing`, GPU timing with ``triton.testing.do_bench``).

See ``kernels/NOTES.md`` for the design and what has been verified where.

Importing the package imports nothing else: its names load :mod:`.certified_decode` (and Triton)
on first use. So a process whose working directory is the checkout — where this folder is
importable as ``kernels``, the name under which transformers probes for the Hugging Face
``kernels`` package — imports it cleanly without Triton installed.
"""

import importlib

__all__ = ["certified_decode", "decode_bytes", "default_num_splits", "interpreting"]


def __getattr__(name: str):
    if name in __all__:
        module = importlib.import_module(".certified_decode", __name__)
        # importing the submodule binds its name on the package to the module: bind the functions over it,
        # as ``from .certified_decode import certified_decode`` would
        globals().update({n: getattr(module, n) for n in __all__})
        return globals()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
