"""kvcert and kvpress 0.5.5 in one environment (docs/kvpress.md).

Not collected by the main test run (kvpress is not installed there): tests/test_kvpress_env.py
installs kvpress beside kvcert in a throwaway virtual environment and runs this file
there. Each test uses kvpress's own code: its pipeline, its presses, its crop between
questions.
"""

from __future__ import annotations

import json

import pytest
import torch

from test_kvpress_goldens import GOLDEN, from_hex, kept_under, model  # noqa: F401 (the fixture)

kvpress = pytest.importorskip("kvpress")


@pytest.fixture(scope="module")
def embedded():
    from transformers import AutoModelForCausalLM, AutoTokenizer, pipeline

    from kvcert.embedded import embedded_model_path
    from kvcert.tasks import get_task

    path = embedded_model_path()
    tokenizer = AutoTokenizer.from_pretrained(path)
    loaded = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    records = get_task("needle").generate(tokenizer, 3, 400, 0)
    return loaded, tokenizer, pipeline("kv-press-text-generation", model=loaded, tokenizer=tokenizer), records


def kvpress_question(record) -> str:
    """kvpress's pipeline renders context + question as one user message, so the separator goes
    with the question (and ``generate_answer`` takes ``separator=""``)."""
    return record.separator + record.question


@pytest.mark.parametrize("budget", [0.25, 0.5])
def test_kvpress_pipeline_with_the_poisson_press_answers_as_generate_answer_in_kvpress_order(embedded, budget):
    from kvcert import EvictionPress, generate_answer
    from kvcert.generation.engine import example_seed

    model_, tokenizer, pipe, records = embedded
    for record in records:
        question = kvpress_question(record)
        ours = generate_answer(model_, tokenizer, record.context, question, method="snapkv-poisson", budget=budget,
                               condition="streaming", separator="", answer_prefix=record.answer_prefix,
                               max_new_tokens=12)
        assert ours["certificate_status"] == "certified" and max(ours["kept_fraction"]) < 1.0
        press = EvictionPress(scorer="snapkv", budget=budget, sampler="poisson",
                              seed=example_seed(0, "generate_answer"))
        theirs = pipe(record.context, question=question, press=press, answer_prefix=record.answer_prefix,
                      max_new_tokens=12)
        assert theirs["answer"] == ours["answer"], (record.id, budget)


@pytest.mark.parametrize("kvcert_cache", [False, True], ids=["DynamicCache", "CertifiedCache"])
def test_the_same_question_twice_gets_the_same_answer(embedded, kvcert_cache):
    """kvpress's pipeline crops the cache back between questions; a kvcert cache honours it."""
    from kvcert import CertifiedCache, EvictionPress

    model_, _, pipe, records = embedded
    record, other = records[0], records[1]
    press = EvictionPress(scorer="snapkv", budget=0.25, sampler="poisson", seed=1)
    cache = CertifiedCache() if kvcert_cache else None
    questions = [kvpress_question(record), kvpress_question(other), kvpress_question(record)]
    out = pipe(record.context, questions=questions, press=press, answer_prefix=record.answer_prefix,
               max_new_tokens=12, cache=cache)["answers"]
    alone = pipe(record.context, question=questions[0], press=press, answer_prefix=record.answer_prefix,
                 max_new_tokens=12)["answer"]
    assert out[0] == out[2] == alone
    if kvcert_cache:
        assert all(layer.seen == layer.compacted_seen for layer in cache.layers)  # the context alone is left
        assert len(cache.step_log) > 0  # its forwards were certified


@pytest.mark.parametrize("make", [lambda: kvpress.SnapKVPress(compression_ratio=0.5),
                                  lambda: kvpress.AdaKVPress(kvpress.SnapKVPress(compression_ratio=0.5))],
                         ids=["SnapKVPress", "AdaKVPress"])
def test_a_kvpress_press_on_a_kvcert_cache_raises(embedded, make):
    from kvcert import CertifiedCache

    _, _, pipe, records = embedded
    with pytest.raises(ValueError, match="cannot compress a (kvcert )?CertifiedCache") as error:
        pipe(records[0].context, question=kvpress_question(records[0]), press=make(), cache=CertifiedCache(),
             max_new_tokens=4)
    assert "\n" not in str(error.value)


SCORER_PRESSES = {"streaming_llm": "StreamingLLMPress", "tova": "TOVAPress", "knorm": "KnormPress",
                  "snapkv": "SnapKVPress"}


@pytest.mark.parametrize("result", [r for r in GOLDEN["results"] if r["press"] in SCORER_PRESSES],
                         ids=lambda r: f"{r['press']}-cr{r['compression_ratio']}")
def test_a_kvpress_scorer_press_as_a_kvcert_scorer_keeps_the_golden_sets(model, result, monkeypatch):  # noqa: F811
    """kvpress's own scores, kvcert's top-k at kvpress's count, nothing protected: the same sets."""
    from kvcert import EvictionPress, RetentionDesign
    from kvcert.method.scorers import get_scorer

    press = EvictionPress(scorer=get_scorer(f"kvpress:{SCORER_PRESSES[result['press']]}"), sampler="topk",
                          compression_ratio=result["compression_ratio"], rounding="floor",
                          design=RetentionDesign(sinks=0, window=0))
    n = len(GOLDEN["input_ids"])
    theirs = [[from_hex(mask, n) for mask in layer] for layer in result["kept"]]
    assert kept_under(model, press, monkeypatch) == theirs


def test_kvcert_run_with_a_kvpress_scorer_certifies(tmp_path):
    from kvcert.cli import main

    assert main(["run", "task=needle", "method=kvpress:SnapKVPress-poisson", "budget=0.25", "limit=2", "length=400",
                 f"out={tmp_path}"]) in (0, None)
    rows = [json.loads(line) for line in (tmp_path / "generations" / "needle.jsonl").read_text().splitlines()]
    pressed = [row for row in rows if row["condition"] != "full"]
    assert len(pressed) == 2 and all(row["scorer"] == "kvpress:SnapKVPress" for row in pressed)
    assert all(row["certificate_status"] == "certified" and row["certificate"] for row in pressed)
    # the same scorer by name through an override of a shipped method
    out = tmp_path / "override"
    assert main(["run", "task=needle", "method=snapkv-poisson", "method.scorer=kvpress:SnapKVPress",
                 "+method.scorer_options={window_size:32}", "budget=0.25", "limit=1", "length=400",
                 f"out={out}"]) in (0, None)
    row = [json.loads(line) for line in (out / "generations" / "needle.jsonl").read_text().splitlines()][-1]
    assert row["scorer"] == "kvpress:SnapKVPress" and row["certificate_status"] == "certified"



#: kvpress ScorerPresses a name alone cannot make a kvcert scorer of: trained weights from the Hub
#: (QFilterPress, KVzapPress, ExpectedAttentionStatsPress: they load them in their model setup), a press
#: that wraps another (CriticalKVPress), attention weights (ObservedAttentionPress: eager attention)
NOT_BY_NAME = {"QFilterPress", "KVzapPress", "ExpectedAttentionStatsPress", "CriticalKVPress", "ObservedAttentionPress"}
ALL_SCORER_PRESSES = sorted(n for n in dir(kvpress) if isinstance(getattr(kvpress, n), type)
                        and issubclass(getattr(kvpress, n), kvpress.ScorerPress) and n != "ScorerPress")


@pytest.mark.parametrize("name", [n for n in ALL_SCORER_PRESSES if n not in NOT_BY_NAME])
def test_every_scorer_press_by_name_is_a_certified_kvcert_scorer(model, name):  # noqa: F811
    """Every kvpress ScorerPress but NOT_BY_NAME scores a kvcert cache after the model setup kvpress's
    ``with press(model):`` does (the rotary embedding on each attention module, the press's model fields),
    and the Poisson sampler certifies it."""
    from kvcert import CertifiedCache, EvictionPress, enable_certified_attention
    from kvcert.method.scorers import get_scorer

    enable_certified_attention(model)
    ids = torch.tensor([GOLDEN["input_ids"]])
    cache = CertifiedCache(press=EvictionPress(scorer=get_scorer("kvpress:" + name), sampler="poisson", budget=0.25))
    with torch.no_grad():
        model(input_ids=ids, cache=cache)
        model(input_ids=ids[:, -1:], cache=cache)
    assert all(0.2 < layer.length / ids.shape[1] < 0.35 for layer in cache.layers)
    assert cache.step_log and all(bool(torch.isfinite(v).all()) for v in cache.step_log[-1].variance.values())
