"""Training sequences for the embedded model, generated on the fly from the task
generators.

Two kinds of sequence:

- **copy**: random segments of vocabulary tokens, each repeated until the sequence is
  full; next-token loss on the repeats. This grows induction heads quickly, the
  prerequisite for retrieval.
- **task**: a record of one of the synthetic tasks (needle, multi-key QA, multi-turn)
  rendered through the chat template, answered, and followed by further chat turns
  asking about the record's other facts ("many queries per sequence"). The answer is
  the task's reference response, which restates the fact before its value ("The
  special magic number for pocket is: 1557755"): the value then follows the same
  tokens as in the context, so retrieval becomes an induction step. Loss on every
  response token (and the closing ``<|end|>``), plus a down-weighted next-token loss
  on a random subset of the other tokens.

A batch carries a *role* per token: 0 no loss, 1 answer token, 2 auxiliary next-token
target (copy repeats, sampled context tokens); the training loop weighs the two
losses separately.

Everything a batch contains is a function of (seed, step): resuming at a step rebuilds
exactly the batches an uninterrupted run would have seen. Training records use
generator seeds at or above :data:`TRAIN_SEED_OFFSET`; evaluation uses seeds below it.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass
from typing import Any, Sequence

import torch

from kvcert.tasks import multikey, multiturn, needle
from kvcert.tasks.prompting import build_prompt_ids, encode_rendered, render_chat, user_message

TRAIN_SEED_OFFSET = 1_000_000
NONE, ANSWER, AUX = 0, 1, 2

TASK_MODULES = {"needle": needle, "multikey": multikey, "multiturn": multiturn}


@dataclass(frozen=True)
class Phase:
    """A stretch of training with one data mixture.

    ``steps``: how many optimizer steps; ``lengths``: (min, max) target tokens, drawn
    per batch; ``tokens_per_batch``: batch size in tokens (sequences = this // length);
    ``task_weights``: relative frequency of "copy" and of each task name.
    """

    steps: int
    lengths: tuple[int, int]
    tokens_per_batch: int
    task_weights: dict[str, float]


# Per-task option ranges for training records (the evaluation defaults lie inside).
TRAIN_OPTIONS = {
    "needle": lambda rng, length: {"num_needles": rng.randint(1, 8)},
    "multikey": lambda rng, length: {"num_facts": rng.randint(2, 12)},
    "multiturn": lambda rng, length: {
        "num_facts": rng.randint(1, min(6, multiturn.default_num_turns(length) - 1))
    },
}


@dataclass
class Batch:
    input_ids: torch.Tensor  # (B, T) long, right-padded
    roles: torch.Tensor  # (B, T) uint8: loss role of predicting input_ids[:, t] from t-1
    kinds: list[str]

    def digest(self) -> str:
        """SHA-256 of the token ids and loss weights (for the training-data hash)."""
        h = hashlib.sha256()
        h.update(self.input_ids.numpy().tobytes())
        h.update(self.roles.numpy().tobytes())
        return h.hexdigest()


class SequenceBuilder:
    """Builds training sequences for one tokenizer."""

    def __init__(self, tokenizer: Any, lm_fraction: float = 0.25, max_questions: int = 8,
                 copy_vocab: int = 512):
        self.tokenizer = tokenizer
        self.lm_fraction = lm_fraction
        self.max_questions = max_questions
        special = set(tokenizer.all_special_ids)
        self.plain_ids = [i for i in range(len(tokenizer)) if i not in special]
        # copy segments draw from a fixed random subset: induction heads form several
        # times sooner than with the whole vocabulary, and then work for every token
        self.copy_ids = sorted(random.Random("kvcert-copy-vocab").sample(
            self.plain_ids, min(copy_vocab, len(self.plain_ids))))
        self.eos = tokenizer.eos_token_id

    # ------------------------------------------------------------------ copy
    def copy_sequence(self, rng: random.Random, length: int) -> tuple[list[int], list[int]]:
        """A random segment (a quarter to half the length) repeated until full."""
        size = rng.randint(max(2, length // 4), max(2, length // 2))
        segment = [rng.choice(self.copy_ids) for _ in range(size)]
        ids = [self.tokenizer.bos_token_id]
        roles = [NONE]
        while len(ids) < length:
            first = len(ids) == 1
            ids += segment
            # the first occurrence is unpredictable; so is the first token of a repeat
            roles += [NONE] * size if first else [NONE] + [AUX] * (size - 1)
        return ids[:length], roles[:length]

    # ------------------------------------------------------------------ task
    def task_sequence(self, rng: random.Random, task: str, length: int, seed: int,
                      index: int) -> tuple[list[int], list[int]]:
        options = TRAIN_OPTIONS[task](rng, length)
        module = TASK_MODULES[task]
        record = module.make_record(self.tokenizer, length, seed, index, **options)
        qas = module.questions_for(record)
        first, rest = qas[0], qas[1:]
        rng.shuffle(rest)
        qas = [first, *rest[: self.max_questions - 1]]
        ids, _ = build_prompt_ids(self.tokenizer, record)
        roles = [self._lm(rng) for _ in ids]
        roles[0] = NONE
        messages = [{"role": "user", "content": user_message(record.context, record.question)}]
        for turn, (question, _, answer) in enumerate(qas):
            if turn:
                messages.append({"role": "user", "content": question})
                prefix = encode_rendered(self.tokenizer, render_chat(self.tokenizer, messages))
                if prefix[: len(ids)] != ids:
                    raise ValueError("chat template is not prefix-stable across turns")
                new = prefix[len(ids):]
                ids += new
                roles += [self._lm(rng) for _ in new]
            answer_ids = list(self.tokenizer(answer, add_special_tokens=False)["input_ids"])
            ids += answer_ids + [self.eos]
            roles += [ANSWER] * (len(answer_ids) + 1)
            messages.append({"role": "assistant", "content": answer})
        return ids, roles

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
        rows = []
        for j, kind in enumerate(kinds):
            if kind == "copy":
                rows.append(self.copy_sequence(rng, length))
            else:
                rows.append(self.task_sequence(rng, kind, length, TRAIN_SEED_OFFSET + seed,
                                               step * 64 + j))
        width = max(len(ids) for ids, _ in rows)
        input_ids = torch.full((size, width), self.tokenizer.pad_token_id, dtype=torch.long)
        roles = torch.zeros((size, width), dtype=torch.uint8)
        for row, (ids, row_roles) in enumerate(rows):
            input_ids[row, : len(ids)] = torch.tensor(ids)
            roles[row, : len(row_roles)] = torch.tensor(row_roles, dtype=torch.uint8)
        return Batch(input_ids, roles, kinds)


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
