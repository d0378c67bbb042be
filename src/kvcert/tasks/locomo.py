"""LoCoMo very long-term conversations: loading, prompts, records and scoring.

Source: Maharana et al. 2024, "Evaluating Very Long-Term Conversational Memory of LLM
Agents" (ACL 2024). The data format is the released ``locomo10.json``. Of the official
evaluations of snap-research/locomo, kvcert follows **one**: ``task_eval/hf_llm_utils.py``
for the context (below) and ``task_eval/evaluate_llama2.py`` (the script that runs Hugging
Face chat models through ``apply_chat_template``, as kvcert does) for the question part and
the clean-up of a prediction, and ``task_eval/evaluation.py``
(``eval_question_answering``, which every script shares) for the metric — re-implemented
here. ``evaluate_gpts.py`` differs: another adversarial choice ("Not mentioned in the
conversation"), another mapping of the reply to a choice (``get_cat_5_answer``: a
one-character reply means "a" if it holds "a", a three-character one "(a)", anything
longer is kept), and no clean-up of other replies; on its mapping the two disagree for a
third or more of the adversarial items, so scores of one are not comparable with the
other's.

**Data.** A JSON list of samples, each ``{"sample_id", "conversation", "qa"}`` (the
release adds ``event_summary``, ``observation`` and ``session_summary``, unused here).
The conversation holds ``speaker_a``, ``speaker_b`` and sessions ``session_<N>`` (lists
of turns ``{"speaker", "dia_id", "text", ...}``; a shared image adds ``img_url`` and
``blip_caption``) with their dates ``session_<N>_date_time``. A QA item is
``{"question", "answer", "evidence", "category"}``; adversarial items (category 5)
carry ``adversarial_answer`` — a tempting answer the conversation does not support.
The released file lacks ``answer`` on 444 of its 446 category-5 items, where
``evaluate_llama2.py`` reads ``qa["answer"]`` (and so stops with a ``KeyError``); kvcert
offers ``adversarial_answer`` as the tempting choice there (and ``answer`` only when an
item has no ``adversarial_answer``), which is what the item means.

**Categories** (integer codes of the release, as the official scoring treats them):
1 multi-hop, 2 temporal, 3 open-domain, 4 single-hop, 5 adversarial.

**Prompt.** The context is built as ``task_eval/hf_llm_utils.py`` (``get_input_context``,
the script upstream runs Hugging Face models with, of the same commit as ``locomo10.json``)
builds it: the official conversation preamble (its typo "wriiten" kept), then the sessions
newest first, each as ``DATE: <date>`` / ``CONVERSATION:`` (an empty session keeps its
header) and its turns in order, each ``<speaker> said, "<text>"``, a newline, `` and shared
<caption>.`` on every turn with a ``blip_caption``, and a newline (so a blank line after a
turn without one). The question part is the official short-answer
instruction with the question; a temporal question gets " Use DATE of CONVERSATION to
answer with an approximate date."; an adversarial question becomes a two-way choice
between "No information available" and the adversarial answer, in an order drawn by a
coin flip (seeded here, per item) as in the official script. Our choices: the whole
conversation is kept (the official scripts drop turns to fit a 4k-32k window; kvcert
sizes models to hold it); the speakers are named in the order
``speaker_a``, ``speaker_b`` (the script takes them from a ``set``, so its order
varies); the blank lines around the question are normalised to exactly one, the prompt
separator (the script's text has four newlines there, which some BPE pre-tokenizers
merge into one token across the context/question split); no system message (the script
adds one for Llama models only); and greedy decoding (the script samples at temperature
0.4). Answers are up to ``MAX_NEW_TOKENS`` tokens (the script's per-question budget).

**Clean-up** (:func:`clean_prediction`, ``evaluate_llama2.py``): ``\\"`` becomes ``'``,
the reply is stripped and cut to its first line. An adversarial reply then becomes the
option it picks: option (a) when it contains "(a)" (case-insensitive), option (b)
otherwise. Any other reply is lower-cased, loses every "(a)", "(b)", "a)", "b)" and
"answer:" (in that order), and is stripped: ``"Answer: Camping"`` scores as
``"camping"``.

**Scoring** (:func:`score_locomo`, ``evaluation.py``, on the cleaned reply):
Porter-stemmed token F1 after LoCoMo's normalisation (commas dropped, lower-case,
punctuation dropped, the words a/an/the/and dropped, whitespace collapsed). Multi-hop:
prediction and gold are split on commas and each gold part takes its best F1 over the
prediction parts; the score is the mean over gold parts. Open-domain: only the gold
text before the first ";" counts. Temporal and single-hop: plain F1. Adversarial: 1 when
the (mapped) prediction contains "no information available" or "not mentioned", else 0.
"""

from __future__ import annotations

import json
import random
import re
import string
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

from kvcert.config.sources import SourceError, missing
from kvcert.tasks.longbench_metrics import token_f1
from kvcert.tasks.prompting import build_prompt_ids
from kvcert.tasks.records import TaskRecord, check_text, progress_of, read_utf8

__all__ = [
    "CATEGORY_NAMES", "MAX_NEW_TOKENS", "NO_INFORMATION", "TASK", "category_means",
    "clean_prediction", "f1_score", "load_locomo", "locomo_records", "multi_answer_f1", "normalize_answer",
    "question_prompt", "render_conversation", "resolve_adversarial_choice", "score_locomo",
    "score_locomo_record",
]

TASK = "locomo"
CATEGORY_NAMES: dict[int, str] = {
    1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop", 5: "adversarial",
}
#: the order in which the official statistics report the categories.
REPORT_ORDER: tuple[int, ...] = (4, 1, 2, 3, 5)
MAX_NEW_TOKENS = 50

CONVERSATION_PREAMBLE = (
    "Below is a conversation between two people: {} and {}. The conversation takes place "
    "over multiple days and the date of each conversation is wriiten at the beginning of "
    "the conversation.\n\n"
)
QA_INSTRUCTION = (
    "Based on the above conversations, write a short answer for the following question in "
    "a few words. Do not write complete and lengthy sentences. Answer with exact words from "
    "the conversations whenever possible.\n\nQuestion: {}"
)
TEMPORAL_HINT = " Use DATE of CONVERSATION to answer with an approximate date."
ADVERSARIAL_CHOICE = " (a) {} (b) {}. Select the correct answer by writing (a) or (b)."
NO_INFORMATION = "No information available"
_ABSTENTIONS = ("no information available", "not mentioned")

_SESSION_KEY = re.compile(r"^session_(\d+)$")


# ------------------------------------------------------------------------ loading

def locomo_file(path: str | Path) -> Path:
    """``path`` as the LoCoMo JSON file; a one-line error for a directory or a missing file."""
    given = str(path)
    path = Path(path).expanduser()
    if path.is_dir():
        inside = path / "locomo10.json"
        found = f"; it holds {inside}, give that file" if inside.is_file() else ""
        raise missing("locomo", given, f"is a directory, not the released LoCoMo JSON file (locomo10.json){found}")
    if not path.is_file():
        raise missing("locomo", given, "does not exist (the released LoCoMo JSON, locomo10.json, was expected)")
    return path


def load_locomo(path: str | Path) -> list[dict[str, Any]]:
    """The samples of a ``locomo10.json``-format file, checked field by field."""
    path = locomo_file(path)
    try:
        data = json.loads(read_utf8(path))
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not valid JSON ({exc.msg}, line {exc.lineno})") from exc
    if not isinstance(data, list):
        raise ValueError(f"{path}: expected a JSON list of samples, got {type(data).__name__}")
    for index, sample in enumerate(data):
        _check_sample(sample, f"{path}: sample {index}")
    return data


def _sessions(conversation: Mapping[str, Any]) -> list[int]:
    return sorted(int(m.group(1)) for key in conversation if (m := _SESSION_KEY.match(key)))


def _check_sample(sample: Any, where: str) -> None:
    if not isinstance(sample, dict):
        raise ValueError(f"{where}: expected a JSON object, got {type(sample).__name__}")
    for name, kind in (("conversation", dict), ("qa", list)):
        if name not in sample:
            raise ValueError(f"{where}: missing field {name!r}")
        if not isinstance(sample[name], kind):
            raise ValueError(f"{where}: field {name!r} must be a {kind.__name__}")
    where = f"{where} ({sample.get('sample_id', 'no sample_id')})"
    conversation = sample["conversation"]
    for name in ("speaker_a", "speaker_b"):
        if name not in conversation:
            raise ValueError(f"{where}: conversation lacks field {name!r}")
    sessions = _sessions(conversation)
    if not sessions:
        raise ValueError(f"{where}: conversation has no session_<N> entries")
    for number in sessions:
        turns = conversation[f"session_{number}"]
        if not isinstance(turns, list):
            raise ValueError(f"{where}: session_{number} must be a list of turns")
        if turns and f"session_{number}_date_time" not in conversation:
            raise ValueError(f"{where}: conversation lacks field 'session_{number}_date_time'")
        for position, turn in enumerate(turns):
            if not isinstance(turn, dict) or "speaker" not in turn:
                raise ValueError(f"{where}: session_{number} turn {position} lacks field 'speaker'")
            if "text" not in turn and "clean_text" not in turn:
                raise ValueError(f"{where}: session_{number} turn {position} lacks field 'text'")
            name = "clean_text" if "clean_text" in turn else "text"
            check_text(turn[name], name, f"{where}: session_{number} turn {position}")
    for position, qa in enumerate(sample["qa"]):
        _check_qa(qa, f"{where} qa {position}")


def _check_qa(qa: Any, where: str) -> None:
    if not isinstance(qa, dict):
        raise ValueError(f"{where}: expected a JSON object")
    for name in ("question", "category"):
        if name not in qa:
            raise ValueError(f"{where}: missing field {name!r}")
    check_text(qa["question"], "question", where)
    category = qa["category"]
    if isinstance(category, bool) or category not in CATEGORY_NAMES:
        raise ValueError(f"{where}: category must be one of 1..5, got {category!r}")
    if category == 5:
        if "adversarial_answer" not in qa and "answer" not in qa:
            raise ValueError(f"{where}: missing field 'adversarial_answer'")
    elif "answer" not in qa:
        raise ValueError(f"{where}: missing field 'answer'")


# ------------------------------------------------------------------------ prompts

def _turn_line(turn: Mapping[str, Any]) -> str:
    """One turn as ``hf_llm_utils.get_input_context`` writes it: ``<speaker> said, "<text>"``, a
    newline, `` and shared <caption>.`` when the turn has a ``blip_caption``, a newline."""
    line = f'{turn["speaker"]} said, "{turn["text"]}"\n'
    if "blip_caption" in turn:
        line += f" and shared {turn['blip_caption']}."
    return line + "\n"


def render_conversation(sample: Mapping[str, Any]) -> str:
    """The context text: the preamble, then the sessions newest first, each as ``DATE:`` /
    ``CONVERSATION:`` and its turns in order (an empty session keeps its header); trailing
    newlines dropped (the prompt separator follows)."""
    conversation = sample["conversation"]
    parts = [CONVERSATION_PREAMBLE.format(conversation["speaker_a"], conversation["speaker_b"])]
    for number in reversed(_sessions(conversation)):
        if f"session_{number}_date_time" not in conversation:  # an empty session without a date (checked)
            continue
        parts.append(f"\nDATE: {conversation[f'session_{number}_date_time']}\nCONVERSATION:\n")
        parts.extend(_turn_line(turn) for turn in conversation[f"session_{number}"])
    return "".join(parts).rstrip()


def _adversarial_answer(qa: Mapping[str, Any]) -> str:
    return str(qa["adversarial_answer"] if "adversarial_answer" in qa else qa["answer"])


def question_prompt(qa: Mapping[str, Any], rng: random.Random) -> tuple[str, dict[str, str] | None]:
    """``(question part, choices)``; ``choices`` maps "a"/"b" to options (category 5 only)."""
    question = str(qa["question"])
    choices = None
    if qa["category"] == 2:
        question += TEMPORAL_HINT
    elif qa["category"] == 5:
        adversarial = _adversarial_answer(qa)
        if rng.random() < 0.5:
            choices = {"a": NO_INFORMATION, "b": adversarial}
        else:
            choices = {"a": adversarial, "b": NO_INFORMATION}
        question += ADVERSARIAL_CHOICE.format(choices["a"], choices["b"])
    return QA_INSTRUCTION.format(question), choices


def locomo_records(samples: Iterable[Mapping[str, Any]], tokenizer: Any, seed: int = 0,
                   categories: Sequence[int] | None = None, bar: Any = None) -> list[TaskRecord]:
    """One record per QA item (optionally only the given categories), conversation after conversation as in
    the file (a grid cell that takes a sample of them: :func:`kvcert.generation.manifest.build_records`).

    ``answers`` holds the gold answer (``NO_INFORMATION`` for adversarial items);
    ``metadata``: ``category``, ``category_name``, ``sample_id``, ``qa_index``,
    ``evidence``, ``max_new_tokens``, ``target_tokens`` (the prompt length: LoCoMo is
    not length-controlled) and, for adversarial items, ``choices`` and
    ``adversarial_answer``. ``bar``: a progress display told of every record built (``update``).
    """
    wanted = None if categories is None else set(categories)
    per_conversation: list[list[TaskRecord]] = []
    for index, sample in enumerate(samples):
        records: list[TaskRecord] = []
        per_conversation.append(records)
        _check_sample(sample, f"sample {index}")
        sample_id = str(sample.get("sample_id", f"sample-{index}"))
        context = render_conversation(sample)
        for position, qa in enumerate(sample["qa"]):
            category = qa["category"]
            if wanted is not None and category not in wanted:
                continue
            rng = random.Random(f"{seed}:{sample_id}:{position}")
            question, choices = question_prompt(qa, rng)
            metadata: dict[str, Any] = {
                "category": category,
                "category_name": CATEGORY_NAMES[category],
                "sample_id": sample_id,
                "qa_index": position,
                "evidence": [str(e) for e in qa.get("evidence") or []],
                "max_new_tokens": MAX_NEW_TOKENS,
                "target_tokens": 0,
            }
            if choices is not None:
                metadata["choices"] = choices
                metadata["adversarial_answer"] = _adversarial_answer(qa)
                answers = [NO_INFORMATION]
            else:
                answers = [str(qa["answer"])]
            record = TaskRecord(
                id=f"{TASK}:{sample_id}:{position}", task=TASK, context=context,
                question=question, answers=answers, metadata=metadata,
            )
            length = len(build_prompt_ids(tokenizer, record)[0])
            records.append(replace(record, length=length,
                                   metadata={**metadata, "target_tokens": length}))
            if bar is not None:
                bar.update(1)
    return [record for conversation in per_conversation for record in conversation]


# ------------------------------------------------------------------------ scoring

_PUNCTUATION = set(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the|and)\b")
_stemmer = None


def _stem(word: str) -> str:
    global _stemmer
    if _stemmer is None:
        from nltk.stem import PorterStemmer

        _stemmer = PorterStemmer()
    return _stemmer.stem(word)


def normalize_answer(text: str) -> str:
    """LoCoMo's normalisation: drop commas, lower-case, drop punctuation, drop
    a/an/the/and, collapse whitespace."""
    text = text.replace(",", "").lower()
    text = "".join(ch for ch in text if ch not in _PUNCTUATION)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def f1_score(prediction: str, ground_truth: str) -> float:
    """F1 of the Porter-stemmed normalised tokens (0 when none is shared)."""
    predicted = [_stem(w) for w in normalize_answer(prediction).split()]
    gold = [_stem(w) for w in normalize_answer(ground_truth).split()]
    return token_f1(predicted, gold)


def multi_answer_f1(prediction: str, ground_truth: str) -> float:
    """Mean over the comma-separated gold parts of the best F1 over the prediction's parts."""
    predicted = [part.strip() for part in prediction.split(",")]
    gold = [part.strip() for part in ground_truth.split(",")]
    return sum(max(f1_score(p, g) for p in predicted) for g in gold) / len(gold)


def resolve_adversarial_choice(prediction: str, choices: Mapping[str, str]) -> str:
    """The option an adversarial reply picks, as ``evaluate_llama2.py`` maps it: option
    (a) when the (cleaned) reply contains "(a)", case-insensitive; option (b) otherwise —
    a reply naming neither, or writing the option's text, counts as (b)."""
    return choices["a"] if "(a)" in prediction.lower() else choices["b"]


#: what ``evaluate_llama2.py`` deletes from a non-adversarial reply, in this order
_REMOVED = ("(a)", "(b)", "a)", "b)", "answer:")


def clean_prediction(prediction: str, choices: Mapping[str, str] | None = None) -> str:
    """``evaluate_llama2.py``'s post-processing of a generated reply (module docstring):
    the first line, then the picked option (``choices`` given: an adversarial item) or
    the lower-cased text without "(a)", "(b)", "a)", "b)", "answer:"."""
    text = prediction.replace('\\"', "'").strip()
    text = text.split("\n")[0].strip()
    if choices is not None:
        return resolve_adversarial_choice(text.strip(), choices)
    text = text.lower()
    for piece in _REMOVED:
        text = text.replace(piece, "")
    return text.strip()


def score_locomo(category: int, prediction: str, answer: Any,
                 choices: Mapping[str, str] | None = None) -> float:
    """The LoCoMo score in [0, 1] of one raw reply (see the module docstring): cleaned by
    :func:`clean_prediction`, then scored as ``evaluation.py`` does."""
    if isinstance(category, bool) or category not in CATEGORY_NAMES:
        raise ValueError(f"LoCoMo category must be one of 1..5, got {category!r}")
    answer = str(answer)
    prediction = clean_prediction(prediction, choices if category == 5 else None)
    if category == 5:
        lowered = prediction.lower()
        return 1.0 if any(phrase in lowered for phrase in _ABSTENTIONS) else 0.0
    if category == 1:
        return float(multi_answer_f1(prediction, answer))
    if category == 3:
        answer = answer.split(";")[0].strip()
    return f1_score(prediction, answer)


def score_locomo_record(record: TaskRecord, prediction: str) -> float:
    """:func:`score_locomo` of a record built by :func:`locomo_records` (the raw reply)."""
    metadata = record.metadata
    return score_locomo(metadata["category"], prediction, record.answers[0], metadata.get("choices"))


def category_means(categories: Sequence[int], scores: Sequence[float]) -> dict[str, float]:
    """Mean score per category name (in the official report order) and ``overall``."""
    if len(categories) != len(scores):
        raise ValueError(f"{len(categories)} categories but {len(scores)} scores")
    if not scores:
        raise ValueError("no scores to aggregate")
    unknown = set(categories) - set(CATEGORY_NAMES)
    if unknown:
        raise ValueError(f"unknown LoCoMo categories: {sorted(unknown)}")
    means: dict[str, float] = {}
    for category in REPORT_ORDER:
        picked = [s for c, s in zip(categories, scores) if c == category]
        if picked:
            means[CATEGORY_NAMES[category]] = sum(picked) / len(picked)
    means["overall"] = sum(scores) / len(scores)
    return means


# ------------------------------------------------------------------------ the task registry's entry

def spread_over_conversations(records: list[TaskRecord], examples: int) -> list[TaskRecord]:
    """``examples`` QA items spread over every conversation: each conversation gets a share proportional to its
    items (largest remainder), taken at evenly spaced positions of its QA list (so its categories, which the
    released file lists in runs, are all represented); records stay in file order."""
    by_conv: dict[str, list[int]] = {}
    for i, r in enumerate(records):
        by_conv.setdefault(str(r.metadata.get("sample_id")), []).append(i)
    examples = min(examples, len(records))
    exact = {c: examples * len(idx) / len(records) for c, idx in by_conv.items()}
    take = {c: int(v) for c, v in exact.items()}
    for c in sorted(exact, key=lambda c: (take[c] - exact[c], c))[: examples - sum(take.values())]:
        take[c] += 1
    chosen = []
    for c, idx in by_conv.items():
        k = take[c]
        chosen += [idx[int((j + 0.5) * len(idx) / k)] for j in range(k)] if k else []
    return [records[i] for i in sorted(chosen)]


def build_records(task_cfg: Mapping[str, Any], tokenizer: Any, length: int, examples: int, seed: int,
                  sample: str = "first", progress: Callable[[int], Any] | None = None) -> list[TaskRecord]:
    """``examples`` QA items of the config's LoCoMo file as records (the registry's ``build``): the first
    ones (``sample="first"``) or spread over every conversation (``"spread"``); the context is the whole
    conversation, whatever ``length``. Every item is built (the spread needs them all); ``progress``: a
    progress display's factory (:func:`~kvcert.tasks.records.progress_of`)."""
    samples = load_locomo(task_cfg["source"])
    bar = progress_of(progress, sum(len(s["qa"]) for s in samples))
    try:
        records = locomo_records(samples, tokenizer, seed=seed, bar=bar)
    finally:
        bar.close()
    if sample == "spread":
        return spread_over_conversations(records, examples)
    if sample != "first":
        raise ValueError(f"locomo: sample must be 'first' or 'spread', got {sample!r}")
    return records[:examples]


def capacity(task_cfg: Mapping[str, Any]) -> tuple[int, str]:
    """(the most records the config's LoCoMo file offers — its QA items —, where they are)."""
    path = locomo_file(str(task_cfg["source"]))
    return sum(len(s["qa"]) for s in load_locomo(path)), f"the QA items of {path}"


def config_sources(task_cfg: Mapping[str, Any]) -> list[Path]:
    """The file a build of the config reads (:func:`locomo_file`)."""
    return [locomo_file(str(task_cfg["source"]))]


def check_config(task_cfg: Mapping[str, Any]) -> list[str]:
    """The pre-flight of a LoCoMo task config: its file exists (one line otherwise)."""
    try:
        locomo_file(str(task_cfg["source"]))
    except SourceError as exc:
        return [f"task {task_cfg.get('name', '?')}: {str(exc).removeprefix('locomo: ')}"]
    return []
