"""What the official LongBench v1 code does, for the golden tests (not a test module).

``OFFICIAL_PROMPT_SHA256`` and ``OFFICIAL_MAXLEN`` were read from THUDM/LongBench's
``config/dataset2prompt.json`` and ``config/dataset2maxlen.json``; :func:`official_truncation`
restates ``pred.py``'s truncation in its own words (tests/test_conventions.py checks
kvcert against both; tests/test_rehearsal.py checks the rehearsal's prompts).
"""

from __future__ import annotations

# SHA-256 (first 16 hex digits) of each template of the official config/dataset2prompt.json
OFFICIAL_PROMPT_SHA256 = {
    "narrativeqa": "aada7ed24b06abac", "qasper": "0fbdd123fe7f83d6", "multifieldqa_en": "20b4666a2de8a1f7",
    "multifieldqa_zh": "344b3a4e557cd547", "hotpotqa": "9ec4ae308865bd0c", "2wikimqa": "9ec4ae308865bd0c",
    "musique": "9ec4ae308865bd0c", "dureader": "ae53329f51b17908", "gov_report": "91c25d585b189ced",
    "qmsum": "dca23b678fe0183b", "multi_news": "2af3f28c40b902e6", "vcsum": "3e5d8241bc9b512e",
    "trec": "0eff8bebdba99d91", "triviaqa": "00a802e6377e72fc", "samsum": "a68d884234907eef",
    "lsht": "f3edabdf7fae53d6", "passage_count": "986550b6c61009c6", "passage_retrieval_en": "39b96b7fa52bdd2a",
    "passage_retrieval_zh": "c1e2346e245eb365", "lcc": "6a1f24cf0bb83cd9", "repobench-p": "ee9ec182ea5ffeb7",
}
# config/dataset2maxlen.json
OFFICIAL_MAXLEN = {
    "narrativeqa": 128, "qasper": 128, "multifieldqa_en": 64, "multifieldqa_zh": 64, "hotpotqa": 32,
    "2wikimqa": 32, "musique": 32, "dureader": 128, "gov_report": 512, "qmsum": 512, "multi_news": 512,
    "vcsum": 512, "trec": 64, "triviaqa": 32, "samsum": 128, "lsht": 64, "passage_count": 32,
    "passage_retrieval_en": 32, "passage_retrieval_zh": 32, "lcc": 64, "repobench-p": 64,
}


def official_truncation(tokenizer, prompt: str, max_length: int) -> str:
    """pred.py's rule, restated: ids with special tokens; above max_length, the decoded
    first and last int(max_length/2) ids (special tokens skipped), joined."""
    ids = tokenizer(prompt, truncation=False).input_ids
    if len(ids) > max_length:
        half = int(max_length / 2)
        return tokenizer.decode(ids[:half], skip_special_tokens=True) + tokenizer.decode(ids[-half:], skip_special_tokens=True)
    return prompt


# pred.py: the datasets whose prompt is tokenized without the chat model's wrapper
OFFICIAL_NO_CHAT = ("trec", "triviaqa", "samsum", "lsht", "lcc", "repobench-p")
# pred.py --e: the LongBench-E datasets (read as "<dataset>_e")
OFFICIAL_E_DATASETS = ("qasper", "multifieldqa_en", "hotpotqa", "2wikimqa", "gov_report", "multi_news", "trec",
                       "triviaqa", "samsum", "passage_count", "passage_retrieval_en", "lcc", "repobench-p")


def official_input_ids(tokenizer, prompt: str, max_length: int) -> list[int]:
    """pred.py's model input for a dataset of OFFICIAL_NO_CHAT: the truncated prompt, no chat
    wrapper, tokenized with the tokenizer's special tokens."""
    return list(tokenizer(official_truncation(tokenizer, prompt, max_length), truncation=False).input_ids)


def official_greedy(step_logits, eos_ids: list[int], min_new: int, max_new: int) -> list[int]:
    """What ``model.generate(do_sample=False, num_beams=1, eos_token_id=eos_ids,
    min_length=prompt + min_new)`` returns after the prompt, restated: while fewer than
    ``min_new`` tokens are out, every id of ``eos_ids`` scores −inf; the greedy token is
    appended and ends the answer when it is one of ``eos_ids``. ``step_logits(i)`` gives
    the logits of the i-th new token."""
    out: list[int] = []
    for i in range(max_new):
        logits = list(step_logits(i))
        if len(out) < min_new:
            for e in eos_ids:
                logits[e] = float("-inf")
        best = max(range(len(logits)), key=logits.__getitem__)
        out.append(best)
        if best in eos_ids:
            break
    return out
