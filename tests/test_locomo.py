"""LoCoMo: loader, prompt records and the category-wise scoring.

The expected scores are worked out by hand from LoCoMo's evaluation.py (Maharana et
al. 2024); the fixture is written in the released locomo10.json shape by the test,
the tokenizer is a word-level one trained here, the model random-init.
"""

from __future__ import annotations

import json
import random

import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from locomo_official import official_context

from kvcert.tasks.locomo import (
    CATEGORY_NAMES, MAX_NEW_TOKENS, NO_INFORMATION, category_means, f1_score, load_locomo,
    locomo_records, multi_answer_f1, normalize_answer, question_prompt, render_conversation,
    resolve_adversarial_choice, score_locomo, score_locomo_record,
)
from kvcert.tasks.prompting import build_prompt_ids

from conftest import model_for
from kvcert.training.tokenizer import (  # the embedded model's chat specials: one definition for every test tokenizer
    ASSISTANT, BOS, CHAT_TEMPLATE, EOS, PAD, UNK, USER)


def _sample() -> dict:
    """One conversation in the released format, with a QA item of every category."""
    return {
        "sample_id": "conv-1",
        "conversation": {
            "speaker_a": "Caroline",
            "speaker_b": "Melanie",
            "session_1_date_time": "1:56 pm on 8 May, 2023",
            "session_1": [
                {"speaker": "Caroline", "dia_id": "D1:1", "text": "I went to a pottery class yesterday."},
                {"speaker": "Melanie", "dia_id": "D1:2", "text": "Nice! I love painting and camping.",
                 "img_url": ["https://example.invalid/bike.jpg"], "blip_caption": "a photo of a red bicycle",
                 "query": "red bicycle"},
            ],
            "session_2_date_time": "7:00 pm on 20 May, 2023",
            "session_2": [
                {"speaker": "Caroline", "dia_id": "D2:1", "text": "I moved here in 2022."},
            ],
            "session_3_date_time": "8:00 pm on 21 May, 2023",
            "session_3": [],
            "session_10_date_time": "9:15 am on 2 July, 2023",
            "session_10": [
                {"speaker": "Melanie", "dia_id": "D10:1", "text": "We adopted a puppy!"},
            ],
        },
        "qa": [
            {"question": "What hobbies does Melanie have?", "answer": "painting, camping",
             "evidence": ["D1:2"], "category": 1},
            {"question": "When did Caroline go to the pottery class?", "answer": "7 May 2023",
             "evidence": ["D1:1"], "category": 2},
            {"question": "Would Melanie enjoy a hiking trip?",
             "answer": "Likely yes; she enjoys camping", "evidence": ["D1:2"], "category": 3},
            {"question": "In which year did Caroline move?", "answer": 2022,
             "evidence": ["D2:1"], "category": 4},
            {"question": "What did Caroline adopt?", "adversarial_answer": "a puppy",
             "evidence": ["D10:1"], "category": 5},
        ],
    }


SPECIALS = [BOS, EOS, PAD, UNK, USER, ASSISTANT]


@pytest.fixture(scope="module")
def tok() -> PreTrainedTokenizerFast:
    """A word-level tokenizer trained on the fixture's prompts."""
    sample = _sample()
    corpus = [render_conversation(sample)]
    corpus += [question_prompt(qa, random.Random(seed))[0] for qa in sample["qa"] for seed in range(4)]
    backend = Tokenizer(models.WordLevel(unk_token=UNK))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    backend.train_from_iterator(corpus, trainers.WordLevelTrainer(special_tokens=SPECIALS,
                                                                  show_progress=False))
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token=BOS, eos_token=EOS, pad_token=PAD,
        unk_token=UNK, additional_special_tokens=[USER, ASSISTANT],
    )
    wrapped.chat_template = CHAT_TEMPLATE
    return wrapped


# ------------------------------------------------------------ scoring goldens

def test_normalisation_and_stemmed_f1_golden():
    # commas go first, then punctuation, then a/an/the/and
    assert normalize_answer("Painting, pottery and the Beach!") == "painting pottery beach"
    # "She loves painting" -> stems [she, love, paint]; "painted" -> [paint]
    # shared 1: P 1/3, R 1, F1 = 2*(1/3)*1 / (1/3 + 1) = 0.5
    assert f1_score("She loves painting", "painted") == pytest.approx(0.5)
    assert f1_score("pottery", "Pottery.") == 1.0
    assert f1_score("camping", "hiking") == 0.0
    assert f1_score("", "hiking") == 0.0


def test_multi_hop_splits_on_commas():
    # gold parts: pottery -> 1, painting -> 1, camping -> 0; mean 2/3
    assert multi_answer_f1("painting, pottery", "pottery, painting, camping") == pytest.approx(2 / 3)
    assert score_locomo(1, "painting, pottery", "pottery, painting, camping") == pytest.approx(2 / 3)
    # without the split it would be plain F1: P 1, R 2/3 -> 0.8
    assert f1_score("painting, pottery", "pottery, painting, camping") == pytest.approx(0.8)


def test_temporal_single_hop_and_open_domain():
    assert score_locomo(2, "7 May 2023", "7 May 2023") == 1.0
    # [may, 2023] vs [7, may, 2023]: P 1, R 2/3 -> 0.8
    assert score_locomo(2, "May 2023", "7 May 2023") == pytest.approx(0.8)
    # integer gold; [in, 2022] vs [2022]: P 1/2, R 1 -> 2/3
    assert score_locomo(4, "In 2022.", 2022) == pytest.approx(2 / 3)
    # open-domain keeps the gold before ";": [ye] vs [like, ye] -> P 1, R 1/2 -> 2/3
    assert score_locomo(3, "yes", "Likely yes; she enjoys camping") == pytest.approx(2 / 3)
    # the whole gold would have given [ye] vs [like, ye, she, enjoy, camp] -> 1/3
    assert f1_score("yes", "Likely yes; she enjoys camping") == pytest.approx(1 / 3)


def test_adversarial_scoring():
    choices = {"a": NO_INFORMATION, "b": "a puppy"}
    # without choices (not how records are scored): the abstention phrases alone
    assert score_locomo(5, "Not mentioned in the conversation", "a puppy") == 1.0
    assert score_locomo(5, "no information available.", "a puppy") == 1.0
    assert score_locomo(5, "She adopted a puppy", "a puppy") == 0.0
    # evaluate_llama2.py: "(a)" anywhere in the first line picks (a), anything else (b)
    assert score_locomo(5, "(a)", "", choices) == 1.0
    assert score_locomo(5, "I pick (A).", "", choices) == 1.0
    assert score_locomo(5, " A ", "", choices) == 0.0
    assert score_locomo(5, "(b)", "", choices) == 0.0
    assert score_locomo(5, "b", "", choices) == 0.0
    assert resolve_adversarial_choice("(b)", choices) == "a puppy"
    assert resolve_adversarial_choice(" The Puppy ", choices) == "a puppy"
    with pytest.raises(ValueError, match="1..5"):
        score_locomo(6, "x", "x")


def test_category_means():
    means = category_means([4, 1, 5, 5], [1.0, 0.5, 1.0, 0.0])
    assert means == {"single-hop": 1.0, "multi-hop": 0.5, "adversarial": 0.5, "overall": 0.625}
    assert list(means) == ["single-hop", "multi-hop", "adversarial", "overall"]
    assert CATEGORY_NAMES == {1: "multi-hop", 2: "temporal", 3: "open-domain",
                              4: "single-hop", 5: "adversarial"}
    with pytest.raises(ValueError, match="unknown LoCoMo categories"):
        category_means([9], [1.0])


# ------------------------------------------------------------ loader

def test_loader_reads_the_released_shape(tmp_path):
    path = tmp_path / "locomo10.json"
    path.write_text(json.dumps([_sample()]), encoding="utf-8")
    assert load_locomo(path) == [_sample()]
    with pytest.raises(FileNotFoundError, match="nothing.json.*locomo10.json") as missing_file:
        load_locomo(tmp_path / "nothing.json")
    with pytest.raises(FileNotFoundError, match=f"^locomo: {tmp_path} is a directory, not the released LoCoMo JSON "
                                                f"file \\(locomo10.json\\); it holds {path}, give that file") as folder:
        load_locomo(tmp_path)
    for error in (missing_file, folder):  # the loader takes no Hub id: none is suggested
        assert "Hub id" not in str(error.value) and "hf:" not in str(error.value)
    from kvcert.commands.check import check_task

    problems = check_task({"name": "locomo", "kind": "locomo", "source": str(tmp_path)})
    assert len(problems) == 1 and "is a directory" in problems[0]


@pytest.mark.parametrize("breakage, message", [
    (lambda s: s["qa"][3].pop("answer"), r"sample 0 \(conv-1\) qa 3: missing field 'answer'"),
    (lambda s: s["qa"][4].pop("adversarial_answer"), r"qa 4: missing field 'adversarial_answer'"),
    (lambda s: s["qa"][0].update(category=7), r"qa 0: category must be one of 1..5"),
    (lambda s: s["conversation"].pop("session_2_date_time"), r"lacks field 'session_2_date_time'"),
    (lambda s: s["conversation"]["session_1"][0].pop("text"), r"session_1 turn 0 lacks field 'text'"),
    (lambda s: s.pop("qa"), r"sample 0: missing field 'qa'"),
])
def test_loader_names_the_broken_field(tmp_path, breakage, message):
    sample = _sample()
    breakage(sample)
    path = tmp_path / "locomo10.json"
    path.write_text(json.dumps([sample]), encoding="utf-8")
    with pytest.raises(ValueError, match=message):
        load_locomo(path)
    path.write_text(json.dumps({"not": "a list"}), encoding="utf-8")
    with pytest.raises(ValueError, match="expected a JSON list"):
        load_locomo(path)


# ------------------------------------------------------------ records

def test_rendered_conversation():
    """hf_llm_utils.py's context: sessions newest first (empty session 3 keeps its header), a
    blank line after each turn, the caption of every turn that has one."""
    sample = _sample()
    text = render_conversation(sample)
    assert text.startswith("Below is a conversation between two people: Caroline and Melanie.")
    expected = (
        "\nDATE: 9:15 am on 2 July, 2023\nCONVERSATION:\n"
        'Melanie said, "We adopted a puppy!"\n\n'
        "\nDATE: 8:00 pm on 21 May, 2023\nCONVERSATION:\n"
        "\nDATE: 7:00 pm on 20 May, 2023\nCONVERSATION:\n"
        'Caroline said, "I moved here in 2022."\n\n'
        "\nDATE: 1:56 pm on 8 May, 2023\nCONVERSATION:\n"
        'Caroline said, "I went to a pottery class yesterday."\n\n'
        'Melanie said, "Nice! I love painting and camping."\n and shared a photo of a red bicycle.'
    )
    assert text.endswith(expected)
    assert text == official_context(sample["conversation"], ("Caroline", "Melanie")).rstrip()


def test_the_context_is_hf_llm_utils_on_generated_conversations():
    """Captions on turns without an image URL too, clean_text ignored, sessions out of order."""
    import random as _random

    rng = _random.Random(5)
    for trial in range(20):
        conversation = {"speaker_a": "Ann", "speaker_b": "Bo"}
        numbers = rng.sample(range(1, 30), rng.randint(1, 6))
        for number in numbers:
            conversation[f"session_{number}_date_time"] = f"day {number}"
            turns = []
            for t in range(rng.randint(0, 4)):
                turn = {"speaker": rng.choice(["Ann", "Bo"]), "dia_id": f"D{number}:{t}",
                        "text": rng.choice(["Hi.", 'She said "no".', "ok\nthen"]), "clean_text": "x"}
                if rng.random() < 0.4:
                    turn["blip_caption"] = "a photo of a cat"
                turns.append(turn)
            conversation[f"session_{number}"] = turns
        sample = {"sample_id": f"g{trial}", "conversation": conversation, "qa": []}
        assert render_conversation(sample) == official_context(conversation, ("Ann", "Bo")).rstrip()


def test_records(tok):
    records = locomo_records([_sample()], tok, seed=3)
    assert [r.metadata["category"] for r in records] == [1, 2, 3, 4, 5]
    assert len({r.id for r in records}) == 5 and records[0].id == "locomo:conv-1:0"
    context = render_conversation(_sample())
    for record in records:
        assert record.task == "locomo" and record.context == context
        assert record.question.startswith("Based on the above conversations, write a short answer")
        assert record.metadata["max_new_tokens"] == MAX_NEW_TOKENS == 50
        assert record.metadata["sample_id"] == "conv-1"
        ids, question_start = build_prompt_ids(tok, record)
        assert record.length == len(ids) == record.metadata["target_tokens"]
        assert ids.count(tok.bos_token_id) == 1 and tok.unk_token_id not in ids
        assert 0 < question_start < len(ids)
    multi, temporal, open_domain, single, adversarial = records
    assert multi.answers == ["painting, camping"] and multi.metadata["category_name"] == "multi-hop"
    assert temporal.question.endswith(
        "Question: When did Caroline go to the pottery class? Use DATE of CONVERSATION to answer "
        "with an approximate date.")
    assert single.answers == ["2022"] and single.metadata["evidence"] == ["D2:1"]
    assert open_domain.answers == ["Likely yes; she enjoys camping"]
    choices = adversarial.metadata["choices"]
    assert sorted(choices.values()) == sorted([NO_INFORMATION, "a puppy"])
    assert adversarial.question.endswith(
        f"Question: What did Caroline adopt? (a) {choices['a']} (b) {choices['b']}. "
        "Select the correct answer by writing (a) or (b).")
    assert adversarial.answers == [NO_INFORMATION]
    assert adversarial.metadata["adversarial_answer"] == "a puppy"
    no_info = "(a)" if choices["a"] == NO_INFORMATION else "(b)"
    assert score_locomo_record(adversarial, no_info) == 1.0
    assert score_locomo_record(single, "2022") == 1.0
    assert score_locomo_record(multi, "camping, painting") == 1.0


def test_records_are_seeded_and_filterable(tok):
    first = [r.to_dict() for r in locomo_records([_sample()], tok, seed=1)]
    assert first == [r.to_dict() for r in locomo_records([_sample()], tok, seed=1)]
    orders = {locomo_records([_sample()], tok, seed=s, categories=[5])[0].metadata["choices"]["a"]
              for s in range(16)}
    assert orders == {NO_INFORMATION, "a puppy"}  # the coin lands both ways
    only = locomo_records([_sample()], tok, categories=[2, 4])
    assert [r.metadata["category"] for r in only] == [2, 4]


def test_generate_and_score_with_a_random_init_model(tok):
    record = locomo_records([_sample()], tok, categories=[4])[0]
    model = model_for(tok, layers=1, hidden=32, heads=2, kv_heads=1, positions=1024)
    ids, _ = build_prompt_ids(tok, record)
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), do_sample=False,
                             max_new_tokens=record.metadata["max_new_tokens"])
    new = out[0, len(ids):].tolist()
    assert 0 < len(new) <= MAX_NEW_TOKENS
    score = score_locomo_record(record, tok.decode(new, skip_special_tokens=True))
    assert 0.0 <= score <= 1.0


def test_a_spread_sample_covers_every_conversation():
    """The paper cell's 400 of 1,986 items: a share of each conversation proportional to its items, at evenly
    spaced positions (the released file lists categories in runs), in file order."""
    from kvcert.tasks.locomo import spread_over_conversations
    from kvcert.tasks.records import TaskRecord

    sizes = [199, 105, 193, 260, 242, 158, 190, 239, 196, 204]  # locomo10.json's QA items per conversation
    records = [TaskRecord(id=f"c{c}:{i}", task="locomo", context="", question="", answers=["x"],
                          metadata={"sample_id": f"c{c}", "category": 1 + (5 * i) // n, "target_tokens": 0})
               for c, n in enumerate(sizes) for i in range(n)]
    chosen = spread_over_conversations(records, 400)
    assert len(chosen) == 400 and len({r.id for r in chosen}) == 400
    per = {f"c{c}": sum(r.metadata["sample_id"] == f"c{c}" for r in chosen) for c in range(10)}
    for c, n in enumerate(sizes):
        assert abs(per[f"c{c}"] - 400 * n / sum(sizes)) < 1.0
    order = [records.index(r) for r in chosen]
    assert order == sorted(order)
    for c in range(10):  # every category run of every conversation is represented
        assert {r.metadata["category"] for r in chosen if r.metadata["sample_id"] == f"c{c}"} == {1, 2, 3, 4, 5}
    assert spread_over_conversations(records[:7], 400) == records[:7]
