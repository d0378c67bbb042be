"""A cache budget's two conventions, without torch: kvcert's fraction *kept* (or a token
count) and kvpress's ``compression_ratio``, the fraction *removed*; and how a fraction
rounds to a token count (:func:`kvcert.checks.resolve_budget` applies it to tensors)."""

from __future__ import annotations

from numbers import Real

#: how a fractional budget becomes a token count: kvcert's nearest integer, or kvpress's
#: ``int(N · (1 − compression_ratio))``
ROUNDINGS = ("round", "floor")


def kept_budget(budget, compression_ratio, default=None):
    """The cache budget from ``budget`` (kvcert's convention: the fraction *kept*, or a
    token count) or ``compression_ratio`` (kvpress's: the fraction *removed*, so
    ``budget = 1 − compression_ratio``); at most one of the two, else ``default``."""
    if compression_ratio is None:
        return default if budget is None else budget
    if budget is not None:
        raise ValueError("budget: give budget (fraction kept) or compression_ratio (fraction removed), not both")
    if isinstance(compression_ratio, bool) or not isinstance(compression_ratio, Real) \
            or not (0.0 <= float(compression_ratio) < 1.0):
        raise ValueError(f"compression_ratio: the fraction removed must lie in [0, 1), got {compression_ratio!r}")
    return 1.0 - float(compression_ratio)
