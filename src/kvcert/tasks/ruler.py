"""RULER's synthetic tasks (NVIDIA/RULER, ``scripts/synthetic.yaml``), generated as its scripts
generate them: the eight needle tasks (``niah.py``), variable tracking (``variable_tracking.py``),
common-word extraction (``common_words_extraction.py``) and frequent-word extraction
(``freq_words_extraction.py``). The question-answering tasks (``qa_1``, ``qa_2``) need SQuAD and
HotpotQA and are not here.

Each task is registered as ``ruler_<name>`` (:data:`RULER_TASKS`: ``niah_single_1`` …
``niah_multiquery``, ``vt``, ``cwe``, ``fwe``) with RULER's template, answer prefix and answer
reserve (``constants.py``'s ``tokens_to_generate``: 128 for the needles, 30 for vt, 120 for
cwe, 50 for fwe) and its metric, ``string_match_all`` (``scripts/eval/synthetic/constants.py``). The table
(:data:`RULER_TASKS`, :data:`TOKENS_TO_GENERATE`) is :mod:`kvcert.config.task_table`'s, which derives each task's
config from it.
A prompt is RULER's input: the template's text up to ``{context}`` and the generated context
are the record's context, the template's line after it (``What are all the special magic …``,
``Question: …``) its question (separator: RULER's one newline), and RULER's answer prefix follows
the chat template's generation prompt, as RULER puts it after its model template. The length is
RULER's: the whole prompt plus the answer reserve within the nominal length (the haystack, noise,
chains or word count grows to the largest that fits, :func:`~kvcert.tasks.lengths.fit_filler`).

What follows RULER's code, task by task:

- **niah**: keys drawn from RULER's key kinds — ``words`` (an ``adjective-noun`` pair, as RULER
  forms them from wonderwords' lists; here from the lists embedded in :mod:`kvcert.tasks.wordlists`:
  :data:`~kvcert.tasks.wordlists.KEY_ADJECTIVES` × :data:`~kvcert.tasks.wordlists.NEEDLE_KEYS`),
  ``uuids`` (``uuid.UUID(int=getrandbits(128), version=4)``); values ``numbers`` (7 digits) or
  ``uuids``; ``num_needle_k = max(k, q)`` keys with ``num_needle_v`` values each, the needles
  ("One of the special magic {numbers|uuids} for KEY is: VALUE.") shuffled by
  ``random.Random(seed)`` (RULER's fixed-seed shuffle); the ``noise`` haystack (RULER's repeated
  sentence on every line) or the ``needle`` haystack (a random needle on every line); the
  needles inserted at distinct line indexes drawn from ``range(lines)`` (``random.sample``),
  each before the haystack line at its index, from the largest index down — so no two needles
  are adjacent or share a line, and none follows the last line; ``q`` of the keys queried
  (joined "a, b, and c"), the answers their values; RULER's singular rewrite of the template
  ("Some" → "A", "are all" → "is", "are" → "is", "numbers" → "number") where one value of one key
  is asked for.
- **essay haystacks**: RULER's ``niah_single_2``, ``niah_single_3``, ``niah_multikey_1``,
  ``niah_multivalue`` and ``niah_multiquery`` use Paul Graham's essays, downloaded text that kvcert
  does not ship; here they use Python's bundled prose in their place (:mod:`kvcert.tasks.prose`:
  the language reference's text of ``pydoc_data.topics``), one sentence per line, a passage of
  consecutive sentences per prompt from an offset drawn from the example's ``haystack`` stream,
  the needles inserted between its lines as between noise lines. The record's metadata says so
  (``ruler_haystack: essay``, ``haystack: prose``), and a manifest's seal records the prose's
  digest (the text differs between Python versions).
- **keys**: a prompt's keys are distinct, and a haystack needle never carries one of them (RULER
  draws them independently; a clash — about one prompt in sixty at 4k: 167 haystack needles,
  9,600 keys — would make the question ambiguous).
- **vt**: one chain of ``num_hops + 1`` five-letter variables ("VAR ABCDE = 12345", then "VAR
  FGHIJ = VAR ABCDE " …), inserted into the noise lines at sorted distinct positions (each item
  after the one before it, a noise line between), the question about the chain's value, the
  answers its variables; RULER's in-context example first: a chain of three-letter variables with
  the value 12345 in a haystack of at most 500 tokens, its answer written after its answer prefix,
  then its variables and value replaced by random ones for each prompt (``randomize_icl``).
- **cwe**: a numbered list ("1. word 2. word …") of 10 common words repeated ``freq_cw`` (30)
  times and the others ``freq_ucw`` (3) times — 6 and 1 below 4096 tokens, as RULER does —,
  shuffled by ``random.Random(seed)``; one solved example first (40 words, 10 × 10 and 30 × 3; 20
  words, 3 and 1 below 4096); the answers the 10 common words. The words come from the embedded
  pool :data:`WORDS` (every word of :mod:`kvcert.tasks.wordlists`, 477) instead of wonderwords' 9k;
  where a prompt needs more distinct words (past about 12k tokens: SmolLM2's tokenizer takes 265
  at 8k), the rest are adjective-noun keys (9,600; RULER draws from a second, downloaded English
  list beyond wonderwords'); ``keys_as_words`` in the metadata counts them. The common words are
  always embedded words.
- **fwe**: a coded vocabulary of ``(length − 50) // 50`` random six-letter words, shuffled by
  ``random.Random(seed)``, the first replaced by "..."; word ``k`` repeated
  ``int(n · k^−α / ζ(α))`` times (α = 2), the whole shuffled by ``random.Random(seed)``; the
  answers the three most frequent words after "...". RULER grows ``n`` in steps of a 32nd of the
  length; here ``n`` is the largest that fits.

Records are seeded by (seed, task, index) (:func:`~kvcert.tasks.sampling.example_rng`); RULER's
fixed-seed shuffles use the data seed.
"""

from __future__ import annotations

import math
import random
import string
import uuid
from typing import Any, Callable, Sequence

import kvcert.tasks.wordlists as wordlists
from kvcert.config.task_table import RULER_PREFIX as PREFIX, RULER_TASKS, TOKENS_TO_GENERATE, RulerTask
from kvcert.tasks.lengths import LengthTooShort, fit_filler
from kvcert.tasks.prompting import measured
from kvcert.tasks.prose import ProseHaystack
from kvcert.tasks.records import TaskRecord
from kvcert.tasks.sampling import example_rng, generator as examples_of

#: RULER's templates and answer prefixes (scripts/data/synthetic/constants.py)
TEMPLATES: dict[str, tuple[str, str]] = {
    "niah": (
        "Some special magic {type_needle_v} are hidden within the following text. Make sure to memorize it. "
        "I will quiz you about the {type_needle_v} afterwards.\n{context}\nWhat are all the special magic "
        "{type_needle_v} for {query} mentioned in the provided text?",
        " The special magic {type_needle_v} for {query} mentioned in the provided text are",
    ),
    "variable_tracking": (
        "Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n{context}\n"
        "Question: Find all variables that are assigned the value {query} in the text above.",
        " Answer: According to the chain(s) of variable assignment in the text above, {num_v} variables are "
        "assigned the value {query}, they are: ",
    ),
    "common_words_extraction": (
        "Below is a numbered list of words. In these words, some appear more often than others. Memorize the "
        "ones that appear most often.\n{context}\nQuestion: What are the 10 most common words in the above list?",
        " Answer: The top 10 words that appear most often in the list are:",
    ),
    "freq_words_extraction": (
        "Read the following coded text and track the frequency of each coded word. Find the three most "
        "frequently appeared coded words. {context}\nQuestion: Do not provide any explanation. Please ignore "
        "the dots '....'. What are the three most frequently appeared words in the above coded text?",
        " Answer: According to the coded text above, the three most frequently appeared words are:",
    ),
}
NOISE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
NEEDLE = "One of the special magic {type_needle_v} for {key} is: {value}."
SEPARATOR = "\n"
_CONTEXT = "\x00KVCERT-CONTEXT\x00"
DEFAULT_LENGTH = 4096  # RULER's shortest standard length (kvpress's RULER)


#: RULER's ``words`` keys: adjective-noun pairs, sorted (niah.py sorts its set of them)
KEY_WORDS: tuple[str, ...] = tuple(sorted({f"{a}-{n}" for a in wordlists.KEY_ADJECTIVES for n in wordlists.NEEDLE_KEYS}))


def _pool() -> tuple[str, ...]:
    words: set[str] = set()
    for value in vars(wordlists).values():
        if isinstance(value, tuple):
            words |= {w.lower() for w in value if isinstance(w, str) and w.isalpha()}
    return tuple(sorted(words))


#: cwe's words: every word of the embedded lists, lower-cased, sorted (RULER: wonderwords' nouns,
#: adjectives and verbs, sorted, then shuffled by random.Random(seed))
WORDS: tuple[str, ...] = _pool()


# ------------------------------------------------------------------ metrics (eval/synthetic/constants.py)

def string_match_all(prediction: str, references: Sequence[str]) -> float:
    """One sample of RULER's ``string_match_all``: the share of references in the prediction (case-folded)."""
    from kvcert.tasks.metrics import string_match_all as match_all

    return match_all(prediction, list(references))


def string_match_part(prediction: str, references: Sequence[str]) -> float:
    """One sample of RULER's ``string_match_part``: 1 if any reference is in the prediction (case-folded)."""
    from kvcert.tasks.metrics import string_match_part as match_part

    return match_part(prediction, list(references))


def postprocess(prediction: str) -> str:
    """RULER's ``postprocess_pred``: stripped, every control character a newline, stripped again."""
    import re

    return re.sub(r"[\x00-\x1f]", "\n", prediction.strip()).strip()


def task_score(predictions: Sequence[str], references: Sequence[Sequence[str]], metric: str = "string_match_all") -> float:
    """A task's score as RULER's evaluate.py reports it: ``round(100 · mean, 2)`` of the metric over the
    post-processed predictions."""
    if not predictions or len(predictions) != len(references):
        raise ValueError(f"{len(predictions)} predictions for {len(references)} reference lists")
    fn = string_match_part if metric == "string_match_part" else string_match_all
    return round(100 * sum(fn(postprocess(p), r) for p, r in zip(predictions, references)) / len(predictions), 2)


# ------------------------------------------------------------------ the template, split into a record

def _singular(text: str) -> str:
    """niah.py's rewrite of its template where one value of one key is asked for."""
    return text.replace("Some", "A").replace("are all", "is").replace("are", "is").replace("answers", "answer")


def template_parts(task: str, singular: bool = False, **fields: Any) -> tuple[str, str, str]:
    """(the template's text before ``{context}``, the question after it, the answer prefix), formatted
    with ``fields``; the question follows the context after :data:`SEPARATOR`."""
    template, prefix = TEMPLATES[task]
    if singular:
        template, prefix = _singular(template), _singular(prefix)
    head, tail = template.format(context=_CONTEXT, **fields).split(_CONTEXT)
    if not tail.startswith(SEPARATOR):
        raise AssertionError(f"{task}: the template's question does not follow the context on a new line")
    return head, tail[len(SEPARATOR):], prefix.format(**fields)


def _record(tokenizer: Any, target_tokens: int, spec: RulerTask, seed: int, index: int,
            make_context: Callable[[int], str], question: str, prefix: str,
            answers: list[str] | Callable[[int], list[str]], metadata: dict | Callable[[int], dict],
            max_units: int = 1 << 20, what: str = "filler") -> TaskRecord:
    """The record of the largest filler count whose prompt fits; ``answers`` and ``metadata`` may depend on that
    count (callables of it)."""
    reserve = TOKENS_TO_GENERATE[spec.task]
    if reserve >= target_tokens:
        raise LengthTooShort(f"RULER keeps {reserve} tokens of the length for {spec.name}'s answer", reserve + 1,
                             target_tokens)
    try:
        context, units, _ = fit_filler(tokenizer, make_context, question, target_tokens - reserve,
                                       max_units=max_units, separator=SEPARATOR, answer_prefix=prefix)
    except ValueError as error:
        if "could not reach" in str(error):
            raise ValueError(f"{spec.registered}: {target_tokens} tokens need more than the {max_units} {what} "
                             "kvcert embeds; give a shorter length") from None
        raise
    answers = answers(units) if callable(answers) else answers
    metadata = metadata(units) if callable(metadata) else metadata
    record = TaskRecord(id=f"{spec.registered}-s{seed}-t{target_tokens}-{index}", task=spec.registered,
                        context=context, question=question, answers=answers, separator=SEPARATOR,
                        answer_prefix=prefix,
                        metadata={"target_tokens": target_tokens, "answer_tokens": reserve, "max_new_tokens": reserve,
                                  "ruler_task": spec.name, "filler_units": units, **metadata})
    return measured(tokenizer, record)


def _positions_rng(spec: RulerTask, seed: int, index: int, n: int) -> random.Random:
    """The draws that depend on the haystack's size (RULER draws them anew at each size it tries)."""
    return random.Random(f"kvcert:{spec.registered}:positions:{seed}:{index}:{n}")


# ------------------------------------------------------------------ niah

def random_value(rng: random.Random, kind: str, exclude: Sequence[str] = ()) -> str:
    """niah.py's ``generate_random``: a 7-digit number, an adjective-noun word, or a uuid4."""
    while True:
        if kind == "numbers":
            value = str(rng.randint(10**6, 10**7 - 1))
        elif kind == "words":
            value = rng.choice(KEY_WORDS)
        elif kind == "uuids":
            value = str(uuid.UUID(int=rng.getrandbits(128), version=4))
        else:
            raise ValueError(f"needle kind {kind!r}: one of numbers, words, uuids")
        if value not in exclude:
            return value


class _NeedleLines:
    """The ``needle`` haystack: line ``i`` a needle with a random key (none of ``exclude``) and value,
    drawn once in order (a longer haystack extends a shorter)."""

    def __init__(self, rng: random.Random, kind_k: str, kind_v: str, type_v: str, exclude: Sequence[str]):
        self.rng, self.kind_k, self.kind_v, self.type_v, self.exclude = rng, kind_k, kind_v, type_v, set(exclude)
        self.lines: list[str] = []

    def take(self, n: int) -> list[str]:
        while len(self.lines) < n:
            key = random_value(self.rng, self.kind_k, self.exclude)
            self.lines.append(NEEDLE.format(type_needle_v=self.type_v, key=key, value=random_value(self.rng, self.kind_v)))
        return self.lines[:n]


def insert_needles(lines: list[str], needles: Sequence[str], indexes: Sequence[int]) -> list[str]:
    """niah.py's insertion: the indexes sorted from the largest down, ``needles[i]`` inserted before the line
    at the ``i``-th of them."""
    out = list(lines)
    for position, needle in zip(sorted(indexes, reverse=True), needles):
        out.insert(position, needle)
    return out


def make_niah(tokenizer: Any, target_tokens: int, seed: int, index: int, spec: RulerTask) -> TaskRecord:
    args = spec.args
    nk, nv, nq = max(args["num_needle_k"], args["num_needle_q"]), args["num_needle_v"], args["num_needle_q"]
    type_k, type_v = args["type_needle_k"], args["type_needle_v"]
    rng = example_rng(seed, spec.registered, index)
    keys, values, needles = [], [], []
    for _ in range(nk):
        keys.append(random_value(rng, type_k, keys))
        value = []
        for _ in range(nv):
            value.append(random_value(rng, type_v))
            needles.append(NEEDLE.format(type_needle_v=type_v, key=keys[-1], value=value[-1]))
        values.append(value)
    random.Random(seed).shuffle(needles)
    queried = rng.sample(range(nk), nq)
    queries = [keys[i] for i in queried]
    answers = [a for i in queried for a in values[i]]
    query = ", ".join(queries[:-1]) + ", and " + queries[-1] if len(queries) > 1 else queries[0]
    singular = nq * nv == 1
    head, question, prefix = template_parts("niah", singular, type_needle_v=type_v[:-1] if singular else type_v,
                                            query=query)
    haystack = "prose" if args["type_haystack"] == "essay" else args["type_haystack"]
    haystack_rng = example_rng(seed, spec.registered, index, "haystack")
    needle_lines = _NeedleLines(haystack_rng, type_k, type_v, type_v, keys) if haystack == "needle" else \
        ProseHaystack(haystack_rng) if haystack == "prose" else None

    def make_context(n: int) -> str:
        n = max(n, len(needles))  # random.sample needs as many lines as needles
        lines = [NOISE] * n if needle_lines is None else needle_lines.take(n)
        indexes = _positions_rng(spec, seed, index, n).sample(range(n), len(needles))
        return head + "\n".join(insert_needles(lines, needles, indexes))

    return _record(tokenizer, target_tokens, spec, seed, index, make_context, question, prefix, answers, {
        "haystack": haystack, "ruler_haystack": args["type_haystack"], "queries": queries,
        "needles": [{"key": k, "values": v} for k, v in zip(keys, values)],
    })


# ------------------------------------------------------------------ vt

def _variables(rng: random.Random, count: int, letters: int) -> list[str]:
    names = ["".join(rng.choices(string.ascii_uppercase, k=letters)) for _ in range(count)]
    while len(set(names)) < count:  # variable_tracking.py draws until the names are distinct
        names = ["".join(rng.choices(string.ascii_uppercase, k=letters)) for _ in range(count)]
    return names


def make_chains(rng: random.Random, num_chains: int, num_hops: int, icl: bool = False) -> tuple[list[list[str]], list[list[str]]]:
    """variable_tracking.py's ``generate_chains``: (the variables of each chain, its statements)."""
    letters, hops = (3, min(10, num_hops)) if icl else (5, num_hops)
    names = _variables(rng, (hops + 1) * num_chains, letters)
    variables, chains = [], []
    for i in range(0, len(names), hops + 1):
        these = names[i:i + hops + 1]
        variables.append(these)
        chain = [f"VAR {these[0]} = {12345 if icl else rng.randint(10000, 99998)}"]
        chain += [f"VAR {these[j + 1]} = VAR {these[j]} " for j in range(hops)]
        chains.append(chain)
    return variables, chains


def insert_chains(n: int, chains: Sequence[Sequence[str]], rng: random.Random) -> list[str]:
    """variable_tracking.py's noise haystack: ``n`` noise lines, each chain's statements at sorted distinct
    positions, statement ``j`` inserted at its position + ``j`` (a noise line between two statements)."""
    sentences = [NOISE] * n
    for chain in chains:
        positions = sorted(rng.sample(range(len(sentences)), len(chain)))
        for j, position in enumerate(positions):
            sentences.insert(position + j, chain[j])
    return sentences


#: the in-context example's size: variable_tracking.py builds it at max_seq_length=500, nothing reserved
ICL_TOKENS = 500


def _vt_parts(value: str, hops: int) -> tuple[str, str, str]:
    return template_parts("variable_tracking", query=value, num_v=hops + 1)


def _plain_length(tokenizer: Any, text: str) -> int:
    return len(tokenizer(text, add_special_tokens=False)["input_ids"])


_ICL_CACHE: dict[tuple, tuple[Any, str]] = {}


def _vt_icl_cached(tokenizer: Any, seed: int, num_chains: int, num_hops: int) -> str:
    """:func:`vt_icl_example`, built once per (tokenizer, seed, chains, hops), as RULER builds it once per data set."""
    key = (id(tokenizer), seed, num_chains, num_hops)
    if key not in _ICL_CACHE or _ICL_CACHE[key][0] is not tokenizer:
        if len(_ICL_CACHE) > 16:
            _ICL_CACHE.clear()
        _ICL_CACHE[key] = (tokenizer, vt_icl_example(tokenizer, seed, num_chains, num_hops))
    return _ICL_CACHE[key][1]


def vt_icl_example(tokenizer: Any, seed: int, num_chains: int, num_hops: int) -> str:
    """RULER's in-context example of vt: three-letter variables, value 12345, the largest noise haystack whose
    text (template, answer prefix) fits :data:`ICL_TOKENS`, then its answer: ``input + " " + vars + "\\n"``."""
    rng = example_rng(seed, PREFIX + "vt", 0, "icl")
    variables, chains = make_chains(rng, num_chains, num_hops, icl=True)
    hops = min(10, num_hops)
    head, question, prefix = _vt_parts(chains[0][0].split("=")[-1].strip(), hops)
    answer = " " + " ".join(variables[0]) + "\n"

    def make_text(n: int) -> str:
        n = max(n, len(chains[0]))  # random.sample needs as many lines as statements
        context = "\n".join(insert_chains(n, chains, random.Random(f"kvcert:ruler_vt:icl:{seed}:{n}")))
        return head + context + SEPARATOR + question + prefix + answer

    _, n, _ = fit_filler(tokenizer, make_text, "", ICL_TOKENS, measure=lambda text: _plain_length(tokenizer, text))
    return make_text(n)


def randomize_icl(example: str, rng: random.Random, num_hops: int) -> str:
    """variable_tracking.py's ``randomize_icl``: the example's answer variables (its last words) replaced by
    random letters, everywhere in it; its value 12345 by a random five-digit number."""
    for item in example.strip().split()[-num_hops - 1:]:
        example = example.replace(item, "".join(rng.choices(string.ascii_uppercase, k=len(item))))
    return example.replace("12345", str(rng.randint(10000, 99998)))


def make_vt(tokenizer: Any, target_tokens: int, seed: int, index: int, spec: RulerTask) -> TaskRecord:
    num_chains, num_hops = spec.args["num_chains"], spec.args["num_hops"]
    rng = example_rng(seed, spec.registered, index)
    icl = randomize_icl(_vt_icl_cached(tokenizer, seed, num_chains, num_hops), rng, num_hops)
    variables, chains = make_chains(rng, num_chains, num_hops)
    value = chains[0][0].split("=")[-1].strip()
    head, question, prefix = _vt_parts(value, num_hops)

    def make_context(n: int) -> str:
        n = max(n, len(chains[0]))  # random.sample needs as many lines as statements
        return icl + "\n" + head + "\n".join(insert_chains(n, chains, _positions_rng(spec, seed, index, n)))

    return _record(tokenizer, target_tokens, spec, seed, index, make_context, question, prefix, list(variables[0]),
                   {"value": value, "chains": chains})


# ------------------------------------------------------------------ cwe

def numbered(words: Sequence[str]) -> str:
    """common_words_extraction.py's list: ``1. word1 2. word2 …``."""
    return " ".join(f"{i + 1}. {w}" for i, w in enumerate(words))


def cwe_list(common: Sequence[str], uncommon: Sequence[str], common_repeats: int, uncommon_repeats: int,
             seed: int) -> list[str]:
    """The word list of ``get_example``: the common words ``common_repeats`` times, the others
    ``uncommon_repeats`` times, shuffled by ``random.Random(seed)``."""
    words = list(common) * int(common_repeats) + list(uncommon) * int(uncommon_repeats)
    random.Random(seed).shuffle(words)
    return words


def make_cwe(tokenizer: Any, target_tokens: int, seed: int, index: int, spec: RulerTask) -> TaskRecord:
    num_cw = spec.args["num_cw"]
    if target_tokens < 4096:  # common_words_extraction.py's short setting
        shot_args, (cw, ucw) = (20, 3, 1), (6, 1)
    else:
        shot_args, (cw, ucw) = (40, 10, 3), (spec.args["freq_cw"], spec.args["freq_ucw"])
    words = list(WORDS)
    random.Random(seed).shuffle(words)
    rng = example_rng(seed, spec.registered, index)
    shot_words = rng.sample(words, shot_args[0])
    shot_common = shot_words[:num_cw]
    head, question, prefix = template_parts("common_words_extraction", query="")
    shot = (head + numbered(cwe_list(shot_common, shot_words[num_cw:], shot_args[1], shot_args[2], seed)) + SEPARATOR
            + question + prefix + " " + numbered(shot_common))
    # random.sample(words, n) for every n at once: the first n of one random order; beyond the embedded words
    # (RULER samples a second, downloaded English list there) the adjective-noun keys follow them, so that the
    # prompt's length grows smoothly with n
    order = rng.sample(words, len(words)) + rng.sample(KEY_WORDS, len(KEY_WORDS))
    common = order[:num_cw]

    def make_context(n: int) -> str:
        n = max(n, num_cw)
        return shot + "\n" + head + numbered(cwe_list(common, order[num_cw:n], cw, ucw, seed))

    def metadata(n: int) -> dict:
        return {"common_repeats": cw, "uncommon_repeats": ucw, "keys_as_words": max(0, n - len(words))}

    return _record(tokenizer, target_tokens, spec, seed, index, make_context, question, prefix, common, metadata,
                   max_units=len(order), what="distinct words and keys")


# ------------------------------------------------------------------ fwe

def zeta(alpha: float) -> float:
    """Riemann's ζ(α), α > 1 (scipy.special.zeta's value: π²/6 at 2; else a sum with its Euler–Maclaurin tail)."""
    if alpha <= 1:
        raise ValueError(f"alpha={alpha}: the zeta distribution needs alpha > 1")
    if alpha == 2.0:
        return math.pi ** 2 / 6
    n = 1000
    total = math.fsum(k ** -alpha for k in range(1, n))
    return total + n ** (1 - alpha) / (alpha - 1) + n ** -alpha / 2 + alpha * n ** (-alpha - 1) / 12


def coded_vocabulary(rng: random.Random, size: int, seed: int, letters: int = 6) -> list[str]:
    """freq_words_extraction.py's vocabulary: ``size`` random lower-case words of ``letters`` letters (drawn until
    distinct), sorted, shuffled by ``random.Random(seed)``, the first replaced by "..." (the noise word)."""
    vocab = ["".join(rng.choices(string.ascii_lowercase, k=letters)) for _ in range(size)]
    while len(set(vocab)) < size:
        vocab.append("".join(rng.choices(string.ascii_lowercase, k=letters)))
    vocab = sorted(set(vocab))
    random.Random(seed).shuffle(vocab)
    vocab[0] = "..."
    return vocab


def coded_text(vocab: Sequence[str], num_words: int, alpha: float, seed: int) -> str:
    """``gen_text``: word ``k`` (from 1) ``int(num_words · k^−α / ζ(α))`` times, shuffled by ``random.Random(seed)``."""
    z = zeta(alpha)
    words = [w for k, w in enumerate(vocab, start=1) for _ in range(int(num_words * (k ** -alpha) / z))]
    random.Random(seed).shuffle(words)
    return " ".join(words)


def make_fwe(tokenizer: Any, target_tokens: int, seed: int, index: int, spec: RulerTask) -> TaskRecord:
    alpha = float(spec.args["alpha"])
    size = (target_tokens - TOKENS_TO_GENERATE[spec.task]) // 50
    if size < 4:
        raise LengthTooShort(f"fwe needs a vocabulary of at least 4 coded words (one per 50 tokens), it would have "
                             f"{max(size, 0)}", 4 * 50 + TOKENS_TO_GENERATE[spec.task], target_tokens)
    vocab = coded_vocabulary(example_rng(seed, spec.registered, index), size, seed)
    head, question, prefix = template_parts("freq_words_extraction", query="")
    return _record(tokenizer, target_tokens, spec, seed, index,
                   lambda n: head + coded_text(vocab, n, alpha, seed), question, prefix, vocab[1:4],
                   {"alpha": alpha, "vocab_size": size})


MAKERS = {"niah": make_niah, "variable_tracking": make_vt, "common_words_extraction": make_cwe,
          "freq_words_extraction": make_fwe}


def record_maker(name: str) -> Callable[..., TaskRecord]:
    """``make_record(tokenizer, target_tokens, seed, index)`` of the RULER task ``name``."""
    spec = RULER_TASKS[name]

    def make_record(tokenizer: Any, target_tokens: int, seed: int, index: int) -> TaskRecord:
        return MAKERS[spec.task](tokenizer, target_tokens, seed, index, spec)

    make_record.__name__ = f"make_{name}"
    return make_record


def generator(name: str) -> Callable[..., list[TaskRecord]]:
    """``generate(tokenizer, n_examples, target_tokens, seed)`` of the RULER task ``name``."""
    return examples_of(record_maker(name))


# ------------------------------------------------------------------ the suite: names and the summary table

def expand(values: Sequence[str]) -> list[str]:
    """Task names with the suite's short forms expanded: ``ruler`` → every RULER task, ``ruler:a,b`` (given as
    the values ``ruler:a``, ``b``) → those, each a registered name ``ruler_a``; other names as they are."""
    out: list[str] = []
    in_suite = False
    for value in values:
        if value == "ruler":
            out += [t.registered for t in RULER_TASKS.values()]
            in_suite = False
            continue
        if value.startswith("ruler:"):
            value, in_suite = value[len("ruler:"):], True
        name = value[len(PREFIX):] if value.startswith(PREFIX) else value
        if in_suite or value.startswith(PREFIX):
            if name not in RULER_TASKS:
                import difflib

                near = difflib.get_close_matches(name, list(RULER_TASKS), n=1)
                raise ValueError(f"task=ruler:{name}: no such RULER task" + (f" (did you mean {near[0]}?)" if near else "")
                                 + f"; the RULER tasks are {', '.join(RULER_TASKS)}")
            out.append(PREFIX + name)
        else:
            out.append(value)
    return list(dict.fromkeys(out))


def summary_table(scores: dict[str, float]) -> str:
    """The table kvpress's evaluation prints for RULER: each task's ``string_match`` (score × 100, RULER's
    rounding) and their average, over the tasks given (``scores``: registered or short name → mean score in
    [0, 1])."""
    rows = [(name[len(PREFIX):] if name.startswith(PREFIX) else name, round(100 * s, 2)) for name, s in scores.items()]
    width = max([len("average")] + [len(n) for n, _ in rows])
    lines = [f"{'RULER task':<{width}}  string_match"]
    lines += [f"{n:<{width}}  {s:>12.2f}" for n, s in rows]
    if rows:
        lines.append(f"{'average':<{width}}  {sum(s for _, s in rows) / len(rows):>12.2f}")
    return "\n".join(lines)
