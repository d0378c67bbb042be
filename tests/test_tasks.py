"""Tests of the synthetic tasks: generators, prompts, metrics, record schema."""

from __future__ import annotations

import json

import pytest
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from kvcert.tasks import SYNTHETIC_TASKS, TASKS, TaskRecord, build_prompt_ids, is_correct, register_task, score
from kvcert.tasks import lookalike, metrics, multikey, multiturn, needle
from kvcert.training.tokenizer import ASSISTANT, BOS, EOS, UNK, USER  # the embedded model's chat specials
from kvcert.tasks.records import RecordError, read_jsonl, write_jsonl
from kvcert.training.tokenizer import build_tokenizer

LENGTH_TOLERANCE = 24  # tokens: less than one filler unit of any task


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer()


# ---------------------------------------------------------------- generators

@pytest.mark.parametrize("task", SYNTHETIC_TASKS)
def test_generators_are_deterministic_and_seeded(tok, task):
    first = TASKS[task].generate(tok, 4, 400, seed=7)
    again = TASKS[task].generate(tok, 4, 400, seed=7)
    other = TASKS[task].generate(tok, 4, 400, seed=8)
    assert [r.to_dict() for r in first] == [r.to_dict() for r in again]
    assert [r.context for r in first] != [r.context for r in other]
    assert len({r.id for r in first + other}) == 8
    # an example does not depend on how many were generated before it
    assert TASKS[task].generate(tok, 2, 400, seed=7)[1].to_dict() == first[1].to_dict()


@pytest.mark.parametrize("task", SYNTHETIC_TASKS)
@pytest.mark.parametrize("target", [300, 1024])
def test_target_length_within_tolerance(tok, task, target):
    for record in TASKS[task].generate(tok, 3, target, seed=1):
        ids, question_start = build_prompt_ids(tok, record)
        assert record.length == len(ids)
        room = target - record.metadata.get("answer_tokens", 0)  # RULER's answer reserve (needle tasks)
        assert room - LENGTH_TOLERANCE <= record.length <= room
        assert 0 < question_start < len(ids)
        assert tok.unk_token_id not in ids, "the word-level vocabulary misses a word"
        assert record.metadata["target_tokens"] == target


def test_target_too_small_is_an_error(tok):
    with pytest.raises(ValueError, match="too small"):
        needle.generate(tok, 1, 20, seed=0)


def test_needle_depth_and_answer(tok):
    shallow = needle.make_record(tok, 600, seed=3, index=0, depth=0)
    deep = needle.make_record(tok, 600, seed=3, index=0, depth=100)
    for record in (shallow, deep):
        value = record.answers[0]
        assert len(value) == 7 and value.isdigit()
        key = record.metadata["needles"][0]["key"]
        assert f"One of the special magic numbers for {key} is: {value}." in record.context
        assert key in record.question
    haystack_start = len(needle.INSTRUCTION) + 1
    assert shallow.context.index("One of the special") == haystack_start
    assert deep.context.endswith(f"is: {deep.answers[0]}.\n{needle.HAYSTACK}")  # before the last line, as RULER
    # distractor needles carry other keys and values
    multi = needle.make_record(tok, 800, seed=3, index=1, num_needles=4)
    values = [n["value"] for n in multi.metadata["needles"]]
    assert multi.metadata["num_needles"] == 4 and len(set(values)) == 4
    assert all(v in multi.context for v in values)
    assert multi.answers == [values[0]]


def test_needle_depths_cover_grid_in_blocks(tok):
    records = needle.generate(tok, len(needle.DEPTHS), 300, seed=5)
    assert sorted(r.metadata["depth"] for r in records) == sorted(float(d) for d in needle.DEPTHS)


def test_multikey_fact_in_context(tok):
    record = multikey.make_record(tok, 700, seed=2, index=3, num_facts=6)
    facts = record.metadata["facts"]
    assert len(facts) == 6 and len({f["person"] for f in facts}) == 6
    assert facts[0]["person"] in record.question
    assert record.answers == [facts[0]["value"]]
    for fact in facts:
        assert fact["person"] in record.context and fact["value"] in record.context
    assert record.question.endswith("Answer:")


def test_multiturn_turn_bookkeeping(tok):
    record = multiturn.make_record(tok, 1500, seed=4, index=0, num_turns=20, turn_distance=13)
    meta = record.metadata
    assert meta["num_turns"] == 20 and meta["turn_distance"] == 13 and meta["fact_turn"] == 8
    turns = record.context.split("\nUser: ")
    assert len(turns) - 1 == 20  # header, then one chunk per turn
    fact = meta["facts"][0]
    assert f"my {fact['item']} code is {fact['value']}." in turns[meta["fact_turn"]]
    assert fact["item"] in record.question and record.answers == [fact["value"]]
    turns_600 = multiturn.default_num_turns(600)
    distances = [r.metadata["turn_distance"] for r in multiturn.generate(tok, turns_600, 600, seed=1)]
    assert sorted(distances) == list(range(1, turns_600 + 1))


def test_multiturn_default_turns_scale_with_length():
    assert multiturn.default_num_turns(512) < multiturn.default_num_turns(2048) == 30


@pytest.mark.parametrize("task", SYNTHETIC_TASKS)
def test_questions_for_lists_every_fact(tok, task):
    module = {"needle": needle, "lookalike": lookalike, "multikey": multikey, "multiturn": multiturn}[task]
    record = TASKS[task].generate(tok, 1, 600, seed=9)[0]
    items = module.questions_for(record)
    assert items[0].question == record.question and items[0].answer == record.answers[0]
    assert items[0].answer_prefix == record.answer_prefix
    assert len({item.question for item in items}) == len(items) > 1 or task == "needle"
    for item in items:
        # the reference reply (after the answer prefix, if any) restates the fact's key
        # and scores as correct; the fact's sentence stands in the context
        restated = item.answer_prefix + item.response
        assert score(task, restated, [item.answer]) == 1.0
        assert item.key in restated and item.answer in item.fact
        assert item.fact in record.context


# ---------------------------------------------------------------- RULER conventions

def _ruler_single_needle(template: str) -> str:
    """RULER's niah.py rewrite of its template for one query with one value."""
    for old, new in (("Some", "A"), ("are all", "is"), ("are", "is"), ("answers", "answer")):
        template = template.replace(old, new)
    return template


# constants.py of NVIDIA/RULER, task "niah" (template and answer prefix, verbatim)
RULER_NIAH_TEMPLATE = (
    "Some special magic {type_needle_v} are hidden within the following text. Make sure to "
    "memorize it. I will quiz you about the {type_needle_v} afterwards.\n{context}\nWhat are all "
    "the special magic {type_needle_v} for {query} mentioned in the provided text?"
)
RULER_NIAH_ANSWER_PREFIX = " The special magic {type_needle_v} for {query} mentioned in the provided text are"
RULER_NOISE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."


@pytest.mark.parametrize("task", ["needle", "lookalike"])
def test_needle_prompt_follows_ruler(tok, task):
    record = TASKS[task].generate(tok, 1, 700, seed=11)[0]
    key = record.metadata["needles"][0]["key"]
    lines = record.context.split("\n")
    haystack = "\n".join(line for line in lines[1:] if not line.startswith("One of the special"))
    # RULER's prompt with this record's haystack, singular wording, answer prefix after the template
    expected = _ruler_single_needle(RULER_NIAH_TEMPLATE).format(
        type_needle_v="number", context="\n".join(lines[1:]), query=key)
    assert record.context + record.separator + record.question == expected
    assert record.answer_prefix == _ruler_single_needle(RULER_NIAH_ANSWER_PREFIX).format(
        type_needle_v="number", query=key)
    # noise layout: the whole haystack string once per line, needles on lines of their own
    assert set(haystack.split("\n")) == {RULER_NOISE}
    needles = [line for line in lines[1:] if line.startswith("One of the special")]
    assert needles and all(line.startswith("One of the special magic numbers for ") and line.endswith(".")
                           for line in needles)
    assert len(needles) == len(record.metadata["needles"])
    # the prompt ends with the answer prefix (after the generation prompt); the question part holds it
    ids, start = build_prompt_ids(tok, record)
    prefix_ids = tok(record.answer_prefix, add_special_tokens=False)["input_ids"]
    assert ids[-len(prefix_ids):] == prefix_ids
    assert ids[-len(prefix_ids) - 1] == tok.convert_tokens_to_ids(ASSISTANT)
    assert start < len(ids) - len(prefix_ids)


def test_lookalike_keys_differ_in_one_word(tok):
    for record in lookalike.generate(tok, 6, 900, seed=4):
        needles = record.metadata["needles"]
        adjective, noun = needles[0]["key"].split("-")
        kinds = [n["kind"] for n in needles]
        assert kinds[0] == "query" and kinds.count("lookalike") == record.metadata["lookalikes"]
        assert kinds.count("other") == record.metadata["others"] == lookalike.OTHERS
        for n in needles[1:]:
            a, b = n["key"].split("-")
            if n["kind"] == "lookalike":
                assert b == noun and a != adjective
            else:
                assert a == adjective and b != noun
            assert f"for {n['key']} is: {n['value']}." in record.context
        assert len({n["key"] for n in needles}) == len({n["value"] for n in needles}) == len(needles)
        assert record.answers == [needles[0]["value"]] and needles[0]["key"] in record.question
    counts = [r.metadata["lookalikes"] for r in lookalike.generate(tok, 2 * len(lookalike.LOOKALIKES), 300, seed=2)]
    assert sorted(counts) == sorted(2 * list(lookalike.LOOKALIKES))  # balanced blocks
    assert lookalike.make_record(tok, 400, 0, 0, lookalikes=0, others=0).metadata["needles"][0]["kind"] == "query"
    with pytest.raises(ValueError, match="lookalikes"):
        lookalike.make_record(tok, 400, 0, 0, lookalikes=-1)


# ---------------------------------------------------------------- prompting

def test_prompt_split_matches_template(tok):
    record = multikey.make_record(tok, 400, seed=0, index=0)
    ids, start = build_prompt_ids(tok, record)
    whole = tok.apply_chat_template(
        [{"role": "user", "content": record.context + "\n\n" + record.question}],
        tokenize=False, add_generation_prompt=True)
    assert ids == tok(whole, add_special_tokens=False)["input_ids"]
    assert ids[0] == tok.bos_token_id and ids[1] != tok.bos_token_id
    assert ids[-1] == tok.convert_tokens_to_ids(ASSISTANT)
    question_ids = tok(record.question, add_special_tokens=False)["input_ids"]
    assert ids[start:start + len(question_ids)] == question_ids
    assert tok.decode(ids[:start], skip_special_tokens=True).strip().endswith(
        tok.decode(tok(record.context.split()[-1])["input_ids"]))


SPECIALS = [BOS, UNK, USER, ASSISTANT, EOS]


def _wordlevel(pre_tokenizer, template: str | None, normalizer=None) -> PreTrainedTokenizerFast:
    words = SPECIALS + "▁ Hello world . What is it ?".split()
    backend = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token=UNK))
    backend.pre_tokenizer = pre_tokenizer
    if normalizer is not None:
        backend.normalizer = normalizer
    backend.add_special_tokens(SPECIALS)
    wrapped = PreTrainedTokenizerFast(tokenizer_object=backend, bos_token=BOS, unk_token=UNK)
    if template is not None:
        wrapped.chat_template = template
    return wrapped


def _record(context="Hello world.", question="What is it?") -> TaskRecord:
    return TaskRecord(id="x", task="needle", context=context, question=question,
                      answers=["it"], metadata={"target_tokens": 10})


SIMPLE_TEMPLATE = ("{{ bos_token }}{% for m in messages %}" + USER + "{{ m['content'] }}" + EOS + "{% endfor %}"
                   "{% if add_generation_prompt %}" + ASSISTANT + "{% endif %}")


def test_prompt_split_falls_back_to_offsets():
    # Like SentencePiece tokenizers, a "▁" is prepended to every string tokenized on
    # its own, so the two pieces do not tokenize to the whole prompt; the offsets of
    # the whole prompt still show a clean token boundary where the question starts.
    tok = _wordlevel(pre_tokenizers.Whitespace(), SIMPLE_TEMPLATE, normalizers.Prepend("▁"))
    ids, start = build_prompt_ids(tok, _record())
    text = tok.apply_chat_template([{"role": "user", "content": "Hello world.\n\nWhat is it?"}],
                                   tokenize=False, add_generation_prompt=True)
    assert ids == tok(text, add_special_tokens=False)["input_ids"]
    assert tok.convert_ids_to_tokens(ids[start:]) == ["What", "is", "it", "?", EOS, ASSISTANT]
    assert tok.convert_ids_to_tokens(ids[:start]) == [BOS, USER, "▁", "Hello", "world", "."]
    simple = _wordlevel(pre_tokenizers.Whitespace(), SIMPLE_TEMPLATE)
    assert build_prompt_ids(simple, _record())[1] == 5


def test_prompt_split_errors():
    plain = _wordlevel(pre_tokenizers.Whitespace(), None)
    with pytest.raises(ValueError, match="no chat template"):
        build_prompt_ids(plain, _record())
    shouting = _wordlevel(pre_tokenizers.Whitespace(),
                          "{% for m in messages %}{{ m['content'] | lower }}{% endfor %}")
    with pytest.raises(ValueError, match="verbatim"):
        build_prompt_ids(shouting, _record())
    # a pre-tokenizer that only splits on spaces glues "world.\n\nWhat" into one token
    glued = _wordlevel(pre_tokenizers.Split(" ", behavior="removed"), SIMPLE_TEMPLATE)
    with pytest.raises(ValueError, match="no token boundary"):
        build_prompt_ids(glued, _record())


# ---------------------------------------------------------------- metrics

def test_string_match_all_golden():
    assert metrics.string_match_all("The numbers are 1234567 and 7654321.", ["1234567"]) == 1.0
    assert metrics.string_match_all("1234567, 42", ["1234567", "42", "999"]) == pytest.approx(2 / 3)
    assert metrics.string_match_all("PARIS it is", ["paris"]) == 1.0
    assert metrics.string_match_all("Paris", ["PARIS"]) == 1.0  # references lower-cased too
    assert metrics.string_match_all("123456", ["1234567"]) == 0.0
    with pytest.raises(ValueError):
        metrics.string_match_all("x", [])


def test_normalize_and_recall_golden():
    assert metrics.normalize_answer("The  Cat's, hat!") == "cats hat"
    assert metrics.normalize_answer("An apple a day") == "apple day"
    assert metrics.recall("It is in Paris.", ["Paris"]) == 1.0
    assert metrics.recall("New Paris", ["New York City"]) == pytest.approx(1 / 3)
    assert metrics.recall("nothing", ["a", "York"]) == 0.0  # "a" normalises to nothing
    assert metrics.recall("york", ["a", "York"]) == 1.0
    assert metrics.recall("4821", ["4821"]) == 1.0 and metrics.recall("482", ["4821"]) == 0.0


def test_score_dispatch_and_correctness():
    assert score("needle", "1234567", ["1234567"]) == 1.0
    assert score("multikey", "the city is Lisbon", ["Lisbon"]) == 1.0
    assert score("multiturn", "48", ["4821"]) == 0.0
    assert is_correct("needle", "x 1234567", ["1234567"])
    assert not is_correct("needle", "1234567", ["1234567", "9"])
    with pytest.raises(KeyError, match="unknown task 'nonexistent'"):
        score("nonexistent", "a", ["a"])


def test_registry_is_extensible(tok):
    assert set(SYNTHETIC_TASKS) <= set(TASKS)

    def generate(tokenizer, n_examples, target_tokens, seed, **options):
        return [_record()]

    register_task("toy", generate, metrics.string_match_all)
    try:
        assert TASKS["toy"].generate(tok, 1, 10, 0)[0].question == "What is it?"
        assert score("toy", "it", ["it"]) == 1.0
    finally:
        TASKS.pop("toy")


# ---------------------------------------------------------------- records

def test_record_schema_errors_name_the_field(tmp_path):
    good = _record().to_dict()
    for field in ("id", "task", "context", "question", "answers", "metadata", "length"):
        broken = dict(good)
        del broken[field]
        with pytest.raises(RecordError, match=f"missing field '{field}'"):
            TaskRecord.from_dict(broken)
    with pytest.raises(RecordError, match="'length' must be int"):
        TaskRecord.from_dict({**good, "length": "12"})
    with pytest.raises(RecordError, match="target_tokens"):
        TaskRecord.from_dict({**good, "metadata": {}})
    with pytest.raises(RecordError, match="list of strings"):
        TaskRecord.from_dict({**good, "answers": [1]})
    path = tmp_path / "records.jsonl"
    del good["answers"]
    path.write_text(json.dumps(_record().to_dict()) + "\n" + json.dumps(good) + "\n")
    with pytest.raises(RecordError, match=r"records\.jsonl:2: missing field 'answers'"):
        read_jsonl(path)


def test_jsonl_roundtrip(tok, tmp_path):
    records = needle.generate(tok, 3, 300, seed=0) + multiturn.generate(tok, 2, 300, seed=0)
    path = tmp_path / "sub" / "r.jsonl"
    assert write_jsonl(records, path) == 5
    assert [r.to_dict() for r in read_jsonl(path)] == [r.to_dict() for r in records]
    assert read_jsonl(path)[0].answer_prefix == records[0].answer_prefix != ""


def test_optional_record_fields(tmp_path):
    old = _record().to_dict()
    del old["separator"], old["answer_prefix"]  # files written before these fields existed
    loaded = TaskRecord.from_dict(old)
    assert (loaded.separator, loaded.answer_prefix) == ("\n\n", "")
    with pytest.raises(RecordError, match="'answer_prefix' must be str"):
        TaskRecord.from_dict({**old, "answer_prefix": 3})


# ---------------------------------------------------------------- RULER's conventions (NVIDIA/RULER niah.py)

@pytest.mark.parametrize("task, haystack", [("needle", "noise"), ("needle", "needle"), ("lookalike", "noise")])
@pytest.mark.parametrize("target", [512, 2048])
def test_the_haystack_is_sized_as_ruler_sizes_it(tok, task, haystack, target):
    """niah.py: the prompt plus 128 answer tokens fit the length, and one more haystack line would not."""
    from ruler_official import TOKENS_TO_GENERATE, official_fits

    from kvcert.tasks.prompting import prompt_length

    options = {"haystack": haystack} if task == "needle" else {}
    for record in TASKS[task].generate(tok, 3, target, seed=4, **options):
        assert record.metadata["answer_tokens"] == TOKENS_TO_GENERATE
        assert official_fits(record.length, target)
        lines = record.context.split("\n")
        extra = lines[1] if haystack == "noise" else needle.NEEDLE.format(key="pocket", value="1234567")
        longer = "\n".join([*lines, extra])
        assert not official_fits(prompt_length(tok, longer, record.question, record.separator, record.answer_prefix),
                                 target)


@pytest.mark.parametrize("n", [1, 2, 7, 40])
@pytest.mark.parametrize("depth", [0, 10, 50, 90, 99, 100])
def test_a_needle_goes_before_a_haystack_line_as_ruler_inserts_it(depth, n):
    from ruler_official import official_insert

    out = needle.haystack_lines([(depth, "NEEDLE")], n)
    index = out.index("NEEDLE")
    assert out == official_insert([needle.HAYSTACK] * n, ["NEEDLE"], [index])  # index in range(n)
    assert out[-1] == needle.HAYSTACK  # never after the last haystack line
    if depth == 100:
        assert index == n - 1


def test_the_needle_haystack_holds_random_needles(tok):
    record = needle.make_record(tok, 1024, seed=2, index=0, haystack="needle", depth=50)
    lines = record.context.split("\n")[1:]
    assert all(line.startswith("One of the special magic numbers for ") for line in lines)
    key = record.metadata["needles"][0]["key"]
    assert sum(f" for {key} is:" in line for line in lines) == 1  # the queried key is on its needle alone
    with pytest.raises(ValueError, match="haystack: 'essay' is not one of"):
        needle.make_record(tok, 1024, seed=2, index=0, haystack="essay")
