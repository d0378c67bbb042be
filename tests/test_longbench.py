"""LongBench v1: golden metric values, loaders, middle truncation, records.

Every expected score below is worked out by hand from the definitions in LongBench's
metrics.py / eval.py (Bai et al. 2023); the fixtures are written by the tests (no
downloads), the tokenizer is a byte-level BPE trained here, the model random-init.
"""

from __future__ import annotations

import ast
import json
import random
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

from kvcert.tasks import longbench, longbench_metrics
from kvcert.tasks.longbench import (
    DATASET2MAXLEN, DATASET2METRIC, DATASET2PROMPT, QA_DATASETS, REQUIRED_FIELDS,
    load_longbench, longbench_records, middle_truncate, score_longbench_record, split_template,
)
from kvcert.tasks.longbench_metrics import (
    classification_score, code_sim_score, count_score, normalize_answer, qa_f1_score,
    retrieval_score, rouge_score, score_sample, score_task,
)
from kvcert.tasks.prompting import build_prompt_ids

from conftest import model_for
from kvcert.training.tokenizer import (  # the embedded model's chat specials: one definition for every test tokenizer
    ASSISTANT, BOS, CHAT_TEMPLATE, EOS, PAD, USER)

# Re-encoding the two decoded halves of a truncated prompt gives the kept tokens
# back except where the halves meet (the junction may fall inside a word): we allow
# this many tokens of difference there, in the count and at each side of the cut.
JUNCTION_TOLERANCE = 4


# ------------------------------------------------------------ metric goldens

def test_normalize_answer_order_punctuation_before_articles():
    assert normalize_answer("The Cat, sat.") == "cat sat"
    # punctuation first: "the-end" -> "theend", which holds no article any more;
    # removing articles first would have left "end".
    assert normalize_answer("the-end") == "theend"
    assert normalize_answer("A.M. an  hour") == "am hour"
    assert normalize_answer("  An apple\tTHE\npie ") == "apple pie"


def test_qa_f1_golden():
    # "The Cat, sat." -> [cat, sat]; "cat sat down" -> [cat, sat, down]
    # shared 2: precision 2/2, recall 2/3, F1 = 2*1*(2/3) / (1 + 2/3) = 0.8
    expected = 2 * 1.0 * (2 / 3) / (1.0 + 2 / 3)
    assert qa_f1_score("The Cat, sat.", "cat sat down") == expected
    assert expected == pytest.approx(0.8)
    # punctuation-before-articles decides these two
    assert qa_f1_score("the-end", "end") == 0.0
    assert qa_f1_score("the-end", "theend") == 1.0
    # multiset: "cat cat" vs "cat" shares one token -> P 1/2, R 1, F1 2/3
    assert qa_f1_score("cat cat", "cat") == pytest.approx(2 / 3)
    assert qa_f1_score("", "cat") == 0.0
    assert qa_f1_score("The", "a") == 0.0  # both normalise to nothing


def test_rouge_l_golden():
    # one sentence each; LCS("the cat sat", "the cat sat on a mat") = 3 words,
    # P = 3/3, R = 3/6, F = 2PR/(P+R) = 2/3 (the package adds 1e-8 to the denominator)
    assert rouge_score("the cat sat", "the cat sat on a mat") == pytest.approx(2 / 3, abs=1e-7)
    assert rouge_score("a b c d", "a b c d") == pytest.approx(1.0, abs=1e-7)
    # LCS("b a c", "a b c") = 2 words: P = R = 2/3
    assert rouge_score("b a c", "a b c") == pytest.approx(2 / 3, abs=1e-7)
    # the package raises on an empty hypothesis; LongBench scores that 0
    assert rouge_score("", "the cat") == 0.0
    assert rouge_score("...", "the cat") == 0.0


def test_classification_golden_with_all_classes():
    classes = ["location", "other location", "person", "animal"]
    # "location" is a strict substring of the gold "other location" and is dropped
    assert classification_score("other location", "other location", all_classes=classes) == 1.0
    # two classes named, the gold among them -> 1/2
    assert classification_score("person or animal", "person", all_classes=classes) == 0.5
    assert classification_score("animal", "person", all_classes=classes) == 0.0
    # the official fall-back to the most similar class never runs: naming no class is 0
    assert classification_score("Anima", "Animal", all_classes=["Animal", "Person"]) == 0.0
    with pytest.raises(ValueError, match="all_classes"):
        classification_score("person", "person")


def test_classification_keeps_the_official_skip_after_removal():
    # matches in class order: [x, y, "xy z"]; "x" is removed, so "y" (next) is never
    # examined and stays although it is a substring of the gold -> 1/2, not 1.
    assert classification_score("x y xy z", "xy z", all_classes=["x", "y", "xy z"]) == 0.5
    # with "y" listed first it is examined and removed, and so "x" (after it) is skipped
    assert classification_score("x y xy z", "xy z", all_classes=["y", "x", "xy z"]) == 0.5
    # one substring class only: removed, the gold alone remains
    assert classification_score("x xy z", "xy z", all_classes=["x", "xy z"]) == 1.0


def test_retrieval_golden():
    assert retrieval_score("Paragraph 3", "Paragraph 3") == 1.0
    assert retrieval_score("3", "Paragraph 3") == 1.0
    assert retrieval_score("Paragraph 3 or Paragraph 13", "Paragraph 3") == 0.5
    assert retrieval_score("Paragraph 30", "Paragraph 3") == 0.0
    assert retrieval_score("paragraph three", "Paragraph 3") == 0.0
    with pytest.raises(ValueError, match="Paragraph N"):
        retrieval_score("3", "3")


def test_count_golden():
    assert count_score("There are 5 unique paragraphs out of 7.", "5") == 0.5
    assert count_score("5", "5") == 1.0
    assert count_score("5, 5 and 12", 5) == pytest.approx(2 / 3)
    assert count_score("five", "5") == 0.0


def test_code_similarity_golden():
    # first line without ` # // is "x = foo(1)"; ratio with "x = foo(2)": 9 matching
    # characters of 20 -> 2*9/20 = 0.90
    prediction = "\n# a comment\n```python\nx = foo(1)\ny = 2\n"
    assert code_sim_score(prediction, "x = foo(2)") == 0.9
    assert code_sim_score("x = foo(2)", "x = foo(2)") == 1.0
    # no usable line -> the empty string, ratio 0
    assert code_sim_score("// only\n# comments", "x = 1") == 0.0


def test_first_line_cut_for_trec_triviaqa_samsum_lsht():
    prediction = "\nParis\nLondon is big"
    assert score_sample("triviaqa", prediction, ["Paris"]) == 1.0
    # hotpotqa is not cut: [paris, london, is, big] vs [paris] -> P 1/4, R 1, F1 0.4
    assert score_sample("hotpotqa", prediction, ["Paris"]) == pytest.approx(0.4)
    classes = ["person", "animal"]
    assert score_sample("trec", "person\nanimal", ["person"], classes) == 1.0
    assert score_sample("multifieldqa_en", "person\nanimal", ["person"]) == pytest.approx(2 / 3)


def test_score_sample_takes_the_best_gold_answer():
    assert score_sample("hotpotqa", "cat sat", ["dog", "The cat sat!", "cat"]) == 1.0
    # "cat sat" vs "cat": P 1/2, R 1 -> 2/3; vs "dog": 0
    assert score_sample("hotpotqa", "cat sat", ["dog", "cat"]) == pytest.approx(2 / 3)
    assert score_sample("hotpotqa", "cat", []) == 0.0
    with pytest.raises(KeyError, match="no LongBench metric"):
        score_sample("unknown_task", "x", ["x"])


def test_score_task_rounding():
    gold = [["cat"]] * 3
    # (2/3 + 1 + 0) / 3 = 0.5555... -> 55.56
    assert score_task("hotpotqa", ["cat sat", "cat", "x"], gold) == 55.56
    assert score_task("hotpotqa", ["cat", "x", "y"], gold) == 33.33
    assert score_task("hotpotqa", ["cat", "cat", "y"], gold) == 66.67
    assert score_task("hotpotqa", ["cat", "cat", "cat"], gold) == 100.0
    with pytest.raises(ValueError, match="answer lists"):
        score_task("hotpotqa", ["cat"], gold)
    with pytest.raises(ValueError, match="no predictions"):
        score_task("hotpotqa", [], [])


def test_tables_cover_all_21_datasets():
    every = {
        "narrativeqa", "qasper", "multifieldqa_en", "hotpotqa", "2wikimqa", "musique",
        "gov_report", "qmsum", "multi_news", "trec", "triviaqa", "samsum", "passage_count",
        "passage_retrieval_en", "lcc", "repobench-p",
        "multifieldqa_zh", "dureader", "vcsum", "lsht", "passage_retrieval_zh",
    }
    assert set(DATASET2METRIC) == every
    assert set(DATASET2PROMPT) == every and set(DATASET2MAXLEN) == every
    assert longbench.DATASET2METRIC is longbench_metrics.DATASET2METRIC
    for name in QA_DATASETS:
        assert DATASET2METRIC[name] is qa_f1_score
        split_template(name)  # every QA template splits
    assert (DATASET2MAXLEN["narrativeqa"], DATASET2MAXLEN["hotpotqa"], DATASET2MAXLEN["multifieldqa_en"]) == (128, 32, 64)


# ------------------------------------------------------------ loaders

def _row(index: int, dataset: str = "hotpotqa", words: int = 12) -> dict:
    rng = random.Random(index)
    body = " ".join(rng.choice(WORDS) for _ in range(words))
    return {
        "input": f"Which lamp is number {index}?",
        "context": f"Passage 1:\n{body}.",
        "answers": [f"lamp {index}", "the lamp"],
        "length": words,
        "dataset": dataset,
        "language": "en",
        "all_classes": None,
        "_id": f"id-{index:04d}",
    }


def _write_jsonl(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")


def _write_parquet(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path)


def test_load_jsonl_directory_and_limit(tmp_path):
    rows = [_row(i) for i in range(3)]
    _write_jsonl(tmp_path / "hotpotqa.jsonl", rows)
    assert load_longbench(tmp_path, "hotpotqa") == rows
    assert load_longbench(str(tmp_path), "hotpotqa", limit=2) == rows[:2]
    assert load_longbench(tmp_path / "hotpotqa.jsonl", "hotpotqa") == rows
    # the released zip unpacks to data/<dataset>.jsonl
    _write_jsonl(tmp_path / "zip" / "data" / "musique.jsonl", rows[:1])
    assert load_longbench(tmp_path / "zip", "musique") == rows[:1]


def test_load_parquet_layouts(tmp_path):
    rows = [_row(i) for i in range(4)]
    _write_parquet(tmp_path / "nested" / "hotpotqa" / "test" / "0000.parquet", rows)
    _write_parquet(tmp_path / "nested" / "hotpotqa" / "validation" / "0000.parquet", [_row(9)])
    assert load_longbench(tmp_path / "nested", "hotpotqa") == rows
    assert load_longbench(tmp_path / "nested", "hotpotqa", limit=1) == rows[:1]

    _write_parquet(tmp_path / "flat" / "hotpotqa-00000-of-00001.parquet", rows[:2])
    _write_parquet(tmp_path / "flat" / "hotpotqa_e.parquet", [_row(7, "hotpotqa_e")])
    loaded = load_longbench(tmp_path / "flat", "hotpotqa")
    assert loaded == rows[:2]
    assert loaded[0]["answers"] == ["lamp 0", "the lamp"] and loaded[0]["all_classes"] is None


def test_missing_field_names_field_file_and_row(tmp_path):
    rows = [_row(0), _row(1)]
    del rows[1]["answers"]
    _write_jsonl(tmp_path / "hotpotqa.jsonl", rows)
    with pytest.raises(ValueError, match=r"hotpotqa\.jsonl:2: LongBench row lacks field 'answers'"):
        load_longbench(tmp_path, "hotpotqa")

    bad = [_row(0)]
    del bad[0]["_id"]
    _write_parquet(tmp_path / "pq" / "musique.parquet", bad)
    with pytest.raises(ValueError, match=r"musique\.parquet row 0: LongBench row lacks field '_id'"):
        load_longbench(tmp_path / "pq", "musique")


def test_missing_path_is_file_not_found(tmp_path):
    missing = tmp_path / "nowhere"
    with pytest.raises(FileNotFoundError, match="longbench: .*nowhere does not exist") as info:
        load_longbench(missing, "hotpotqa")
    assert "LONGBENCH_DIR" not in str(info.value)  # an explicit path: the shipped configs' variable is not named
    # a relative path that looks like owner/name is a local path, not a Hub id
    with pytest.raises(FileNotFoundError, match="data/longbench does not exist.*LONGBENCH_DIR.*hf:owner/name"):
        load_longbench("data/longbench", "hotpotqa")
    with pytest.raises(FileNotFoundError, match=r"no LongBench data for 'qasper'.*qasper\.jsonl"):
        load_longbench(tmp_path, "qasper")


def test_hub_id_goes_through_datasets_lazily(monkeypatch):
    import datasets

    calls = []

    def fake_load_dataset(path, name=None, **kwargs):
        calls.append((path, name, kwargs))
        if name is not None:
            raise ValueError(f"BuilderConfig '{name}' not found. Available: ['default']")
        return [_row(i) for i in range(3)]

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    rows = load_longbench("hf:someone/LongBench-parquet", "hotpotqa", limit=2,
                          revision="refs/convert/parquet")
    assert rows == [_row(0), _row(1)]
    assert calls[0] == ("someone/LongBench-parquet", "hotpotqa",
                        {"split": "test", "revision": "refs/convert/parquet"})
    assert calls[1][2]["data_dir"] == "hotpotqa"

    def offline(*args, **kwargs):
        raise ConnectionError("hub unreachable")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(FileNotFoundError, match="hf:missing/dir: loading the Hub dataset failed.*hub unreachable"):
        load_longbench("hf:missing/dir", "hotpotqa")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # a compute node: refused before any network call
    calls.clear()
    with pytest.raises(FileNotFoundError, match="HF_HUB_OFFLINE is set"):
        load_longbench("hf:someone/LongBench-parquet", "hotpotqa")
    assert not calls

    # neither module imports datasets (or pyarrow) at import time
    for module in (longbench, longbench_metrics):
        tree = ast.parse(Path(module.__file__).read_text(encoding="utf-8"))
        top = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
        names = {a.name.split(".")[0] for n in top if isinstance(n, ast.Import) for a in n.names}
        names |= {n.module.split(".")[0] for n in top if isinstance(n, ast.ImportFrom) and n.module}
        assert not names & {"datasets", "pyarrow"}, module.__name__


# ------------------------------------------------------------ tokenizer, records

WORDS = ("river stone lamp garden window orange quiet silver harbor candle forest meadow "
         "north bridge copper field").split()
SPECIALS = [BOS, EOS, PAD, USER, ASSISTANT]


@pytest.fixture(scope="module")
def tok() -> PreTrainedTokenizerFast:
    """A byte-level BPE trained here; like Llama's, it adds BOS when asked for special tokens."""
    rng = random.Random(0)
    corpus = [" ".join(rng.choice(WORDS) for _ in range(30)) + "." for _ in range(200)]
    corpus += list(DATASET2PROMPT.values())
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    backend.train_from_iterator(corpus, trainer)
    backend.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", special_tokens=[(BOS, backend.token_to_id(BOS))]
    )
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token=BOS, eos_token=EOS, pad_token=PAD,
        additional_special_tokens=[USER, ASSISTANT], clean_up_tokenization_spaces=False,
    )
    wrapped.chat_template = CHAT_TEMPLATE
    return wrapped


def _ids(tok, text: str) -> list[int]:
    return list(tok(text, add_special_tokens=False)["input_ids"])


def test_short_prompt_is_not_truncated(tok):
    row = _row(1, words=20)
    record = longbench_records([row], "hotpotqa", tok, max_length=4096)[0]
    filled = DATASET2PROMPT["hotpotqa"].format(**row)
    assert record.context + "\n\n" + record.question == filled
    assert record.context.endswith(row["context"])
    assert record.question.startswith("Answer the question based on the given passages.")
    assert record.question.endswith(f"Question: {row['input']}\nAnswer:")
    assert record.answers == row["answers"]
    assert (record.id, record.task) == ("longbench_hotpotqa:id-0001", "longbench_hotpotqa")
    meta = record.metadata
    # pred.py's count: with the special tokens the tokenizer adds (here a BOS)
    assert meta["truncated"] is False and meta["original_length"] == len(_ids(tok, filled)) + 1
    assert (meta["dataset"], meta["_id"], meta["max_new_tokens"]) == ("hotpotqa", "id-0001", 32)
    assert meta["all_classes"] is None and meta["target_tokens"] == 4096
    ids, question_start = build_prompt_ids(tok, record)
    assert record.length == len(ids)
    assert tok.decode(ids[question_start:]).startswith("Answer the question based")


@pytest.mark.parametrize("max_length", [256, 255])
def test_middle_truncation_keeps_half_the_budget_from_each_end(tok, max_length):
    row = _row(2, words=600)
    filled = DATASET2PROMPT["hotpotqa"].format(**row)
    ids = list(tok(filled)["input_ids"])  # with the BOS this tokenizer adds, as pred.py encodes
    assert ids[0] == tok.bos_token_id and len(ids) > 2 * max_length
    record = longbench_records([row], "hotpotqa", tok, max_length=max_length)[0]
    half = max_length // 2
    prompt = record.context + record.separator + record.question
    # pred.py's rule, exactly: decoded first half + decoded last half, BOS skipped
    assert prompt == tok.decode(ids[:half], skip_special_tokens=True) + tok.decode(ids[-half:])
    assert record.metadata["truncated"] is True
    assert record.metadata["original_length"] == len(ids)
    # re-encoded: the kept text tokens come back (the first half has one fewer: the BOS
    # took its slot), up to the junction tolerance
    again = _ids(tok, prompt)
    assert abs(len(again) - (2 * half - 1)) <= JUNCTION_TOLERANCE
    keep = half - 1 - JUNCTION_TOLERANCE
    assert again[:keep] == ids[1:keep + 1] and again[-keep:] == ids[-keep:]
    # the instruction at the start and the whole question part survive
    assert record.context.startswith("Answer the question based on the given passages.")
    assert record.question == split_template("hotpotqa")[2].format(**row)
    assert f"Question: {row['input']}" in record.question
    assert len(record.context) < len(filled) / 2


def test_prompt_has_a_single_bos(tok):
    row = _row(3, words=600)
    record = longbench_records([row], "hotpotqa", tok, max_length=200)[0]
    # the tokenizer itself adds BOS (as Llama's does); the chat template adds one too
    assert tok(record.context)["input_ids"][0] == tok.bos_token_id
    ids, question_start = build_prompt_ids(tok, record)
    assert ids[0] == tok.bos_token_id and ids.count(tok.bos_token_id) == 1
    assert record.length == len(ids)
    assert 0 < question_start < len(ids)
    assert len(ids) - (200 // 2) * 2 <= 16  # only the chat template's tokens on top


def test_templates_without_a_blank_line_split_at_their_newlines(tok):
    for dataset, separator in (("trec", "\n"), ("lcc", ""), ("repobench-p", "")):
        row = _row(0, dataset)
        row["all_classes"] = ["lamp", "stone"] if dataset == "trec" else None
        record = longbench_records([row], dataset, tok, max_length=512)[0]
        assert record.separator == separator
        assert record.context + separator + record.question == DATASET2PROMPT[dataset].format(**row)
        ids, question_start = build_prompt_ids(tok, record)
        assert 0 < question_start < len(ids)
    with pytest.raises(ValueError, match="no LongBench prompt template"):
        longbench_records([_row(0)], "nq", tok, max_length=512)


def test_question_longer_than_half_the_budget_is_an_error(tok):
    row = _row(4, words=600)
    row["input"] = " ".join(["which", "silver", "lamp"] * 40) + "?"
    with pytest.raises(ValueError, match=r"lost the question part: its question part has \d+ tokens.*give length=\d+ or more"):
        longbench_records([row], "hotpotqa", tok, max_length=128)
    with pytest.raises(ValueError, match="at least 2"):
        middle_truncate(tok, "river stone", 1)


def test_records_reject_a_row_without_answers(tok):
    row = _row(5)
    row["answers"] = []
    with pytest.raises(ValueError, match="'answers' must be a non-empty list"):
        longbench_records([row], "hotpotqa", tok, max_length=512)
    assert set(REQUIRED_FIELDS) <= set(_row(0))


def test_generate_and_score_with_a_random_init_model(tok):
    rows = [_row(i, words=300) for i in range(2)]
    records = longbench_records(rows, "hotpotqa", tok, max_length=256)
    model = model_for(tok, layers=1, hidden=32, heads=2, kv_heads=1, positions=1024)
    predictions = []
    for record in records:
        ids, _ = build_prompt_ids(tok, record)
        with torch.no_grad():
            out = model.generate(torch.tensor([ids]), do_sample=False,
                                 max_new_tokens=record.metadata["max_new_tokens"])
        new = out[0, len(ids):].tolist()
        assert 0 < len(new) <= 32
        predictions.append(tok.decode(new, skip_special_tokens=True))
    scores = [score_longbench_record(r, p) for r, p in zip(records, predictions)]
    assert all(0.0 <= s <= 1.0 for s in scores)
    total = score_task("hotpotqa", predictions, [r.answers for r in records])
    assert total == round(100 * sum(scores) / len(scores), 2)
    # a perfect answer scores 1 through the same path
    assert score_longbench_record(records[0], "lamp 0") == 1.0


def test_every_longbench_dataset_has_a_task_config(tmp_path):
    """All 21 datasets have a task config (the pipeline's jobs read it as it is; kvcert run composes it as
    ``task=longbench_<dataset>``: tests/test_pipeline.py checks the two readings agree) and build records
    through the manifest step, the chat rule of the config applied."""
    import json as _json
    import random as _random

    from kvcert.generation.jobs import config_file
    from kvcert.generation.manifest import build_records
    from kvcert.rehearsal import checkpoints, longbench_files, text
    from kvcert.tasks.longbench import DATASET2PROMPT, NO_CHAT_TEMPLATE_DATASETS

    configs = Path(__file__).resolve().parents[1] / "configs"
    tok = checkpoints.train_tokenizer(checkpoints.ARCHITECTURES["llama"],
                                      text.corpus(_random.Random(0), 50) + list(DATASET2PROMPT.values()))
    for dataset in sorted(DATASET2PROMPT):
        task = config_file(configs, "task", f"longbench_{dataset}")
        assert (task["name"], task["kind"], task["dataset"]) == (f"longbench_{dataset}", "longbench", dataset)
        row = longbench_files.row(_random.Random(dataset), "hotpotqa", 0, 80)
        row.update(dataset=dataset, all_classes=["Location"] if dataset in ("trec", "lsht") else None)
        (tmp_path / f"{dataset}.jsonl").write_text(_json.dumps(row) + "\n")
        record = build_records({**task, "source": str(tmp_path)}, tok, 1024, 1, 0)[0]
        assert record.task == f"longbench_{dataset}"
        assert (record.metadata.get("chat_template", True) is False) == (dataset in NO_CHAT_TEMPLATE_DATASETS)
        everything = build_records({**task, "source": str(tmp_path), "chat_template": "all"}, tok, 1024, 1, 0)[0]
        assert "chat_template" not in everything.metadata
