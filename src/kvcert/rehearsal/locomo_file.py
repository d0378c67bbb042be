"""A LoCoMo stand-in: synthetic conversations in the released ``locomo10.json`` schema.

Each sample is ``{"qa", "conversation", "event_summary", "observation",
"session_summary", "sample_id"}`` as in the release. The conversation holds
``speaker_a``, ``speaker_b`` and sessions ``session_<N>`` with their dates
``session_<N>_date_time`` ("1:56 pm on 8 May, 2023"); a turn is ``{"speaker", "dia_id",
"text"}`` (``D<session>:<turn>``), and a shared photo adds ``img_url`` (a list),
``blip_caption`` and ``query``. Facts are stated in turns; QA items ask about them in
all five categories, each with the ``evidence`` turn ids: a multi-hop answer lists two
facts joined by a comma (1), a temporal one is a session date (2), an open-domain one
adds a ``;`` explanation (3), a single-hop one is plain (4; one with an integer answer,
as the release has), and an adversarial item (5) carries ``adversarial_answer`` and no
``answer`` — as 444 of the release's 446 do.
"""

from __future__ import annotations

import random
from typing import Any

from ..tasks.wordlists import PEOPLE
from .text import chat_line, fact

MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August", "September",
          "October", "November", "December")


def _date(rng: random.Random, session: int) -> str:
    hour, minute = rng.randrange(1, 13), rng.randrange(60)
    return f"{hour}:{minute:02d} {rng.choice(('am', 'pm'))} on {session + 3} {MONTHS[session % 12]}, 2023"


def conversation(rng: random.Random, index: int, sessions: int, turns: int) -> dict[str, Any]:
    """One sample: ``sessions`` sessions of ``turns`` turns, and five QA items (one per category)."""
    speaker_a, speaker_b = rng.sample(PEOPLE, 2)
    conv: dict[str, Any] = {"speaker_a": speaker_a, "speaker_b": speaker_b}
    stated = []  # (fact, dia_id, session)
    for session in range(1, sessions + 1):
        conv[f"session_{session}_date_time"] = _date(rng, session)
        lines = []
        for turn in range(1, turns + 1):
            speaker = speaker_a if turn % 2 else speaker_b
            dia = f"D{session}:{turn}"
            line: dict[str, Any] = {"speaker": speaker, "dia_id": dia}
            if turn == 2 or (turn == turns and session == sessions):
                item = fact(rng)
                stated.append((item, dia, session))
                line["text"] = f"Guess what, {item.sentence[0].lower()}{item.sentence[1:]}"
            else:
                line["text"] = chat_line(rng)
            if turn == 3 and session == 1:
                line.update(img_url=[f"https://example.invalid/photo-{index}.jpg"],
                            blip_caption="a photo of a red bicycle", query="red bicycle")
            lines.append(line)
        conv[f"session_{session}"] = lines
    (first, dia1, s1), (second, dia2, _) = stated[0], stated[-1]
    qa = [
        {"question": f"{first.question} And {second.question[0].lower()}{second.question[1:]}",
         "answer": f"{first.answer}, {second.answer}", "evidence": [dia1, dia2], "category": 1},
        {"question": f"When did {speaker_a} talk about {first.person}?",
         "answer": conv[f"session_{s1}_date_time"].split(" on ")[1], "evidence": [dia1], "category": 2},
        {"question": f"Would {speaker_b} remember {second.person}?",
         "answer": "Likely yes; it came up in their talk", "evidence": [dia2], "category": 3},
        {"question": first.question, "answer": int(first.answer) if first.answer.isdigit() else first.answer,
         "evidence": [dia1], "category": 4},
        {"question": f"What did {speaker_b} adopt last year?", "evidence": [dia2], "category": 5,
         "adversarial_answer": "a puppy"},
    ]
    rng.shuffle(qa)
    summaries = {f"session_{s}_summary": f"{speaker_a} and {speaker_b} caught up." for s in range(1, sessions + 1)}
    return {
        "qa": qa,
        "conversation": conv,
        "event_summary": {f"events_session_{s}": {speaker_a: [], speaker_b: [], "date": conv[f"session_{s}_date_time"]}
                          for s in range(1, sessions + 1)},
        "observation": {f"session_{s}_observation": {speaker_a: [], speaker_b: []} for s in range(1, sessions + 1)},
        "session_summary": summaries,
        "sample_id": f"conv-{index + 1}",
    }


def samples(count: int, sessions: int, turns: int, seed: int = 0) -> list[dict[str, Any]]:
    """``count`` conversations (deterministic in ``seed``)."""
    rng = random.Random(f"{seed}:locomo")
    return [conversation(rng, index, sessions, turns) for index in range(count)]
