"""The rehearsal's synthetic world: facts about people, and the prose that hides them.

The stand-in data sets (:mod:`kvcert.rehearsal.longbench_files`,
:mod:`kvcert.rehearsal.locomo_file`) and the tokenizers trained for the stand-in
checkpoints (:mod:`kvcert.rehearsal.checkpoints`) all draw their text from here, so a
tokenizer trained on :func:`corpus` covers the prompts of every task it will see. Every
function takes a ``random.Random`` and is deterministic given its state.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from ..tasks.wordlists import CITIES, COLORS, FOODS, INSTRUMENTS, JOBS, PEOPLE, PETS, TOPICS

#: filler sentences, drawn with replacement to pad a document to its length
FILLER: tuple[str, ...] = (
    "The committee met again in the spring to review the records of the previous year.",
    "Several witnesses described the weather on that day as unusually calm.",
    "Later reports added little to what was already known about the matter.",
    "The archive holds letters, maps and a number of photographs from the period.",
    "Most of the early accounts were written by travellers passing through the region.",
    "A small museum near the old station now shows part of the collection.",
    "Local newspapers followed the story for several weeks before it faded.",
    "The road along the river was rebuilt twice during the following decade.",
    "Historians still disagree about the order in which these events took place.",
    "A second edition of the book appeared with a new preface and an index.",
    "The survey counted farms, mills and workshops in every village of the valley.",
    "Visitors often remark on the quiet streets and the long evening light.",
)


@dataclass(frozen=True)
class Fact:
    """One checkable statement: ``sentence`` states it, ``question`` asks for ``answer``."""

    sentence: str
    question: str
    answer: str
    person: str


def fact(rng: random.Random) -> Fact:
    """A random fact about a random person, in one of five shapes."""
    person = rng.choice(PEOPLE)
    shape = rng.randrange(5)
    if shape == 0:
        city = rng.choice(CITIES)
        return Fact(f"{person} moved to {city} after finishing school.", f"Where did {person} move after school?",
                    city, person)
    if shape == 1:
        job = rng.choice(JOBS)
        return Fact(f"For many years {person} worked as a {job}.", f"What did {person} work as?", job, person)
    if shape == 2:
        pet = rng.choice(PETS)
        colour = rng.choice(COLORS)
        return Fact(f"{person} keeps a {colour} {pet} at home.", f"What pet does {person} keep?",
                    f"a {colour} {pet}", person)
    if shape == 3:
        instrument = rng.choice(INSTRUMENTS)
        return Fact(f"{person} learned to play the {instrument} as a child.",
                    f"Which instrument did {person} learn to play?", instrument, person)
    year = rng.randrange(1890, 2020)
    return Fact(f"{person} was born in {year}.", f"In which year was {person} born?", str(year), person)


def filler(rng: random.Random, words: int) -> list[str]:
    """Filler sentences adding up to about ``words`` words."""
    out, count = [], 0
    while count < words:
        sentence = rng.choice(FILLER)
        out.append(sentence)
        count += len(sentence.split())
    return out


def title(rng: random.Random) -> str:
    """A passage title: a person, a place or a topic."""
    return rng.choice((rng.choice(PEOPLE), rng.choice(CITIES).title(), rng.choice(TOPICS).title()))


def chat_line(rng: random.Random) -> str:
    """A line of small talk for the conversations."""
    topic, food = rng.choice(TOPICS), rng.choice(FOODS)
    return rng.choice((
        f"I have been reading a lot about {topic} lately.",
        f"We cooked {food} for dinner yesterday and it was great.",
        f"How was your week? Mine was busy with {topic}.",
        "That sounds wonderful, tell me more about it!",
        f"I tried a new recipe with {food}, it turned out well.",
        "Thanks for asking, things are going fine here.",
    ))


def corpus(rng: random.Random, sentences: int = 400) -> list[str]:
    """Sample text of every kind above (tokenizer training material)."""
    out = list(FILLER)
    for _ in range(sentences):
        item = fact(rng)
        out += [item.sentence, item.question, item.answer, title(rng), chat_line(rng)]
    return out
