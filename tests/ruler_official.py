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
RULER_NOISE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."


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


# ---------------------------------------------------------------- the other synthetic tasks (restated)
# constants.py's templates and answer prefixes, and synthetic.yaml's arguments, as RULER writes them.
TEMPLATES = {
    "niah": ("Some special magic {type_needle_v} are hidden within the following text. Make sure to memorize it. I "
             "will quiz you about the {type_needle_v} afterwards.\n{context}\nWhat are all the special magic "
             "{type_needle_v} for {query} mentioned in the provided text?",
             " The special magic {type_needle_v} for {query} mentioned in the provided text are"),
    "variable_tracking": ("Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n"
                          "{context}\nQuestion: Find all variables that are assigned the value {query} in the text above.",
                          " Answer: According to the chain(s) of variable assignment in the text above, {num_v} "
                          "variables are assigned the value {query}, they are: "),
    "common_words_extraction": ("Below is a numbered list of words. In these words, some appear more often than "
                                "others. Memorize the ones that appear most often.\n{context}\nQuestion: What are "
                                "the 10 most common words in the above list?",
                                " Answer: The top 10 words that appear most often in the list are:"),
    "freq_words_extraction": ("Read the following coded text and track the frequency of each coded word. Find the "
                              "three most frequently appeared coded words. {context}\nQuestion: Do not provide any "
                              "explanation. Please ignore the dots '....'. What are the three most frequently "
                              "appeared words in the above coded text?",
                              " Answer: According to the coded text above, the three most frequently appeared words "
                              "are:"),
}
TOKENS = {"niah": 128, "variable_tracking": 30, "common_words_extraction": 120, "freq_words_extraction": 50}
SYNTHETIC_YAML = {
    "niah_single_1": ("niah", dict(type_haystack="noise", type_needle_k="words", type_needle_v="numbers", k=1, v=1, q=1)),
    "niah_single_2": ("niah", dict(type_haystack="essay", type_needle_k="words", type_needle_v="numbers", k=1, v=1, q=1)),
    "niah_single_3": ("niah", dict(type_haystack="essay", type_needle_k="words", type_needle_v="uuids", k=1, v=1, q=1)),
    "niah_multikey_1": ("niah", dict(type_haystack="essay", type_needle_k="words", type_needle_v="numbers", k=4, v=1, q=1)),
    "niah_multikey_2": ("niah", dict(type_haystack="needle", type_needle_k="words", type_needle_v="numbers", k=1, v=1, q=1)),
    "niah_multikey_3": ("niah", dict(type_haystack="needle", type_needle_k="uuids", type_needle_v="uuids", k=1, v=1, q=1)),
    "niah_multivalue": ("niah", dict(type_haystack="essay", type_needle_k="words", type_needle_v="numbers", k=1, v=4, q=1)),
    "niah_multiquery": ("niah", dict(type_haystack="essay", type_needle_k="words", type_needle_v="numbers", k=1, v=1, q=4)),
    "vt": ("variable_tracking", dict(type_haystack="noise", num_chains=1, num_hops=4)),
    "cwe": ("common_words_extraction", dict(freq_cw=30, freq_ucw=3, num_cw=10)),
    "fwe": ("freq_words_extraction", dict(alpha=2.0)),
}


def official_input(task: str, singular: bool = False, **fields) -> tuple[str, str]:
    """prepare.py with the ``base`` model template: the template and the answer prefix joined, niah.py's singular
    rewrite where it applies, formatted; then the answer prefix cut off where the scripts cut it (``rfind`` of its
    first 10 characters): (the input, the answer prefix)."""
    template = TEMPLATES[task][0] + TEMPLATES[task][1]
    if singular:
        template = template.replace('Some', 'A').replace('are all', 'is').replace('are', 'is').replace('answers', 'answer')
    text = template.format(**fields)
    cut = text.rfind(TEMPLATES[task][1][:10])
    return text[:cut], text[cut:]


def official_niah_query(queries: list[str]) -> str:
    return ', '.join(queries[:-1]) + ', and ' + queries[-1] if len(queries) > 1 else queries[0]


def official_vt_insert(num_noises: int, chains: list[list[str]], positions: list[list[int]], noise: str) -> list[str]:
    """variable_tracking.py's noise haystack, given each chain's drawn positions (``random.sample`` of
    ``range(len(sentences))``, sorted)."""
    sentences = [noise] * num_noises
    for chain, drawn in zip(chains, positions):
        assert len(set(drawn)) == len(chain) and all(0 <= p < len(sentences) for p in drawn)
        for insert_pi, j in zip(sorted(drawn), range(len(chain))):
            sentences.insert(insert_pi + j, chain[j])
    return sentences


def unshuffle(shuffled: list, seed: int) -> list:
    """The list that ``random.Random(seed).shuffle`` turned into ``shuffled`` (RULER's fixed-seed shuffles: the
    permutation depends only on the length)."""
    import random

    order = list(range(len(shuffled)))
    random.Random(seed).shuffle(order)
    before = [None] * len(shuffled)
    for i, source in enumerate(order):
        before[source] = shuffled[i]
    return before


def official_numbered(words: list[str]) -> str:
    return ' '.join([f"{i + 1}. {word}" for i, word in enumerate(words)])


def official_fwe_counts(num_words: int, size: int, alpha: float = 2.0) -> list[int]:
    """gen_text's counts: ``(num_words * k**-alpha / zeta(alpha)).astype(int)`` for k = 1..size (zeta(2) = π²/6)."""
    import math

    assert alpha == 2.0
    return [int(num_words * (k ** -alpha) / (math.pi ** 2 / 6)) for k in range(1, size + 1)]


def string_match_all(preds, refs):
    """eval/synthetic/constants.py's metric over a task: the mean share of each sample's references found in
    its prediction (case-folded), × 100, rounded to 2 places."""
    shares = [sum(r.lower() in pred.lower() for r in ref) / len(ref) for pred, ref in zip(preds, refs)]
    return round(100 * sum(shares) / len(preds), 2)


def string_match_part(preds, refs):
    """The same with a sample counting 1 when any of its references is found."""
    hits = [float(any(r.lower() in pred.lower() for r in ref)) for pred, ref in zip(preds, refs)]
    return round(100 * sum(hits) / len(preds), 2)
