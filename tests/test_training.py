"""Tests of the embedded model's training code: tokenizer, data, loop, resume, CLI."""

from __future__ import annotations

import argparse
import json

import pytest
import torch
from safetensors.torch import load_file

from kvcert.tasks import build_prompt_ids, needle
from kvcert.training import cli as training_cli
from kvcert.training.data import ANSWER, AUX, Phase, SequenceBuilder, chain_digest, phase_at
from kvcert.training.evaluate import evaluate
from kvcert.training.recipes import get_recipe
from kvcert.training.tokenizer import build_tokenizer
from kvcert.training.train import lr_lambda, train


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer()


def test_tokenizer_numbers_and_roundtrip(tok):
    assert tok.tokenize("1234567") == ["12", "##34", "##56", "##7"]
    assert tok.tokenize("4821") == ["48", "##21"]
    assert tok.tokenize("007") == ["00", "##7"]  # no number maps to <unk>
    assert tok.decode(tok("4821")["input_ids"]) == "4821"
    assert tok.decode(tok("The grass is green.")["input_ids"]) == "The grass is green."
    assert build_tokenizer().get_vocab() == tok.get_vocab()  # deterministic ids
    ids = tok.apply_chat_template([{"role": "user", "content": "Here we go."}], tokenize=False,
                                  add_generation_prompt=True)
    assert ids.startswith("<s><|user|>") and ids.endswith("<|assistant|>\n")
    assert tok.eos_token == "<|end|>"


def test_batches_depend_only_on_seed_and_step(tok):
    builder = SequenceBuilder(tok)
    phase = Phase(steps=4, lengths=(200, 300), tokens_per_batch=1200,
                  task_weights={"copy": 1.0, "needle": 1.0, "multikey": 1.0, "multiturn": 1.0})
    a, b = builder.batch(phase, 0, 3), builder.batch(phase, 0, 3)
    assert torch.equal(a.input_ids, b.input_ids) and torch.equal(a.roles, b.roles)
    assert a.digest() == b.digest() != builder.batch(phase, 0, 4).digest()
    assert builder.batch(phase, 1, 3).digest() != a.digest()
    assert chain_digest("0" * 64, a.digest()) != chain_digest("1" * 64, a.digest())


def test_copy_sequences_supervise_only_repeats(tok):
    import random

    builder = SequenceBuilder(tok)
    seq = builder.copy_sequence(random.Random(0), 256, segment=(16, 64))
    ids, roles = seq.ids, seq.roles
    assert len(ids) == len(roles) == 256
    assert roles.count(AUX) > 100
    for position, role in enumerate(roles):
        if role == AUX:  # a repeat continues the previous occurrence of its predecessor
            assert ids[position] in ids[:position]
            assert ids[position - 1] in ids[:position - 1]
    # retrieval targets: from query q (predicting q + 1), earlier positions holding that token
    assert seq.retrieval
    for query, sources in seq.retrieval:
        assert sources and all(s <= query and ids[s] == ids[query + 1] for s in sources)


def test_task_sequence_starts_with_the_evaluation_prompt(tok):
    import random

    builder = SequenceBuilder(tok, max_questions=3)
    seq = builder.task_sequence(random.Random(0), "needle", 400, seed=5, index=2)
    ids, roles = seq.ids, seq.roles
    assert roles[0] != ANSWER
    answers = []
    current: list[int] = []
    for token, role in zip(ids, roles):
        if role == ANSWER:
            current.append(token)
        elif current:
            answers.append(current)
            current = []
    if current:
        answers.append(current)
    assert 1 <= len(answers) <= 3
    for answer in answers:  # the value after RULER's answer prefix, then <|end|>
        assert answer[-1] == tok.eos_token_id
        text = tok.decode(answer[:-1])
        assert len(text) == 7 and text.isdigit()
    first = roles.index(ANSWER)
    prompt = tok.decode(ids[:first])
    assert prompt.endswith("mentioned in the provided text is")
    assert tok.convert_ids_to_tokens(ids[first - 13]) == "<|assistant|>"  # then the 12-token prefix
    # every response token that states the key or the value is supervised to look at
    # where that token stands in the prompt
    prompt_end = first
    assert seq.retrieval
    for query, sources in seq.retrieval:
        assert roles[query + 1] == ANSWER
        assert all(s < prompt_end and ids[s] == ids[query + 1] for s in sources)


@pytest.mark.parametrize("task", ["needle", "lookalike", "multikey", "multiturn"])
def test_entity_and_question_targets(tok, task):
    """Entity targets: positions shortly after a key look at the key's last token (and no
    further than the window); question targets: a question's positions after its key
    look at the whole sentence stating the fact asked about."""
    import random

    from kvcert.tasks import get_task
    from kvcert.training.data import ENTITY_WINDOW

    builder = SequenceBuilder(tok, max_questions=3)
    seq = builder.task_sequence(random.Random(1), task, 700, seed=5, index=4)
    ids, roles = seq.ids, seq.roles
    tokens = tok.convert_ids_to_tokens(ids)
    record = get_task(task).make_record(tok, 700, 5, 4, **_options_of(task, 700))
    keys = {qa.key for qa in get_task(task).questions_for(record)}
    key_ends = sorted({e for key in keys for e in builder._key_ends(ids, key)})
    assert seq.entity and key_ends
    for query, (target,) in seq.entity:  # the most recent key, within the window
        assert target == max(e for e in key_ends if e < query) and query - target <= ENTITY_WINDOW
    assert {t for _, (t,) in seq.entity} == set(key_ends) - {len(ids) - 1}
    assert seq.question
    for query, span in seq.question:
        fact = tok.decode([ids[p] for p in span])
        assert span == list(range(span[0], span[-1] + 1))  # one sentence, contiguous
        assert span[-1] < query and roles[query + 1] != ANSWER  # in the prompt, before the answer
        assert any(tok.decode([ids[p]]) in fact for p in range(query - ENTITY_WINDOW, query))
        assert tokens[span[-1]] == "." and any(k.split("-")[-1] in fact for k in keys)
    if task in ("needle", "lookalike"):  # the sentence holds the value that is then answered
        answer = [t for t, r in zip(ids, roles) if r == ANSWER][:-1]
        first_span = seq.question[0][1]
        value = [t for t in answer if t != tok.eos_token_id][:4]
        assert [ids[p] for p in first_span[-5:-1]] == value


def _options_of(task, length):
    """The generator options ``task_sequence`` drew for the test's record (same rng)."""
    import random

    from kvcert.training.data import train_options

    return train_options(task, random.Random(1), length, 8)


def test_retrieval_probe_reproduces_the_models_attention(tok):
    from kvcert.training.model import ArchitectureSpec, build_model
    from kvcert.training.train import RetrievalProbe

    spec = ArchitectureSpec(hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16,
                     intermediate_size=64)
    model = build_model(spec, tok, seed=1)
    model.config._attn_implementation = "eager"
    probe = RetrievalProbe(model, layer=1, head=3)
    ids = torch.randint(5, len(tok), (2, 40), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        out = model(input_ids=ids, output_attentions=True)
        rows, queries = torch.tensor([0, 1, 1]), torch.tensor([0, 17, 39])
        mine = probe.log_attention(rows, queries).exp().double()
    probe.close()
    reference = out.attentions[1][rows, 3, queries].double()  # (N, T) eager softmax
    assert torch.allclose(mine, reference, atol=1e-5)



def test_head_output_is_what_the_head_writes_when_it_attends_to_one_token(tok):
    """At query 0 a causal head can only attend to position 0, so its real output there
    (the o_proj input slice, projected) must equal ``head_output`` at position 0."""
    from kvcert.training.model import ArchitectureSpec, build_model
    from kvcert.training.train import RetrievalProbe

    spec = ArchitectureSpec(hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16,
                     intermediate_size=64)
    model = build_model(spec, tok, seed=2)
    attention = model.model.layers[1].self_attn
    seen = {}
    hook = attention.o_proj.register_forward_pre_hook(lambda m, args: seen.update(x=args[0]))
    probes = [RetrievalProbe(model, layer=1, head=h) for h in (0, 3)]  # KV heads 0 and 1
    ids = torch.randint(5, len(tok), (2, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        model(input_ids=ids)
        rows, zeros = torch.tensor([0, 1]), torch.tensor([0, 0])
        for probe in probes:
            h, d = probe.head, probe.head_dim
            real = seen["x"][rows, 0, h * d:(h + 1) * d] @ attention.o_proj.weight[:, h * d:(h + 1) * d].T
            assert torch.allclose(probe.head_output(rows, zeros), real, atol=1e-5)
            probe.close()
    hook.remove()

def test_phases_and_schedule():
    recipe = get_recipe("tiny")
    assert phase_at(recipe.phases, 0) is recipe.phases[0]
    assert phase_at(recipe.phases, recipe.phases[0].steps) is recipe.phases[1]
    with pytest.raises(IndexError):
        phase_at(recipe.phases, recipe.total_steps)
    factor = lr_lambda(get_recipe("embedded"))
    total = get_recipe("embedded").total_steps
    assert factor(0) < factor(get_recipe("embedded").warmup_steps) == pytest.approx(1.0)
    assert factor(total) == pytest.approx(get_recipe("embedded").min_lr_ratio)
    with pytest.raises(KeyError, match="unknown recipe"):
        get_recipe("nope")


def _weights(model_dir):
    return load_file(str(model_dir / "model.safetensors"))


def test_train_checkpoints_and_resumes_identically(tmp_path):
    recipe = get_recipe("tiny")
    whole = train(recipe, tmp_path / "whole", seed=3, progress=False)
    assert whole.steps == recipe.total_steps
    assert (tmp_path / "whole" / "checkpoint.pt").exists()
    assert (tmp_path / "whole" / "loss_curve.png").stat().st_size > 1000

    assert (tmp_path / "whole" / "config.json").exists()
    part = train(recipe, tmp_path / "split", seed=3, stop_after=3, progress=False)
    assert part.steps == 3 and not (tmp_path / "split" / "config.json").exists()
    resumed = train(recipe, tmp_path / "split", seed=3, progress=False)
    assert resumed.resumed_from == 3 and resumed.steps == recipe.total_steps

    assert resumed.data_sha256 == whole.data_sha256
    assert [h["loss"] for h in resumed.history] == [h["loss"] for h in whole.history]
    a, b = _weights(whole.model_dir), _weights(resumed.model_dir)
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)

    other = train(recipe, tmp_path / "other", seed=4, progress=False)
    assert other.data_sha256 != whole.data_sha256
    with pytest.raises(ValueError, match="different recipe or seed"):
        train(recipe, tmp_path / "whole", seed=4, progress=False)


def test_train_model_command(tmp_path, capsys):
    parser = argparse.ArgumentParser()
    training_cli.register(parser.add_subparsers())
    out = tmp_path / "run"
    args = parser.parse_args(["train-model", "--recipe", "tiny", "--out", str(out), "--quiet",
                              "--stop-after", "2"])
    assert args.func(args) == 0
    assert "rerun the same command to resume" in capsys.readouterr().out
    args = parser.parse_args(["train-model", "--recipe", "tiny", "--out", str(out), "--quiet",
                              "--eval-examples", "1"])
    assert args.func(args) == 0
    model_dir = out
    record = json.loads((model_dir / "provenance.json").read_text())
    assert record["command"] == "kvcert train-model --recipe tiny --seed 0 --eval-examples 1"
    assert len(record["training_data_sha256"]) == 64 and record["steps"] == get_recipe("tiny").total_steps
    assert record["eval_lengths"] == list(get_recipe("tiny").eval_lengths)
    tasks = {"needle", "lookalike", "multikey", "multiturn"}
    assert set(record["accuracy_full_cache"]) == set(record["accuracy_streaming_topk_12_5"]) == tasks
    assert record["streaming_topk_method"]["budget"] == 0.125
    regime = record["regime"]  # the eviction regime, on records from the training seed range
    assert regime["seed"] >= 1_000_000 and set(regime["full"]) == set(get_recipe("tiny").regime_tasks)
    assert set(regime["induced"]) == {"aware@0.125", "aware@0.25", "aware@0.5",
                                      "streaming@0.125", "streaming@0.25"}
    assert record["training_wall_time_s"] > 0
    assert (model_dir / "loss_curve.png").exists()
    assert str(tmp_path) not in (model_dir / "provenance.json").read_text()

    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(model_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    assert type(model).__name__ == "LlamaForCausalLM"
    record_ = needle.make_record(tokenizer, 200, 0, 0)
    ids, _ = build_prompt_ids(tokenizer, record_)
    assert model(input_ids=torch.tensor([ids])).logits.shape[-1] == len(tokenizer)
    accuracy = evaluate(model, tokenizer, ["needle"], [200], 2, progress=False)
    assert 0.0 <= accuracy["needle"]["200"] <= 1.0


def test_regime_counts_induced_failures_among_full_cache_successes(monkeypatch, tok):
    """The regime table's rates are failures / runs over the records the full cache gets
    right, pooled over samplers and tasks; records the full cache fails are not run."""
    from kvcert.generation import engine as engine_module
    from kvcert.generation import forked as forked_module
    from kvcert.training import evaluate as evaluate_module

    calls = []

    class FakeEngine:  # answers from the record's index and the condition
        def __init__(self, model, tokenizer, spec):
            self.spec = spec

        def answer(self, record):
            index = int(record.id.rsplit("-", 1)[1])
            condition, sampler = self.spec.condition, self.spec.method.sampler
            calls.append((condition, sampler, index))
            right = {"full": index != 3,  # the full cache fails record 3
                     "aware": not (index == 0 and sampler == "poisson"),  # one induced failure
                     "streaming": index >= 2}[condition]
            return {"answer": record.answers[0] if right else "nothing"}

    class FakeModel:
        config = type("C", (), {"_attn_implementation": "sdpa"})()
        training = False

        def eval(self):
            return self

        def train(self, mode=True):
            return self

        def set_attn_implementation(self, name):
            self.config._attn_implementation = name

    monkeypatch.setattr(engine_module, "Engine", FakeEngine)
    monkeypatch.setattr(forked_module, "generate", lambda engines, record: [e.answer(record) for e in engines])
    monkeypatch.setattr("kvcert.method.integration.enable_certified_attention", lambda model: None)
    regime = evaluate_module.evaluate_regime(FakeModel(), tok, ["needle"], [300], 4, seed=1_000_001,
                                             cells=[("aware", 0.25), ("streaming", 0.125)], progress=False)
    assert regime["full"] == {"needle": {"300": 0.75}}
    # aware: 3 successes x 2 samplers = 6 runs, 1 failure; streaming: records 0 and 1 fail, both samplers
    assert regime["induced"]["aware@0.25"] == {"needle": 1 / 6, "pooled": 1 / 6}
    assert regime["induced"]["streaming@0.125"] == {"needle": 4 / 6, "pooled": 4 / 6}
    assert not any(index == 3 and condition != "full" for condition, _, index in calls)
