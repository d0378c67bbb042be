"""Training sequences for the embedded model, generated on the fly from the task
generators.

Two kinds of sequence:

- **copy**: a random segment of vocabulary tokens repeated until the sequence is full;
  next-token loss on the repeats. This teaches induction (find the earlier occurrence,
  copy what followed), the mechanism retrieval builds on.
- **task**: a record of one of the synthetic tasks (needle, look-alike needles,
  multi-key QA, multi-turn) rendered through the chat template, answered, and followed
  by further chat turns asking about the record's other facts ("many queries per
  sequence"). Each turn's prompt ends with the task's answer prefix, if it has one
  (RULER's "The special magic number for pocket mentioned in the provided text is");
  the answer is the task's reference response (the value after such a prefix, or a
  sentence that restates the fact: "Nora lives in Lisbon"). Loss on every response
  token (and the closing ``<|end|>``), plus a down-weighted next-token loss on a random
  subset of the other tokens.

A batch carries a *role* per token (0 no loss, 1 response token, 2 auxiliary
next-token target) and *retrieval targets*: for a position that must produce a token
found earlier in the sequence (a repeated token of a copy segment; the key or a value
token of the fact a response states), the positions where that token stands in the
source (the earlier repeat; the fact in the context). The training loop supervises
one attention head to look there (see :mod:`kvcert.training.train`); this direct
signal teaches retrieval over long contexts far sooner than the output loss alone.

Two more kinds of attention target come with task sequences:

- *entity* targets: every position up to :data:`ENTITY_WINDOW` tokens after a fact's
  key (the key's last token: needle key, person, code item), should attend to that
  key token. A head taught this carries "which key this sentence is about" to every
  position of the sentence — the value tokens of a needle, the end of a question, the
  end of an answer prefix — beyond the reach of heads that look a fixed few tokens back.
- *question* targets: the positions of a question after its key (up to the one that
  produces the first answer token), should attend to the context sentence that states
  the fact asked about. This is the question-time attention of real instruction models
  (their question lands on the whole needle sentence), which is what lets a
  question-aware eviction scorer (SnapKV's observation window) keep what the answer
  will be read from.

Everything a batch contains is a function of (seed, step): resuming at a step rebuilds
exactly the batches an uninterrupted run would have seen. Training records use
generator seeds at or above :data:`TRAIN_SEED_OFFSET`; evaluation uses seeds below it.
"""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch

from kvcert.tasks import SYNTHETIC_TASKS, get_task, lookalike, multiturn
from kvcert.tasks.prompting import build_prompt_ids, encode_rendered, render_chat, user_message

TRAIN_SEED_OFFSET = 1_000_000
NONE, ANSWER, AUX = 0, 1, 2
ENTITY_WINDOW = 12  # entity targets reach this many tokens past a key
COPY_SEGMENT = (16, 64)  # default (min, max) length of a copy sequence's repeated segment
COPY_RETRIEVALS = 48  # supervised retrievals per copy sequence, at most

#: (query position, positions the supervised head should attend to)
Retrieval = tuple[int, list[int]]


@dataclass(frozen=True)
class Phase:
    """A stretch of training with one data mixture.

    ``steps``: how many optimizer steps; ``lengths``: (min, max) target tokens, drawn
    per batch; ``tokens_per_batch``: batch size in tokens (sequences = this // length);
    ``task_weights``: relative frequency of "copy" and of each task name;
    ``max_facts``: task records state 1..max_facts facts (needles, people, codes),
    each asked about in turn; ``copy_segment``: (min, max) length of the random
    segment a copy sequence repeats (short segments repeat often: many targets).
    """

    steps: int
    lengths: tuple[int, int]
    tokens_per_batch: int
    task_weights: dict[str, float]
    max_facts: int = 8
    copy_segment: tuple[int, int] = COPY_SEGMENT


#: the embedded model's records fill their length: the RULER tasks reserve no answer tokens
#: in its training data and in its training-time evaluation
FILL_LENGTH: dict[str, dict[str, Any]] = {"needle": {"answer_tokens": 0}, "lookalike": {"answer_tokens": 0}}


def train_options(task: str, rng: random.Random, length: int, max_facts: int) -> dict[str, Any]:
    """Generator options of one training record of ``task``, one of the registry's synthetic tasks
    (:data:`kvcert.tasks.SYNTHETIC_TASKS`; the evaluation defaults lie inside; :data:`FILL_LENGTH`)."""
    if task not in SYNTHETIC_TASKS:
        raise KeyError(f"no training options for task {task!r}; the embedded model learns {', '.join(SYNTHETIC_TASKS)}")
    if task == "needle":
        return {"num_needles": rng.randint(1, max_facts), **FILL_LENGTH["needle"]}
    if task == "multikey":
        return {"num_facts": rng.randint(1, max_facts)}
    if task == "multiturn":
        return {"num_facts": rng.randint(1, min(max_facts, multiturn.default_num_turns(length) - 1))}
    if task == "lookalike":
        lookalikes = rng.randint(0, max(lookalike.LOOKALIKES))
        return {"lookalikes": lookalikes, "others": rng.randint(0, max(0, min(max_facts - 1 - lookalikes, 3))),
                **FILL_LENGTH["lookalike"]}
    raise KeyError(f"no training options for task {task!r}")


@dataclass
class Sequence_:
    ids: list[int]
    roles: list[int]
    retrieval: list[Retrieval]
    entity: list[Retrieval] = field(default_factory=list)
    question: list[Retrieval] = field(default_factory=list)


@dataclass
class Batch:
    input_ids: torch.Tensor  # (B, T) long, right-padded
    roles: torch.Tensor  # (B, T) uint8: loss role of predicting input_ids[:, t] from t-1
    retrieval: list[tuple[int, int, list[int]]]  # (row, query position, source positions)
    kinds: list[str]
    entity: list[tuple[int, int, list[int]]] = field(default_factory=list)  # (row, query, [key position])
    question: list[tuple[int, int, list[int]]] = field(default_factory=list)  # (row, query, fact positions)

    def digest(self) -> str:
        """SHA-256 of everything the batch trains on (for the training-data hash)."""
        h = hashlib.sha256()
        h.update(self.input_ids.numpy().tobytes())
        h.update(self.roles.numpy().tobytes())
        h.update(json.dumps(self.retrieval).encode())
        if self.entity or self.question:  # batches without them hash as before
            h.update(json.dumps([self.entity, self.question]).encode())
        return h.hexdigest()


class SequenceBuilder:
    """Builds training sequences for one tokenizer."""

    def __init__(self, tokenizer: Any, lm_fraction: float = 0.25, max_questions: int = 8,
                 copy_vocab: int | None = None):
        self.tokenizer = tokenizer
        self.lm_fraction = lm_fraction
        self.max_questions = max_questions
        special = set(tokenizer.all_special_ids)
        self.plain_ids = [i for i in range(len(tokenizer)) if i not in special]
        self.copy_ids = self.plain_ids
        if copy_vocab is not None and copy_vocab < len(self.plain_ids):
            self.copy_ids = sorted(random.Random("kvcert-copy-vocab").sample(self.plain_ids, copy_vocab))
        self.eos = tokenizer.eos_token_id

    # ------------------------------------------------------------------ copy
    def copy_sequence(self, rng: random.Random, length: int,
                      segment: tuple[int, int] = COPY_SEGMENT) -> Sequence_:
        """A random segment (``segment`` tokens, at most half the length) repeated until full."""
        size = rng.randint(min(segment[0], length // 2), min(segment[1], length // 2))
        segment = [rng.choice(self.copy_ids) for _ in range(size)]
        ids = [self.tokenizer.bos_token_id]
        while len(ids) < length:
            ids += segment
        ids = ids[:length]
        roles = [NONE] * length
        retrieval: list[Retrieval] = []
        # position t (t > size) repeats t - size; the first token of a repeat is not
        # predictable (the segment length is unknown), the rest are
        targets = [t for t in range(size + 2, length) if (t - 1) % size]
        for t in targets:
            roles[t] = AUX
        # the retrieval head is supervised at a bounded number of them (cost)
        stride = max(1, len(targets) // COPY_RETRIEVALS)
        for t in targets[::stride]:
            retrieval.append((t - 1, list(range(t - size, 0, -size))))
        return Sequence_(ids, roles, retrieval)

    # ------------------------------------------------------------------ task
    def task_sequence(self, rng: random.Random, task: str, length: int, seed: int,
                      index: int, max_facts: int = 8) -> Sequence_:
        options = train_options(task, rng, length, max_facts)
        spec = get_task(task)  # the registry's synthetic task (train_options refuses any other)
        record = spec.make_record(self.tokenizer, length, seed, index, **options)
        every_qa = spec.questions_for(record)
        first, rest = every_qa[0], every_qa[1:]
        rng.shuffle(rest)
        qas = [first, *rest[: self.max_questions - 1]]
        ids, turn_start = build_prompt_ids(self.tokenizer, record)
        prompt = list(ids)
        roles = [self._lm(rng) for _ in ids]
        roles[0] = NONE
        retrieval: list[Retrieval] = []
        question: list[Retrieval] = []
        messages = [{"role": "user", "content": user_message(record.context, record.question,
                                                             record.separator)}]
        for turn, qa in enumerate(qas):
            if turn:
                messages.append({"role": "user", "content": qa.question})
                prefix = encode_rendered(self.tokenizer, render_chat(self.tokenizer, messages))
                if prefix[: len(ids)] != ids:
                    raise ValueError("chat template is not prefix-stable across turns")
                new = prefix[len(ids):] + self._encode(qa.answer_prefix)
                turn_start = len(ids)
                ids += new
                roles += [self._lm(rng) for _ in new]
            response = self._encode(qa.response)
            start = len(ids)
            question += self._question_targets(prompt, ids, turn_start, start, qa)
            ids += response + [self.eos]
            roles += [ANSWER] * (len(response) + 1)
            for offset, positions in self._fact_sources(prompt, response, qa).items():
                retrieval.append((start + offset - 1, positions))
            messages.append({"role": "assistant", "content": qa.answer_prefix + qa.response})
        entity = self._entity_targets(ids, [qa.key for qa in every_qa])
        return Sequence_(ids, roles, retrieval, entity, question)

    def _key_ends(self, ids: list[int], key: str) -> list[int]:
        """Positions of the last token of each occurrence of ``key`` in ``ids``."""
        key_ids = self._encode(key)
        n = len(key_ids)
        return [j + n - 1 for j in range(len(ids) - n + 1) if ids[j:j + n] == key_ids]

    def _entity_targets(self, ids: list[int], keys: list[str]) -> list[Retrieval]:
        """Each position within :data:`ENTITY_WINDOW` tokens after a key's last token
        (and before the next key) → that key token."""
        ends = sorted({end for key in set(keys) for end in self._key_ends(ids, key)})
        targets: list[Retrieval] = []
        for j, end in enumerate(ends):
            stop = min(end + ENTITY_WINDOW, len(ids) - 1, ends[j + 1] - 1 if j + 1 < len(ends) else len(ids))
            targets += [(p, [end]) for p in range(end + 1, stop + 1)]
        return targets

    def _question_targets(self, prompt: list[int], ids: list[int], turn_start: int,
                          response_start: int, qa: Any) -> list[Retrieval]:
        """The question's positions after its key, up to (not including) the one that
        produces the first answer token → the context sentence stating the fact."""
        if not qa.fact:
            return []
        fact_ids = self._encode(qa.fact)
        n = len(fact_ids)
        where = [j for j in range(len(prompt) - n + 1) if prompt[j:j + n] == fact_ids]
        ends = [e for e in self._key_ends(ids[:response_start], qa.key) if e >= turn_start]
        if not where or not ends:
            return []
        span = [p for j in where for p in range(j, j + n)]
        return [(p, span) for p in range(ends[0] + 1, response_start - 1)]

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def _fact_sources(self, prompt: list[int], response: list[int], qa: Any) -> dict[int, list[int]]:
        """For each response token that states the fact (its key, its value), where that
        token stands in the prompt: every occurrence of the key token, and the value's
        tokens at the occurrence of the value that follows the key."""
        sources: dict[int, list[int]] = {}
        key_ids = self._encode(qa.key)
        if len(key_ids) == 1:
            where = [j for j, t in enumerate(prompt) if t == key_ids[0]]
            for offset, token in enumerate(response):
                if token == key_ids[0] and where:
                    sources[offset] = where
        value_ids = self._encode(qa.answer)
        n = len(value_ids)
        starts = [j for j in range(len(prompt) - n + 1) if prompt[j:j + n] == value_ids]
        near_key = [j for j in starts if any(t in key_ids for t in prompt[max(0, j - 8):j])]
        starts = near_key or starts
        for offset in range(len(response) - n + 1):
            if response[offset:offset + n] == value_ids and starts:
                for k in range(n):
                    sources[offset + k] = [j + k for j in starts]
        return sources

    def _lm(self, rng: random.Random) -> int:
        return AUX if rng.random() < self.lm_fraction else NONE

    # ------------------------------------------------------------------ batch
    def batch(self, phase: Phase, seed: int, step: int) -> Batch:
        rng = random.Random(f"kvcert-train:{seed}:{step}")
        low, high = phase.lengths
        length = rng.randint(low, high)
        size = max(1, phase.tokens_per_batch // length)
        names = sorted(phase.task_weights)
        kinds = rng.choices(names, weights=[phase.task_weights[n] for n in names], k=size)
        rows: list[Sequence_] = []
        for j, kind in enumerate(kinds):
            if kind == "copy":
                rows.append(self.copy_sequence(rng, length, phase.copy_segment))
            else:
                rows.append(self.task_sequence(rng, kind, length, TRAIN_SEED_OFFSET + seed,
                                               step * 64 + j, phase.max_facts))
        width = max(len(r.ids) for r in rows)
        input_ids = torch.full((size, width), self.tokenizer.pad_token_id, dtype=torch.long)
        roles = torch.zeros((size, width), dtype=torch.uint8)
        retrieval, entity, question = [], [], []
        for row, seq in enumerate(rows):
            input_ids[row, : len(seq.ids)] = torch.tensor(seq.ids)
            roles[row, : len(seq.roles)] = torch.tensor(seq.roles, dtype=torch.uint8)
            retrieval += [(row, query, positions) for query, positions in seq.retrieval]
            entity += [(row, query, positions) for query, positions in seq.entity]
            question += [(row, query, positions) for query, positions in seq.question]
        return Batch(input_ids, roles, retrieval, kinds, entity, question)


def chain_digest(previous: str, batch_digest: str) -> str:
    """Hash chain over batches: the training-data SHA-256 after one more batch."""
    return hashlib.sha256(f"{previous}:{batch_digest}".encode()).hexdigest()


def phase_at(phases: Sequence[Phase], step: int) -> Phase:
    """The phase that step ``step`` (0-based) belongs to."""
    for phase in phases:
        if step < phase.steps:
            return phase
        step -= phase.steps
    raise IndexError("step beyond the last phase")
