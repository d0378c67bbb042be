"""What NVIDIA/RULER's needle generator does, restated for the golden tests (not a test module;
none of RULER's code is copied).

``scripts/data/synthetic/niah.py``: a sample's length is the tokens of its whole input
(template and chat template included, as ``prepare.py`` hands them in) plus
``tokens_to_generate`` — 128 for the needle tasks in ``constants.py`` — and must stay within
``max_seq_length``; the haystack grows until it would not. A line haystack (``repeat``: the
noise sentence on every line; ``needle``: a random needle on every line) of ``n`` lines takes
the needles at distinct indexes drawn from ``range(n)``, each inserted *before* the line at
its index (inserted from the largest index down): a needle never follows the last haystack
line.
"""

from __future__ import annotations

TOKENS_TO_GENERATE = 128  # constants.py: niah's tokens_to_generate


def official_fits(prompt_tokens: int, max_seq_length: int) -> bool:
    """niah.py's length check: the input's tokens plus the answer's reserve fit the length."""
    return prompt_tokens + TOKENS_TO_GENERATE <= max_seq_length


def official_insert(lines: list[str], needles: list[str], indexes: list[int]) -> list[str]:
    """niah.py's line insertion: ``needles[i]`` before original line ``indexes[i]`` (indexes in
    ``range(len(lines))``), inserted from the largest index down."""
    if any(not 0 <= i < len(lines) for i in indexes):
        raise ValueError("niah.py draws the insertion indexes from range(num_haystack)")
    out = list(lines)
    for index, needle in sorted(zip(indexes, needles), key=lambda pair: pair[0], reverse=True):
        out.insert(index, needle)
    return out
