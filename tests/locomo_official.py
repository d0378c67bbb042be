"""What snap-research/locomo's ``task_eval/hf_llm_utils.py`` builds as the context, restated for
the golden tests (not a test module; none of the upstream code is copied).

``get_input_context`` walks the sessions from the first to the last number present; each
session's turns are visited last to first and put in front of what was built, then the
session's ``DATE`` / ``CONVERSATION`` header in front of those — so the text holds the
sessions newest first, each with its turns in order. A turn is the speaker, `` said, "``,
the text, ``"`` and a newline, then `` and shared <caption>.`` when the turn has a
``blip_caption`` key, then a newline. The preamble names the speakers. Without a context
window to fit (kvcert keeps the whole conversation) nothing is dropped.
"""

from __future__ import annotations

PREAMBLE = ("Below is a conversation between two people: {} and {}. The conversation takes place over multiple "
            "days and the date of each conversation is wriiten at the beginning of the conversation.\n\n")


def official_context(conversation: dict, speakers: tuple[str, str]) -> str:
    numbers = [int(key.split("_")[-1]) for key in conversation if "session" in key and "date_time" not in key]
    built = ""
    for number in range(min(numbers), max(numbers) + 1):
        name = f"session_{number}"
        if name not in conversation:
            continue
        for turn in reversed(conversation[name]):
            text = turn["speaker"] + ' said, "' + turn["text"] + '"' + "\n"
            if "blip_caption" in turn:
                text += " and shared " + turn["blip_caption"] + "."
            built = text + "\n" + built
        built = "\nDATE: " + conversation[name + "_date_time"] + "\nCONVERSATION:\n" + built
    return PREAMBLE.format(*speakers) + built
