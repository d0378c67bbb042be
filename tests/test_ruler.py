"""RULER's synthetic tasks (kvcert.tasks.ruler) against RULER's scripts' behaviour, restated in
tests/ruler_official.py: every prompt rebuilt from its parts by the official template logic, insertions,
fixed-seed shuffles and counts; the metrics on known cases; the suite's names and table."""

from __future__ import annotations

import math
import random
from collections import Counter

import pytest

from kvcert.tasks import RULER_TASKS, TASKS, build_prompt_ids, score
from kvcert.tasks import metrics, prose, ruler
from kvcert.tasks.longbench_metrics import bucket_scores, length_bucket, score_task_e
from kvcert.tasks.prompting import prompt_length
from kvcert.tasks.records import read_jsonl, write_jsonl
from kvcert.training.tokenizer import build_tokenizer

import ruler_official as official

SEED = 5


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer()


@pytest.fixture(scope="module")
def records(tok):
    """Three records of every RULER task at 1024 tokens (cwe also at 4096: RULER's long setting)."""
    built = {name: TASKS[name].generate(tok, 3, 1024, seed=SEED) for name in RULER_TASKS}
    built["ruler_cwe_4096"] = TASKS["ruler_cwe"].generate(tok, 1, 4096, seed=SEED)
    return built


def test_the_registry_holds_rulers_synthetic_yaml():
    assert [name for name in ruler.RULER_TASKS] == list(official.SYNTHETIC_YAML)
    for name, (task, args) in official.SYNTHETIC_YAML.items():
        spec = ruler.RULER_TASKS[name]
        assert spec.task == task and spec.registered == "ruler_" + name in TASKS
        if task == "niah":
            assert (spec.args["type_haystack"], spec.args["type_needle_k"], spec.args["type_needle_v"]) == \
                (args["type_haystack"], args["type_needle_k"], args["type_needle_v"])
            assert (spec.args["num_needle_k"], spec.args["num_needle_v"], spec.args["num_needle_q"]) == \
                (args["k"], args["v"], args["q"])
        else:
            assert spec.args == args
        assert ruler.TEMPLATES[task] == official.TEMPLATES[task]
        assert ruler.TOKENS_TO_GENERATE[task] == official.TOKENS[task]
        assert TASKS[spec.registered].default_length == 4096


@pytest.mark.parametrize("name", RULER_TASKS)
def test_records_are_seeded_and_fit_rulers_length(tok, records, name, tmp_path):
    first = records[name]
    write_jsonl(first, tmp_path / "r.jsonl")
    assert [r.to_dict() for r in read_jsonl(tmp_path / "r.jsonl")] == [r.to_dict() for r in first]
    assert [r.to_dict() for r in first] == [r.to_dict() for r in TASKS[name].generate(tok, 3, 1024, seed=SEED)]
    assert TASKS[name].generate(tok, 2, 1024, seed=SEED)[1].to_dict() == first[1].to_dict()  # per index
    other = TASKS[name].generate(tok, 3, 1024, seed=SEED + 1)
    assert [r.context for r in first] != [r.context for r in other]
    assert len({r.id for r in first + other}) == 6
    for r in first:
        ids, start = build_prompt_ids(tok, r)
        assert r.length == len(ids) and 0 < start < len(ids)
        reserve = official.TOKENS[ruler.RULER_TASKS[r.metadata["ruler_task"]].task]
        assert r.metadata["answer_tokens"] == r.metadata["max_new_tokens"] == reserve
        assert r.length + reserve <= 1024  # RULER: input + tokens_to_generate within max_seq_length
        assert r.separator == "\n" and r.answers


def _niah_parts(record):
    """(instruction line, haystack lines with the needles, the needle lines in order)."""
    head, *lines = record.context.split("\n")
    return head, lines, [line for line in lines if line.startswith("One of the special magic")]


@pytest.mark.parametrize("name", [n for n in RULER_TASKS if "niah" in n])
def test_niah_prompts_are_rulers(records, name):
    spec = ruler.RULER_TASKS[name[len("ruler_"):]]
    args = official.SYNTHETIC_YAML[spec.name][1]
    nk, nv, nq = max(args["k"], args["q"]), args["v"], args["q"]
    for record in records[name]:
        meta = record.metadata
        _, lines, _ = _niah_parts(record)
        type_v = args["type_needle_v"]
        # the needles: nk keys with nv values each, in generation order, shuffled by random.Random(seed)
        needles = [f"One of the special magic {type_v} for {n['key']} is: {value}."
                   for n in meta["needles"] for value in n["values"]]
        assert len(meta["needles"]) == nk and all(len(n["values"]) == nv for n in meta["needles"])
        random.Random(SEED).shuffle(needles)
        # the haystack: noise lines, Python's prose (RULER's essay replaced) or random needles, one per line
        haystack_kind = {"noise": "noise", "essay": "prose"}.get(args["type_haystack"], "needle")
        assert meta["haystack"] == haystack_kind and meta["ruler_haystack"] == args["type_haystack"]
        placed = [i for i, line in enumerate(lines) if line in needles]
        assert len(placed) == len(needles)
        haystack = [line for i, line in enumerate(lines) if i not in set(placed)]
        if haystack_kind == "noise":
            assert set(haystack) == {official.RULER_NOISE}
        elif haystack_kind == "prose":  # a passage: consecutive sentences of the stream, wrapping around
            stream = prose.sentences()
            assert any(haystack == [stream[(start + i) % len(stream)] for i in range(len(haystack))]
                       for start, sentence in enumerate(stream) if sentence == haystack[0])
        else:
            assert all(line.startswith(f"One of the special magic {type_v} for ") for line in haystack)
            assert not any(f" for {n['key']} is:" in line for n in meta["needles"] for line in haystack)
        # niah.py's insertion: distinct indexes of range(len(haystack)), the largest first, needles[i] at the i-th
        indexes = [position - rank for rank, position in enumerate(placed)]
        by_index = dict(zip(indexes, [lines[p] for p in placed]))
        drawn = sorted(indexes, reverse=True)
        assert [by_index[i] for i in drawn] == needles
        assert lines == official.official_insert(haystack, [by_index[i] for i in drawn], drawn)
        assert all(b - a >= 2 for a, b in zip(placed, placed[1:]))  # never adjacent, never one line
        assert placed[-1] < len(lines) - 1  # never after the last haystack line
        # the query and the answers; the prompt as prepare.py + niah.py build it
        assert len(meta["queries"]) == nq
        values = {n["key"]: n["values"] for n in meta["needles"]}
        assert record.answers == [v for q in meta["queries"] for v in values[q]]
        singular = nq * nv == 1
        text, prefix = official.official_input(
            "niah", singular, type_needle_v=type_v[:-1] if singular else type_v, context="\n".join(lines),
            query=official.official_niah_query(meta["queries"]))
        assert record.context + record.separator + record.question == text
        assert record.answer_prefix == prefix
        kinds = {"words": r"^[a-z]+-[a-z]+$", "uuids": r"^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$"}
        import re

        for n in meta["needles"]:
            assert re.match(kinds[args["type_needle_k"]], n["key"])
            for value in n["values"]:
                assert re.match(kinds[type_v], value) if type_v == "uuids" else re.match(r"^[1-9]\d{6}$", value)


def test_niah_wording_singular_and_plural(records):
    single = records["ruler_niah_single_1"][0]
    assert single.context.startswith("A special magic number is hidden within the following text. Make sure to "
                                     "memorize it. I will quiz you about the number afterwards.\n")
    assert single.question.startswith("What is the special magic number for ")
    uuid = records["ruler_niah_single_3"][0]
    assert uuid.context.startswith("A special magic uuid is hidden") and "magic uuids for" in uuid.context
    multi = records["ruler_niah_multivalue"][0]
    assert multi.context.startswith("Some special magic numbers are hidden")
    assert multi.answer_prefix.endswith("mentioned in the provided text are")
    query = records["ruler_niah_multiquery"][0].question
    assert query.count(", ") == 3 and ", and " in query


def test_the_noise_haystack_is_sized_as_ruler_sizes_it(tok, records):
    """niah.py's search: the largest haystack whose prompt plus 128 answer tokens fits; one more line does not."""
    for record in records["ruler_niah_single_1"]:
        assert official.official_fits(record.length, 1024)
        longer = record.context + "\n" + official.RULER_NOISE
        assert not official.official_fits(prompt_length(tok, longer, record.question, record.separator,
                                                        record.answer_prefix), 1024)


def test_vt_prompts_are_rulers(records):
    for record in records["ruler_vt"]:
        meta = record.metadata
        icl, main = record.context.split("\n\nMemorize and track", 1)
        main = "Memorize and track" + main
        # the chain: five-letter variables, the value first, each next variable assigned the one before
        chain = meta["chains"][0]
        variables = record.answers
        assert len(variables) == 5 and all(len(v) == 5 and v.isupper() for v in variables)
        assert chain == [f"VAR {variables[0]} = {meta['value']}"] + \
            [f"VAR {variables[j + 1]} = VAR {variables[j]} " for j in range(4)]
        assert 10000 <= int(meta["value"]) <= 99998
        head = "Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n"
        lines = main[len(head):].split("\n")
        placed = [i for i, line in enumerate(lines) if line.startswith("VAR ")]
        drawn = [p - j for j, p in enumerate(placed)]
        noises = len(lines) - len(placed)
        assert lines == official.official_vt_insert(noises, [chain], [drawn], official.RULER_NOISE)
        text, prefix = official.official_input("variable_tracking", context="\n".join(lines), query=meta["value"],
                                               num_v=5)
        assert main + record.separator + record.question == text and record.answer_prefix == prefix
        # the in-context example: RULER's prompt with its answer after the answer prefix, then a newline
        icl_text, icl_answer = icl.rsplit(", they are: ", 1)
        icl_vars = icl_answer.strip().split(" ")
        assert icl_answer == " " + " ".join(icl_vars) and len(icl_vars) == 5 and all(len(v) == 3 for v in icl_vars)
        icl_value = icl_text.split("assigned the value ")[-1]
        icl_lines = icl_text.split("\n\n", 1)[1].split("\nQuestion:")[0].split("\n")
        icl_chain = [line for line in icl_lines if line.startswith("VAR ")]
        assert icl_chain == [f"VAR {icl_vars[0]} = {icl_value}"] + \
            [f"VAR {icl_vars[j + 1]} = VAR {icl_vars[j]} " for j in range(4)]
        expected, expected_prefix = official.official_input("variable_tracking", context="\n".join(icl_lines),
                                                            query=icl_value, num_v=5)
        assert icl_text + ", they are: " == expected + expected_prefix
        assert "12345" not in icl  # randomize_icl replaced the example's value
    # one example per data set, its variables and value drawn anew for each prompt
    icls = [r.context.split("\n\nMemorize and track")[0] for r in records["ruler_vt"]]
    shapes = [[line.startswith("VAR") for line in icl.split("\n")] for icl in icls]
    assert shapes[0] == shapes[1] == shapes[2] and len(set(icls)) == 3


def _numbered_words(text: str) -> list[str]:
    parts = text.split(" ")
    words = parts[1::2]
    assert parts[0::2] == [f"{i + 1}." for i in range(len(words))]
    return words


@pytest.mark.parametrize("key, repeats, shot", [("ruler_cwe", (6, 1), (20, 3, 1)),
                                                ("ruler_cwe_4096", (30, 3), (40, 10, 3))])
def test_cwe_prompts_are_rulers(records, key, repeats, shot):
    question = "Question: What are the 10 most common words in the above list?"
    for record in records[key]:
        shot_text, main = record.context.rsplit("\nBelow is a numbered list", 1)
        main = "Below is a numbered list" + main
        head = official.TEMPLATES["common_words_extraction"][0].split("{context}")[0]
        words = _numbered_words(main[len(head):])
        # common_words_extraction.py: the common words cw times, the others ucw times, shuffled by Random(seed)
        before = official.unshuffle(words, SEED)
        cw, ucw = repeats
        common = before[:10]
        assert before[:10 * cw] == common * cw and record.answers == common
        rest = before[10 * cw:]
        uncommon = rest[:len(rest) // ucw]
        assert rest == uncommon * ucw and not set(uncommon) & set(common) and len(set(uncommon)) == len(uncommon)
        text, prefix = official.official_input("common_words_extraction", context=" ".join(
            f"{i + 1}. {w}" for i, w in enumerate(words)), query="")
        assert main + record.separator + record.question == text and record.answer_prefix == prefix
        # the one solved example before it: RULER's template with its answer, then a newline
        shot_context, shot_answer = shot_text.split("\n" + question + prefix + " ")
        shot_words = _numbered_words(shot_context[len(head):])
        shot_before = official.unshuffle(shot_words, SEED)
        n, scw, sucw = shot
        assert len(shot_before) == 10 * scw + (n - 10) * sucw
        assert shot_answer == official.official_numbered(shot_before[:10])
        expected, expected_prefix = official.official_input("common_words_extraction", context=shot_context[len(head):],
                                                            query="")
        assert shot_text == expected + expected_prefix + " " + shot_answer
        assert set(words) <= set(ruler.WORDS) and record.metadata["common_repeats"] == cw
        assert record.metadata["keys_as_words"] == 0


def test_cwe_beyond_the_embedded_words_goes_on_with_the_keys(tok, monkeypatch):
    record = TASKS["ruler_cwe"].make_record(tok, 16384, SEED, 0)
    keys = record.metadata["keys_as_words"]
    assert keys > 0 and record.metadata["filler_units"] == len(ruler.WORDS) + keys
    main = record.context.rsplit("\nBelow is a numbered list", 1)[1]
    head = official.TEMPLATES["common_words_extraction"][0].split("{context}")[0]
    words = _numbered_words(("Below is a numbered list" + main)[len(head):])
    before = official.unshuffle(words, SEED)
    assert before[:300] == record.answers * 30 and set(record.answers) <= set(ruler.WORDS)
    uncommon = set(before[300:])
    assert len(uncommon) == record.metadata["filler_units"] - 10 and set(words) <= set(ruler.WORDS) | set(ruler.KEY_WORDS)
    assert len(uncommon & set(ruler.KEY_WORDS)) == keys and len(uncommon & set(ruler.WORDS)) == len(ruler.WORDS) - 10
    monkeypatch.setattr(ruler, "KEY_WORDS", ruler.KEY_WORDS[:200])
    with pytest.raises(ValueError, match="distinct words and keys kvcert embeds; give a shorter length"):
        TASKS["ruler_cwe"].make_record(tok, 16384, SEED, 0)


def test_fwe_prompts_are_rulers(records):
    for record in records["ruler_fwe"]:
        meta = record.metadata
        head = official.TEMPLATES["freq_words_extraction"][0].split("{context}")[0]
        words = record.context[len(head):].split(" ")
        before = official.unshuffle(words, SEED)
        runs = [(w, len(list(g))) for w, g in __import__("itertools").groupby(before)]
        assert len({w for w, _ in runs}) == len(runs)  # each word one run: [w] * count, in the vocabulary's order
        assert meta["vocab_size"] == (1024 - 50) // 50
        counts = official.official_fwe_counts(meta["filler_units"], meta["vocab_size"])
        assert [c for _, c in runs] == [c for c in counts if c > 0]
        assert runs[0][0] == "..." and record.answers == [w for w, _ in runs[1:4]]
        assert all(len(w) == 6 and w.isalpha() and w.islower() for w, _ in runs[1:])
        text, prefix = official.official_input("freq_words_extraction", context=" ".join(words), query="")
        assert record.context + record.separator + record.question == text and record.answer_prefix == prefix
    assert ruler.zeta(2.0) == math.pi ** 2 / 6
    assert ruler.zeta(3.0) == pytest.approx(1.2020569031595942, rel=1e-12)


# ---------------------------------------------------------------- metrics

CASES = [  # (prediction, references)
    ("The numbers are 1234567 and 7654321.", ["1234567", "7654321"]),
    ("1234567, 42", ["1234567", "42", "999"]),
    ("PARIS it is", ["paris"]),
    ("123456", ["1234567"]),
    (" ABCDE FGHIJ klmno", ["abcde", "FGHIJ", "KLMNO", "PQRST", "UVWXY"]),
    ("", ["x"]),
]


def test_string_match_all_and_part_as_ruler_scores_them():
    preds, refs = [p for p, _ in CASES], [r for _, r in CASES]
    assert [metrics.string_match_all(p, r) for p, r in CASES] == pytest.approx([1, 2 / 3, 1, 0, 3 / 5, 0])
    assert [metrics.string_match_part(p, r) for p, r in CASES] == [1, 1, 1, 0, 1, 0]
    assert ruler.task_score(preds, refs) == official.string_match_all(preds, refs) == 54.44
    assert ruler.task_score(preds, refs, "string_match_part") == official.string_match_part(preds, refs) == 66.67
    assert ruler.task_score(["\x01 x\x02"], [["x"]]) == 100.0 and ruler.postprocess(" a\tb\x00 ") == "a\nb"
    with pytest.raises(ValueError):
        metrics.string_match_part("x", [])
    assert score("ruler_niah_multivalue", "1111111 and 2222222", ["1111111", "2222222", "3", "4"]) == 0.5


# ---------------------------------------------------------------- the suite

def test_suite_names_expand():
    everything = ruler.expand(["ruler"])
    assert everything == list(RULER_TASKS) and len(everything) == 11
    assert ruler.expand(["ruler:niah_single_1", "vt"]) == ["ruler_niah_single_1", "ruler_vt"]
    assert ruler.expand(["needle", "ruler_cwe", "ruler:fwe", "ruler_cwe"]) == ["needle", "ruler_cwe", "ruler_fwe"]
    with pytest.raises(ValueError, match="did you mean niah_single_1"):
        ruler.expand(["ruler:niah_singel_1"])
    from kvcert.commands.oneoff import expand_tasks

    assert expand_tasks(["task=ruler:niah_single_1,vt", "limit=2"]) == ["task=ruler_niah_single_1,ruler_vt", "limit=2"]
    assert expand_tasks(["task=needle"]) == ["task=needle"]


def test_the_summary_table_is_kvpress_rulers():
    table = ruler.summary_table({"ruler_niah_single_1": 1.0, "ruler_vt": 0.4, "ruler_cwe": 1 / 3})
    lines = table.split("\n")
    assert lines[0].split() == ["RULER", "task", "string_match"]
    assert [line.split() for line in lines[1:]] == [["niah_single_1", "100.00"], ["vt", "40.00"], ["cwe", "33.33"],
                                                    ["average", "57.78"]]


def test_run_prints_the_ruler_table_per_setting():
    from kvcert.commands.oneoff import longbench_e_tables, ruler_tables

    records = [{"task": "ruler_vt", "method": "full", "condition": "full", "budget": 1.0, "score": s} for s in (1, 0)]
    records += [{"task": "ruler_fwe", "method": "snapkv-poisson", "condition": "aware", "budget": 0.25, "score": 1 / 3},
                {"task": "needle", "method": "full", "condition": "full", "budget": 1.0, "score": 1.0}]
    out = ruler_tables(records)
    assert "RULER, full:" in out and "RULER, snapkv-poisson aware 0.25:" in out
    assert "vt" in out and "50.00" in out and "33.33" in out and "needle" not in out
    from kvcert.commands.oneoff import ruler_summary

    assert ruler_summary(records) == {"full": {"ruler_vt": 50.0, "average": 50.0},
                                      "snapkv-poisson aware 0.25": {"ruler_fwe": 33.33, "average": 33.33}}
    assert longbench_e_tables(records) == ""


def test_listing_names_the_suite():
    from kvcert.config.paths import resolve_configs
    from kvcert.commands.oneoff import listing

    text = listing(resolve_configs(None))
    assert "task=ruler runs RULER's synthetic suite" in text and "niah_multikey_3" in text
    assert "ruler_fwe (synthetic)" in text


# ---------------------------------------------------------------- LongBench-E by length (eval.py --e)

def test_longbench_e_buckets_as_eval_py_scores_them():
    assert [length_bucket(x) for x in (0, 3999, 4000, 7999.5, 8000, 10**6)] == \
        ["0-4k", "0-4k", "4-8k", "4-8k", "8k+", "8k+"]
    buckets = bucket_scores([1.0, 0.0, 0.5, 1 / 3], [100, 3999, 4000, 20000])
    assert buckets == {"0-4k": 50.0, "4-8k": 50.0, "8k+": 33.33}
    assert list(buckets) == ["0-4k", "4-8k", "8k+"]
    assert math.isnan(bucket_scores([1.0], [10])["8k+"])  # np.mean([]): an empty bucket is NaN
    # the official per-sample rule: the best answer, trec's first line
    e = score_task_e("trec", ["Location\nNumber", "Number"], [["Location"], ["Location"]], [500, 9000],
                     all_classes=["Location", "Number"])
    assert e["0-4k"] == 100.0 and e["8k+"] == 0.0 and math.isnan(e["4-8k"])
    with pytest.raises(ValueError):
        bucket_scores([1.0], [])


def test_run_prints_longbench_e_by_length():
    from kvcert.commands.oneoff import longbench_e_tables

    records = [{"task": "longbench_hotpotqa_e", "method": "full", "condition": "full", "budget": 1.0, "score": s,
                "metadata": {"longbench_length": n}} for s, n in ((1.0, 1000), (0.5, 5000), (0.0, 9000), (1.0, 9500))]
    out = longbench_e_tables(records).split("\n")
    assert out[0].split()[-3:] == ["0-4k", "4-8k", "8k+"]
    assert out[1].split()[-3:] == ["100.00", "50.00", "50.00"] and "longbench_hotpotqa_e" in out[1]
    from kvcert.commands.oneoff import longbench_e_buckets

    assert longbench_e_buckets(records) == {"full": {"longbench_hotpotqa_e": {"0-4k": 100.0, "4-8k": 50.0, "8k+": 50.0}}}
    assert Counter(r["task"] for r in records)["longbench_hotpotqa_e"] == 4


def test_run_composes_the_suite_with_rulers_answer_budgets():
    from kvcert.config.paths import resolve_configs, resolve_prereg
    from kvcert.commands.oneoff import compose_run

    per_task, _ = compose_run(["task=ruler", "method=snapkv-poisson", "budget=0.25"], resolve_configs(None),
                              resolve_prereg(None))
    assert [cfg["name"] for cfg, _ in per_task] == list(RULER_TASKS)
    budgets = {cfg["name"]: [c["max_new_tokens"] for c in configs] for cfg, configs in per_task}
    assert budgets["ruler_niah_single_1"] == [128, 128] and budgets["ruler_vt"] == [30, 30]
    assert budgets["ruler_cwe"] == [120, 120] and budgets["ruler_fwe"] == [50, 50]
    part, _ = compose_run(["task=ruler:vt,fwe"], resolve_configs(None), resolve_prereg(None))
    assert [cfg["name"] for cfg, _ in part] == ["ruler_vt", "ruler_fwe"]


@pytest.mark.pipeline
def test_kvcert_run_task_ruler_prints_rulers_table(tmp_path):
    import json
    import subprocess
    import sys

    from kvcert.embedded import embedded_model_path

    out = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "kvcert.cli", "run", f"model.path={embedded_model_path()}", "task=ruler:niah_single_1,fwe",
         "method=full", "limit=1", "length=600", f"out={out}", "--quiet"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.strip().splitlines()
    start = lines.index("RULER, full:")
    assert lines[start + 1].split() == ["RULER", "task", "string_match"]
    assert [line.split()[0] for line in lines[start + 2:start + 5]] == ["niah_single_1", "fwe", "average"]
    results = json.loads((out / "results.json").read_text())
    assert set(results["tasks"]) == {"ruler_niah_single_1", "ruler_fwe"}
    assert all(t["length"] == 600 for t in results["tasks"].values())
    assert set(results["ruler"]["full"]) == {"ruler_niah_single_1", "ruler_fwe", "average"}
