"""Multi-key QA: several facts about different people scattered through a long text,
one question about one of them (the small-scale stand-in for LongBench QA).

Facts ("Nora lives in Lisbon.", "The favorite color of Ivan is teal.", ...) are placed
at random depths of a filler text drawn from a pool of neutral sentences; the queried
fact's depth covers ``depths`` in balanced blocks. ``haystack="prose"`` (the task
``multikey_prose``) draws the filler from Python's own prose instead of the pool: a passage of
consecutive sentences per prompt (:mod:`kvcert.tasks.prose`), the facts, people and depths those
of the pool's record of the same seed and index. The prompt follows LongBench's
multifieldqa_en template (instruction, text, then "Question: ...\\nAnswer:"). Answers are single words;
scored by token recall.
"""

from __future__ import annotations

from typing import Any, Sequence

from kvcert.tasks.lengths import fit_filler
from kvcert.tasks.needle import prose_lines, task_name
from kvcert.tasks.prompting import measured
from kvcert.tasks.records import QuestionAnswer, TaskRecord
from kvcert.tasks.sampling import example_rng, generator, placement_depths
from kvcert.tasks.wordlists import CITIES, COLORS, INSTRUMENTS, JOBS, PEOPLE, PETS

TASK = "multikey"
# LongBench's multifieldqa_en prompt, split where the question part begins.
CONTEXT_TEMPLATE = "Read the following text and answer briefly.\n\n{text}"
QUESTION_TEMPLATE = (
    "Now, answer the following question based on the above text, only give me the "
    "answer and do not output any other words.\n\nQuestion: {question}\nAnswer:"
)

#: relation -> (fact template, question template, value pool)
RELATIONS: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "city": ("{person} lives in {value}.", "In which city does {person} live?", CITIES),
    "job": ("{person} works as a {value}.", "What is the job of {person}?", JOBS),
    "color": (
        "The favorite color of {person} is {value}.",
        "What is the favorite color of {person}?",
        COLORS,
    ),
    "pet": ("{person} has a pet {value}.", "What kind of pet does {person} have?", PETS),
    "instrument": (
        "{person} plays the {value}.",
        "Which instrument does {person} play?",
        INSTRUMENTS,
    ),
}

FILLER: tuple[str, ...] = (
    "The committee met on a rainy morning to review the annual budget.",
    "Several new buildings were finished near the old market last year.",
    "The library extended its opening hours during the exam period.",
    "A small bakery on the corner sells bread until late in the evening.",
    "The train to the coast leaves every hour from the central station.",
    "Local farmers brought fresh vegetables to the weekend market.",
    "The museum opened a new exhibition about ancient maps and travel.",
    "Heavy snow closed the mountain road for two days.",
    "The school choir gave a concert in the town hall.",
    "Engineers inspected the bridge and found it in good condition.",
    "A new bicycle lane now runs along the river.",
    "The annual festival attracted visitors from many countries.",
    "The garden behind the hospital is open to the public on weekends.",
    "A storm damaged several boats in the harbor overnight.",
    "The council approved a plan to plant more trees in the park.",
    "The old factory was turned into a center for young artists.",
    "Students collected books for the children of the village.",
    "The weather was mild and sunny for most of the week.",
    "A group of volunteers cleaned the beach on Saturday.",
    "The price of coffee rose slowly over the summer.",
    "The city orchestra is preparing a program of classical music.",
    "Workers repaired the roof of the old church before the winter.",
    "The island can only be reached by ferry in the spring.",
    "Many families spend their holidays at the lake in August.",
    "The newspaper published a long article about the history of the town.",
    "A quiet path leads from the village to the top of the hill.",
    "The new restaurant serves food from many different regions.",
    "The football team won its third match in a row.",
    "An old map of the region hangs in the main hall of the library.",
    "The bus company added an evening route to the airport.",
    "Most shops in the old town close early on Sunday.",
    "The hospital hired more nurses for the night shift.",
    "A famous writer gave a talk at the university last month.",
    "The river flooded part of the valley after days of rain.",
    "The zoo welcomed two young elephants in the autumn.",
    "The company moved its offices to a larger building downtown.",
    "Children played in the square until the lights came on.",
    "The mayor announced a new plan for public transport.",
    "The harvest was better than expected this year.",
    "A new bridge will connect the two parts of the city.",
)

DEPTHS: tuple[int, ...] = tuple(range(0, 101, 10))


def make_record(
    tokenizer: Any,
    target_tokens: int,
    seed: int,
    index: int,
    num_facts: int = 8,
    depth: float | None = None,
    depths: Sequence[float] = DEPTHS,
    haystack: str = "pool",
) -> TaskRecord:
    """One multi-key QA record of about ``target_tokens`` prompt tokens (``haystack``: ``pool``, the neutral
    sentences of :data:`FILLER`, or ``prose``)."""
    if haystack not in ("pool", "prose"):
        raise ValueError(f"haystack: {haystack!r} is not one of ('pool', 'prose')")
    if num_facts < 1 or num_facts > len(PEOPLE):
        raise ValueError(f"num_facts must be in 1..{len(PEOPLE)}, got {num_facts}")
    rng = example_rng(seed, TASK, index)
    people = rng.sample(PEOPLE, num_facts)
    relations = sorted(RELATIONS)
    facts = []
    for person in people:
        relation = rng.choice(relations)
        value = rng.choice(RELATIONS[relation][2])
        facts.append({"person": person, "relation": relation, "value": value})
    fact_depths = placement_depths(rng, num_facts, depth, depths, seed, TASK, index)
    query_depth = fact_depths[0]
    for fact, fact_depth in zip(facts, fact_depths):
        fact["depth"] = fact_depth
    filler_rng = example_rng(seed, TASK, index, stream="filler")
    filler: list[str] = []
    passage = prose_lines(TASK, seed, index) if haystack == "prose" else None

    def make_context(n: int) -> str:
        if passage is not None and len(filler) < n:
            filler[:] = passage[:n]
        while len(filler) < n:
            filler.append(filler_rng.choice(FILLER))
        inserts = sorted(
            (round(f["depth"] / 100.0 * n), order, _fact_text(f)) for order, f in enumerate(facts)
        )
        out: list[str] = []
        cursor = 0
        for position, _, text in inserts:
            out.extend(filler[cursor:position])
            out.append(text)
            cursor = position
        out.extend(filler[cursor:n])
        return CONTEXT_TEMPLATE.format(text=" ".join(out))

    question = _question_text(facts[0])
    context, _, _ = fit_filler(tokenizer, make_context, question, target_tokens)
    name = task_name(TASK, haystack)
    extra = {} if haystack == "pool" else {"haystack": haystack}  # the pool's records as they were
    record = TaskRecord(
        id=f"{name}-s{seed}-t{target_tokens}-f{num_facts}-{index}",
        task=name,
        context=context,
        question=question,
        answers=[facts[0]["value"]],
        metadata={
            "target_tokens": target_tokens,
            "depth": query_depth,
            "num_facts": num_facts,
            "relation": facts[0]["relation"],
            "facts": facts,
            **extra,
        },
    )
    return measured(tokenizer, record)


def _fact_text(fact: dict[str, Any]) -> str:
    return RELATIONS[fact["relation"]][0].format(person=fact["person"], value=fact["value"])


def _question_text(fact: dict[str, Any]) -> str:
    question = RELATIONS[fact["relation"]][1].format(person=fact["person"])
    return QUESTION_TEMPLATE.format(question=question)


#: ``n_examples`` multi-key QA records (options: ``num_facts``, ``depth``, ``depths``, ``haystack``).
generate = generator(make_record)


def questions_for(record: TaskRecord) -> list[QuestionAnswer]:
    """A question, answer and reference response (the fact restated) per fact; the
    queried fact first."""
    return [QuestionAnswer(_question_text(f), f["value"], _fact_text(f).rstrip("."), f["person"],
                           fact=_fact_text(f))
            for f in record.metadata["facts"]]


def vocabulary_texts() -> list[str]:
    """Every string this task can put into a prompt, for building a word-level vocabulary."""
    texts = [CONTEXT_TEMPLATE.format(text=""), QUESTION_TEMPLATE.format(question=""),
             *FILLER, *PEOPLE]
    for fact, question, values in RELATIONS.values():
        texts += [fact.format(person="", value=""), question.format(person=""), *values]
    return texts
