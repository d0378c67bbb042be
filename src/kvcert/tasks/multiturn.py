"""Multi-turn assistant recall: a conversation of up to 30 turns in which the user
states codes to remember ("my locker code is 4821"); the final question asks for one
of them 1–30 turns after it was stated.

The conversation is a transcript ("User: ...\\nAssistant: ...") inside the context;
turns that state no fact are small talk, padded with further assistant sentences until
the prompt reaches the target length. ``num_turns`` defaults to one turn per ~68 tokens
(4 to 30 turns); the queried fact's ``turn_distance`` (question turn minus fact turn)
covers 1..``num_turns`` in balanced blocks unless fixed. Scored by recall of the value.

The drawn conversation (:func:`conversation`) is shared with ``multiturn_chat``
(:mod:`kvcert.tasks.multiturn_chat`), which renders the same turns as chat messages.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kvcert.tasks.lengths import fit_filler
from kvcert.tasks.prompting import measured
from kvcert.tasks.records import QuestionAnswer, TaskRecord
from kvcert.tasks.sampling import balanced_pick, example_rng, generator
from kvcert.tasks.wordlists import CITIES, CODE_ITEMS, FOODS, PEOPLE, TOPICS, WEEKDAYS

TASK = "multiturn"
MAX_TURNS = 30
TOKENS_PER_TURN = 68
DEFAULT_FACTS = 4  # codes stated per conversation (at most num_turns - 1)
HEADER = "Below is a conversation between a user and an assistant."
TURN_TEMPLATE = "User: {user}\nAssistant: {assistant}"
FACT_USER = "By the way, my {item} code is {value}. Please remember it."
FACT_ASSISTANT = "Noted, I will remember that."
QUESTION = "Based on the conversation above, what is my {item} code? Only give me the code."
RESPONSE = "Your {item} code is {value}"

SMALL_TALK: tuple[tuple[str, str], ...] = (
    ("Can you recommend a good book about {topic}?",
     "Sure. A short introduction to {topic} is a good place to start."),
    ("What should I cook for dinner tonight? Maybe some {food}.",
     "Some {food} sounds like a fine choice for a quiet evening."),
    ("I am planning a trip to {city} next {weekday}. Any tips?",
     "{city} is lovely at this time of year. Book your hotel early."),
    ("How can I get better at {topic}?",
     "Practice a little every day and keep notes on what you learn about {topic}."),
    ("My friend {person} wants to learn {topic}. Where should they start?",
     "{person} could join a local club and learn {topic} with other beginners."),
    ("Do you think it will rain on {weekday}?",
     "I cannot see the forecast, but it is wise to carry an umbrella on {weekday}."),
    ("I had {food} for lunch today and it was great.",
     "I am glad you enjoyed the {food}."),
    ("Can you help me plan my {weekday} schedule?",
     "Of course. Start with the most important task in the morning."),
    ("I want to write a short story about {city}.",
     "A story set in {city} could start with a walk through the old streets."),
    ("What is a good hobby for a rainy {weekday}?",
     "On a rainy {weekday} you could try {topic} at home."),
)

PADDING: tuple[str, ...] = (
    "It helps to take small steps and to rest when you feel tired.",
    "Many people find that a clear plan makes the day easier.",
    "Let me know if you would like more ideas later.",
    "You can always change the plan if something comes up.",
    "A short walk outside can also help you think more clearly.",
    "Try to keep things simple at first and add details later.",
    "It is often useful to write down what you want to achieve.",
    "Friends and family can be a great source of advice as well.",
    "Remember to drink enough water during the day.",
    "There is no need to hurry, so take your time.",
    "Good preparation usually saves time in the end.",
    "I am happy to help with anything else you need.",
)


def default_num_turns(target_tokens: int) -> int:
    """One turn per ``TOKENS_PER_TURN`` tokens, between 4 and 30."""
    return max(4, min(MAX_TURNS, round(target_tokens / TOKENS_PER_TURN)))


def _small_talk(rng: Any) -> tuple[str, str]:
    user, assistant = rng.choice(SMALL_TALK)
    slots = {
        "topic": rng.choice(TOPICS),
        "food": rng.choice(FOODS),
        "city": rng.choice(CITIES),
        "weekday": rng.choice(WEEKDAYS),
        "person": rng.choice(PEOPLE),
    }
    return user.format(**slots), assistant.format(**slots)


@dataclass
class Conversation:
    """One record's drawn conversation before padding: ``turns`` (user, assistant) in order,
    numbered from 1, and the ``facts`` stated in them (the queried one first, in turn
    ``fact_turn``, ``turn_distance`` turns before the question).

    :meth:`padded` appends ``n`` padding sentences to the small-talk replies, round robin
    over ``padded_turns`` and drawn in order from the record's own padding stream, so a
    given ``n`` gives the same turns whatever was asked before. The ``multiturn`` record
    writes the padded turns as a transcript; ``multiturn_chat`` as chat messages."""

    num_turns: int
    num_facts: int
    fact_turn: int
    turn_distance: int
    facts: list[dict[str, Any]]
    turns: list[tuple[str, str]]
    padded_turns: list[int]
    padding_rng: Any
    padding: list[str] = field(default_factory=list)

    @property
    def question(self) -> str:
        return QUESTION.format(item=self.facts[0]["item"])

    @property
    def answers(self) -> list[str]:
        return [self.facts[0]["value"]]

    def metadata(self, target_tokens: int) -> dict[str, Any]:
        """The record's metadata (see :class:`~kvcert.tasks.records.TaskRecord`)."""
        return {
            "target_tokens": target_tokens,
            "num_turns": self.num_turns,
            "fact_turn": self.fact_turn,
            "turn_distance": self.turn_distance,
            "num_facts": self.num_facts,
            "facts": self.facts,
        }

    def padded(self, n: int) -> list[tuple[str, str]]:
        """The turns with ``n`` padding sentences added to the small-talk replies."""
        while len(self.padding) < n:
            self.padding.append(self.padding_rng.choice(PADDING))
        extra: dict[int, list[str]] = {}
        for j in range(n):
            extra.setdefault(self.padded_turns[j % len(self.padded_turns)], []).append(self.padding[j])
        return [(user, " ".join([assistant, *extra.get(turn, [])]))
                for turn, (user, assistant) in enumerate(self.turns, start=1)]


def conversation(
    target_tokens: int,
    seed: int,
    index: int,
    num_turns: int | None = None,
    num_facts: int | None = None,
    turn_distance: int | None = None,
) -> Conversation:
    """The conversation of example ``index`` (seeded by ``seed`` under this task's name, so
    ``multiturn`` and ``multiturn_chat`` draw the same one).

    Turns are numbered 1..``num_turns``; the question is turn ``num_turns + 1`` and
    the queried fact sits in turn ``num_turns + 1 - turn_distance``; ``num_facts``
    codes are stated in all (default: 4, at most ``num_turns - 1``).
    """
    num_turns = default_num_turns(target_tokens) if num_turns is None else num_turns
    if not 2 <= num_turns <= MAX_TURNS:
        raise ValueError(f"num_turns must be in 2..{MAX_TURNS}, got {num_turns}")
    num_facts = min(DEFAULT_FACTS, num_turns - 1) if num_facts is None else num_facts
    # at least one small-talk turn must remain: those turns carry the padding
    if not 1 <= num_facts <= min(num_turns - 1, len(CODE_ITEMS)):
        raise ValueError(
            f"num_facts must be in 1..{min(num_turns - 1, len(CODE_ITEMS))} for "
            f"{num_turns} turns, got {num_facts}"
        )
    if turn_distance is None:
        turn_distance = balanced_pick(range(1, num_turns + 1), seed, TASK, index)
    if not 1 <= turn_distance <= num_turns:
        raise ValueError(f"turn_distance must be in 1..{num_turns}, got {turn_distance}")
    rng = example_rng(seed, TASK, index)
    fact_turn = num_turns + 1 - turn_distance
    other_turns = rng.sample([t for t in range(1, num_turns + 1) if t != fact_turn], num_facts - 1)
    items = rng.sample(CODE_ITEMS, num_facts)
    values: list[str] = []
    while len(values) < num_facts:
        value = str(rng.randint(1000, 9999))
        if value not in values:
            values.append(value)
    facts = [
        {"item": item, "value": value, "turn": turn}
        for item, value, turn in zip(items, values, [fact_turn, *other_turns])
    ]
    by_turn = {f["turn"]: f for f in facts}
    turns: list[tuple[str, str]] = []
    for turn in range(1, num_turns + 1):
        if turn in by_turn:
            fact = by_turn[turn]
            turns.append((FACT_USER.format(item=fact["item"], value=fact["value"]), FACT_ASSISTANT))
        else:
            turns.append(_small_talk(rng))
    padded_turns = [t for t in range(1, num_turns + 1) if t not in by_turn]
    rng.shuffle(padded_turns)
    return Conversation(num_turns, num_facts, fact_turn, turn_distance, facts, turns, padded_turns,
                        example_rng(seed, TASK, index, stream="padding"))


def record_id(task: str, seed: int, target_tokens: int, num_turns: int, index: int) -> str:
    return f"{task}-s{seed}-t{target_tokens}-n{num_turns}-{index}"


def make_record(tokenizer: Any, target_tokens: int, seed: int, index: int, **options: Any) -> TaskRecord:
    """One multi-turn recall record of about ``target_tokens`` prompt tokens: the
    conversation (:func:`conversation`, whose ``num_turns``, ``num_facts`` and ``turn_distance`` are the
    ``options``) as a transcript after :data:`HEADER`, in the context of one user message."""
    talk = conversation(target_tokens, seed, index, **options)

    def make_context(n: int) -> str:
        lines = [HEADER, ""]
        for user, reply in talk.padded(n):
            lines.append(TURN_TEMPLATE.format(user=user, assistant=reply))
        return "\n".join(lines)

    context, _, _ = fit_filler(tokenizer, make_context, talk.question, target_tokens)
    record = TaskRecord(
        id=record_id(TASK, seed, target_tokens, talk.num_turns, index),
        task=TASK,
        context=context,
        question=talk.question,
        answers=talk.answers,
        metadata=talk.metadata(target_tokens),
    )
    return measured(tokenizer, record)


#: ``n_examples`` multi-turn records (options: ``num_turns``, ``num_facts``, ``turn_distance``).
generate = generator(make_record)


def questions_for(record: TaskRecord) -> list[QuestionAnswer]:
    """A question, answer and reference response per stated code; the queried one first."""
    return [QuestionAnswer(QUESTION.format(item=f["item"]), f["value"],
                           RESPONSE.format(item=f["item"], value=f["value"]), f["item"],
                           fact=FACT_USER.format(item=f["item"], value=f["value"]))
            for f in record.metadata["facts"]]


def vocabulary_texts() -> list[str]:
    """Every string this task can put into a prompt, for building a word-level vocabulary."""
    texts = [HEADER, TURN_TEMPLATE.format(user="", assistant=""), FACT_USER.format(item="", value=""),
             FACT_ASSISTANT, QUESTION.format(item=""), RESPONSE.format(item="", value=""), *PADDING, *CODE_ITEMS, *TOPICS, *FOODS,
             *CITIES, *WEEKDAYS, *PEOPLE]
    for user, assistant in SMALL_TALK:
        slots = dict.fromkeys(["topic", "food", "city", "weekday", "person"], "")
        texts += [user.format(**slots), assistant.format(**slots)]
    return texts
