"""``kvcert run``'s inputs: every defect of a hostile probe is one line naming the key or file and the remedy,
refused before the model loads (and, where the check needs no data, before the tokenizer loads)."""

from __future__ import annotations

import json
import os
import re
from argparse import Namespace

import pytest

from kvcert.config.paths import configs_dir, prereg_dir

ROW = {"input": "Who wrote it?", "context": "X is y.", "answers": ["y"], "length": 10, "dataset": "hotpotqa",
       "language": "en", "all_classes": None, "_id": "a1"}


@pytest.fixture
def no_model_load(monkeypatch):
    """Loading the model fails the test: every input is checked before it."""
    import kvcert.method.models

    def refuse(*_, **__):
        raise AssertionError("the model was loaded before the inputs were checked")

    monkeypatch.setattr(kvcert.method.models, "load_model", refuse)


@pytest.fixture
def no_tokenizer(monkeypatch, no_model_load):
    """Loading the tokenizer (the start of the prompt building) fails the test too."""
    import kvcert.generation.manifest

    def refuse(*_, **__):
        raise AssertionError("the prompts were built before the inputs were checked")

    monkeypatch.setattr(kvcert.generation.manifest, "load_tokenizer", refuse)


def run(*overrides: str, quiet: bool = True):
    from kvcert.commands.oneoff import run_command

    return run_command(Namespace(overrides=list(overrides), configs=None, prereg=None, quiet=quiet))


def refused(message: str, *overrides: str) -> str:
    """The one-line error of ``kvcert run overrides``."""
    with pytest.raises(ValueError, match=message) as info:
        run(*overrides)
    assert "\n" not in str(info.value)
    return str(info.value)


def longbench_file(folder, rows) -> str:
    folder.mkdir(exist_ok=True)
    (folder / "hotpotqa.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return f"task.source={folder}"


# --- 1. limit: bounded by what the task offers; the build shows progress ---------------------------------
@pytest.mark.parametrize("limit", ["1000000000000", "20000"])
def test_a_generated_tasks_limit_is_bounded_before_anything_is_built(no_tokenizer, limit):
    refused(rf"^limit={limit}: task needle offers at most 10000 records \(the registered maximum of a generated "
            r"task, kvcert\.tasks\.MAX_GENERATED; another data_seed= gives other records\); give limit=10000 or less$",
            "task=needle", f"limit={limit}")


def test_a_data_file_tasks_limit_is_bounded_by_its_rows(tmp_path, no_tokenizer):
    source = longbench_file(tmp_path / "lb", [dict(ROW, _id=f"a{i}") for i in range(2)])
    refused(r"^limit=3: task longbench_hotpotqa offers at most 2 records \(the rows of .*hotpotqa\.jsonl\); "
            r"give limit=2 or less$", "task=longbench_hotpotqa", source, "limit=3", "length=1024")
    # the default limit (10) is bounded by the rows instead: a small file runs whole
    from pathlib import Path

    from kvcert.generation.jobs import config_file
    from kvcert.commands.oneoff import check_limit

    cfg = dict(config_file(Path(__file__).resolve().parents[1] / "configs", "task", "longbench_hotpotqa"),
               source=str(tmp_path / "lb"))
    assert check_limit(10, cfg, given=False) == 2 and check_limit(2, cfg) == 2


def test_a_locomo_files_limit_is_bounded_by_its_items(tmp_path):
    from kvcert.tasks import task_for_config

    sample = {"sample_id": "c1", "qa": [{"question": "Q?", "answer": "a", "category": 1}] * 3,
              "conversation": {"speaker_a": "A", "speaker_b": "B", "session_1_date_time": "today",
                               "session_1": [{"speaker": "A", "text": "hi"}]}}
    (tmp_path / "locomo10.json").write_text(json.dumps([sample, sample]))
    most, where = task_for_config({"name": "locomo", "kind": "locomo", "source": str(tmp_path / "locomo10.json")}) \
        .capacity({"name": "locomo", "kind": "locomo", "source": str(tmp_path / "locomo10.json")})
    assert most == 6 and where.startswith("the QA items of ")


def test_the_prompts_build_shows_progress_before_the_model_loads(no_model_load, tmp_path, capsys):
    with pytest.raises(AssertionError, match="model was loaded"):
        run("task=needle", "limit=3", "length=256", f"out={tmp_path / 'run'}", quiet=False)
    err = capsys.readouterr().err
    assert "build needle prompts: 3/3 records (100 %)" in err and "loading the model" in err


def test_a_build_one_by_one_gives_the_generators_records():
    from kvcert.generation.manifest import load_tokenizer
    from kvcert.tasks import SYNTHETIC_TASKS, TASKS, generate

    tokenizer = load_tokenizer({"path": "embedded"})
    seen = []
    for name in SYNTHETIC_TASKS:
        built = TASKS[name].build({"name": name}, tokenizer, 320, 2, 7,
                                  progress=lambda total: Bar(total, seen))
        assert [r.to_dict() for r in built] == [r.to_dict() for r in generate(name, tokenizer, 2, 320, 7)]
    assert seen == [(2, 2, True)] * len(SYNTHETIC_TASKS)


class Bar:
    """A progress display that records (total, updates, closed) into ``seen`` when closed."""

    def __init__(self, total: int, seen: list):
        self.total, self.n, self.seen = total, 0, seen

    def update(self, n: int = 1) -> None:
        self.n += n

    def close(self) -> None:
        self.seen.append((self.total, self.n, True))


# --- 2. out= ------------------------------------------------------------------------------------------------
def test_out_at_a_regular_file_or_under_one_is_one_line(tmp_path, no_tokenizer):
    afile = tmp_path / "afile"
    afile.write_text("x")
    for out in (afile, afile / "sub"):
        refused(rf"^out={out}: {afile} is a file, not a folder; give out= a folder you can write",
                "task=needle", "limit=1", f"out={out}")


def test_out_at_a_read_only_place_is_one_line(tmp_path, no_tokenizer, monkeypatch):
    import tempfile

    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    if os.geteuid() == 0:  # root writes anywhere: a read-only place as a read-only file system answers
        def read_only(*_, **__):
            raise PermissionError(30, "Read-only file system")

        monkeypatch.setattr(tempfile, "mkdtemp", read_only)
    try:
        refused(rf"^out={locked / 'run'}: cannot write in {locked} \(.+\); give out= a folder you can write",
                "task=needle", "limit=1", f"out={locked / 'run'}")
    finally:
        locked.chmod(0o755)
    assert list(locked.iterdir()) == []  # the probe leaves nothing behind


def test_a_writable_out_is_left_as_it_was(tmp_path):
    from kvcert.commands.oneoff import check_out

    check_out(tmp_path / "new" / "run")
    assert list(tmp_path.iterdir()) == []


def test_the_cli_prints_one_line_and_exits_2(tmp_path, capsys, no_tokenizer):
    from kvcert.cli import main

    (tmp_path / "afile").write_text("x")
    assert main(["run", "task=needle", "limit=1", f"out={tmp_path / 'afile'}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"kvcert run: error: out={tmp_path / 'afile'}: ")


# --- 3. a LongBench row longer than length: the real key ----------------------------------------------------
def test_a_long_row_names_the_length_key(tmp_path, no_model_load):
    row = dict(ROW, input="Who wrote the book?", context=" ".join(["The grass is green."] * 200))
    source = longbench_file(tmp_path / "lb", [row])
    message = refused(r"hotpotqa row 0 \(_id='a1'\): middle truncation to 256 tokens \(the prompt length\) lost the "
                      r"question part: .*; give length=\d+ or more.*\(kvcert run's length=; in a grid, its lengths\)",
                      "task=longbench_hotpotqa", source, "limit=1", "length=256")
    assert "max_length" not in message


def test_a_question_longer_than_half_the_length_names_the_length_it_needs():
    from kvcert.tasks.longbench import truncation_error

    class Words:
        def __call__(self, text, add_special_tokens=True):
            return {"input_ids": text.split()}

    error = truncation_error("row 0", Words(), "w " * 100, 128, 5000)
    assert "its question part has 100 tokens, more than the last 64 tokens" in str(error)
    assert "give length=208 or more (kvcert run's length=; in a grid, its lengths)" in str(error)


# --- 4. a data file that is not UTF-8 -----------------------------------------------------------------------
def test_a_data_file_starting_with_0xff_names_the_file_and_the_byte(tmp_path, no_model_load):
    (tmp_path / "lb").mkdir()
    (tmp_path / "lb" / "hotpotqa.jsonl").write_bytes(b"\xff\xfe" + json.dumps(ROW).encode("utf-16-le") + b"\n")
    refused(r"hotpotqa\.jsonl: byte 0xff at byte offset 0 \(line 1\) is not UTF-8, and the file starts with a "
            r"UTF-16 little-endian byte-order mark; the file must be UTF-8 text",
            "task=longbench_hotpotqa", f"task.source={tmp_path / 'lb'}", "limit=1", "length=1024")


def test_a_bad_byte_further_on_is_placed_exactly(tmp_path):
    from kvcert.tasks.locomo import load_locomo
    from kvcert.tasks.records import RecordError, read_jsonl, utf8_lines

    data = tmp_path / "data.jsonl"
    data.write_bytes(b'{"a": 1}\n{"b": "caf\xe9"}\n')
    with pytest.raises(RecordError, match=r"data\.jsonl: byte 0xe9 at byte offset 19 \(line 2\) is not UTF-8; "):
        list(utf8_lines(data))
    data.write_bytes(b'\n\n{"id": "caf\xe9"}\n')  # the records' reader: blank lines, then the byte
    with pytest.raises(RecordError, match=r"byte 0xe9 at byte offset 13 \(line 3\)"):
        read_jsonl(data)
    locomo = tmp_path / "locomo10.json"
    locomo.write_bytes(b'[\n {"x": "\xff"}]')
    with pytest.raises(RecordError, match=r"locomo10\.json: byte 0xff at byte offset 10 \(line 2\) is not UTF-8"):
        load_locomo(locomo)


# --- 5. a budget below the certainty set ---------------------------------------------------------------------
def test_a_budget_below_the_certainty_set_is_refused_with_the_smallest_meaningful_one(no_tokenizer):
    refused(r"^budget=1e-09 \(snapkv-poisson\): at length=512 it keeps 1 token, fewer than the retention design's "
            r"certainty set \(36 tokens: 4 sinks \+ 32 recent\), which is always kept, so the budget means nothing; "
            r"the smallest meaningful budget at length=512 is 0\.0704: give budget=0\.0704 or more "
            r"\(compression_ratio=0\.9296 or less\), or a longer length$",
            "task=needle", "method=snapkv-poisson", "budget=1e-9", "limit=1")
    # kvpress's floor and its own window: compression_ratio=0.99 keeps 5 of 512, its set is 64 tokens
    refused(r"^budget=0\.01 \(snapkv-kvpress\): at length=512 it keeps 5 tokens, .*\(64 tokens: 0 sinks \+ 64 recent\)"
            r".*give budget=0\.125 or more", "task=needle", "method=snapkv-kvpress", "compression_ratio=0.99",
            "limit=1")


def test_the_smallest_meaningful_budget_passes_and_the_pipelines_grids_are_untouched():
    from kvcert.generation.spec import GenerationSpec
    from kvcert.commands.oneoff import check_budget, compose_run

    [(_, [_, low])], _ = compose_run(["method=snapkv-poisson", "budget=0.01"], configs_dir(), prereg_dir())
    check_budget(GenerationSpec.from_dict(dict(low, budget=0.0704)), 512)  # at the smallest meaningful budget
    check_budget(GenerationSpec.from_dict(low), 4096)  # 0.01 of 4,096 keeps 41 >= 36
    with pytest.raises(ValueError, match=r"holds the whole prompt.*give length=37 or more"):
        check_budget(GenerationSpec.from_dict(dict(low, budget=0.5)), 30)
    # the press keeps accepting what the registered grids give it (multiturn at 10 %, kvpress settings)
    from kvcert.method.press import EvictionPress

    assert EvictionPress(budget=1e-9).budget == 1e-9


# --- 6. δ is the pre-registration's ---------------------------------------------------------------------------
@pytest.mark.parametrize("override", ["certificate.delta=1", "+certificate.delta=0.05", "certificate={delta:0.2}"])
def test_delta_is_fixed_by_the_preregistration(override):
    from kvcert.commands.oneoff import compose_run

    with pytest.raises(ValueError, match=rf"^{re.escape(override)}: "
                       r"δ is fixed by the pre-registration \(analysis_plan\.delta = 0\.1 in .*claims\.yaml, frozen "
                       r"with it\).*an amendment: edit analysis_plan\.delta there and run "
                       r"`kvcert prereg freeze --reason '\.\.\.'`") as info:
        compose_run(["task=needle", "method=snapkv-poisson", "budget=0.25", override], configs_dir(), prereg_dir())
    assert "\n" not in str(info.value)


# --- each message names the user's setting and the value to give ----------------------------------------
def test_a_length_too_short_for_a_rulers_prompt_names_the_task_and_the_length_to_give(no_model_load):
    """`task=ruler:vt length=512` on the embedded tokenizer: not "target_tokens=482" (an internal name) but the task,
    the length given and the length that fits; and that length does fit."""
    message = refused(r"^task ruler_vt: length=512 is too small: the prompt without filler already has \d+ tokens, "
                      r"and 30 more tokens of the length are kept for the answer; give length=(\d+) or more "
                      r"\(kvcert run's length=; in a grid, its lengths\)$", "task=ruler:vt", "length=512", "limit=1")
    assert "target_tokens" not in message
    needed = int(re.search(r"give length=(\d+)", message).group(1))
    from kvcert.generation.jobs import config_file
    from kvcert.generation.manifest import build_records, load_tokenizer

    configs = configs_dir()
    [record] = build_records(config_file(configs, "task", "ruler_vt"),
                             load_tokenizer(config_file(configs, "model", "embedded")), needed, 1, 0)
    assert record.length <= needed


def test_a_long_row_beyond_the_models_positions_is_not_given_an_impossible_length(tmp_path, no_model_load):
    """A LongBench row longer than the embedded model's 4096 positions: the advice is not `length=15059 or more`
    (beyond the model) but what can be done, with the setting: leave the row out, or another model."""
    long_row = dict(ROW, _id="a2", input="Who wrote the book?", context=" ".join(["The grass is green."] * 3000))
    source = longbench_file(tmp_path / "lb", [ROW, long_row])
    message = refused(r"hotpotqa row 1 \(_id='a2'\): middle truncation to 1024 tokens .*; it needs length=(\d+) or "
                      r"more, and with its 32-token answer that exceeds the model's 4096 positions "
                      r"\(max_position_embeddings of embedded\): leave the row out \(limit=1: the rows before it\), "
                      r"or use a model whose tokenizer decodes its tokens back to the text",
                      "task=longbench_hotpotqa", source, "limit=2", "length=1024")
    assert int(re.search(r"needs length=(\d+)", message).group(1)) > 4096


def test_an_unknown_option_is_named_not_the_value_after_it(capsys):
    """`kvcert bench design --lengths 0`: argparse named the value '0' as an invalid choice of the positional
    argument it fell to; the unknown option is named instead, with the command's options."""
    from kvcert.cli import main

    with pytest.raises(SystemExit) as info:
        main(["bench", "design", "--lengths", "0"])
    assert info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("kvcert bench design: error: unrecognized arguments: --lengths; the options of kvcert "
                          "bench design: ") and "'0'" not in err
    with pytest.raises(SystemExit):
        main(["run", "--lst"])
    assert "unrecognized arguments: --lst (did you mean --list?)" in capsys.readouterr().err


# --- round 6 (issue 62, item 8): a condition without a method, a mistyped kvpress press ----------------------
@pytest.mark.parametrize("condition", ["streaming", "aware", "streaming,aware"])
def test_a_condition_without_a_method_is_refused(no_tokenizer, condition):
    """`kvcert run condition=streaming` with no method ran the full cache alone, rc 0: the condition was dropped."""
    refused(rf"^condition={condition}: no method to compress with, and the full cache alone has no condition "
            r"\(it would run unchanged\); give a method with it \(e\.g\. method=snapkv-poisson budget=0\.25\), or "
            "leave condition out$", "task=needle", "limit=1", f"condition={condition}")


def test_a_condition_with_a_method_in_the_sweep_is_kept():
    from kvcert.commands.oneoff import compose_run

    per_task, _ = compose_run(["task=needle", "method=full,snapkv-poisson", "condition=streaming", "budget=0.25"],
                              configs_dir(), prereg_dir())
    assert [c["condition"] for c in per_task[0][1]] == ["full", "streaming"]


@pytest.fixture
def fake_kvpress(monkeypatch):
    """A stand-in kvpress module with one ScorerPress (kvpress is an optional package)."""
    import dataclasses
    import sys
    import types

    module = types.ModuleType("kvpress")

    @dataclasses.dataclass
    class ScorerPress:
        compression_ratio: float = 0.0

    @dataclasses.dataclass
    class SnapKVPress(ScorerPress):
        window_size: int = 64

    module.ScorerPress, module.SnapKVPress = ScorerPress, SnapKVPress
    monkeypatch.setitem(sys.modules, "kvpress", module)
    return module


def test_a_mistyped_kvpress_press_is_refused_before_the_model_loads(no_tokenizer, fake_kvpress):
    """`method=kvpress:SnapKVPres-poisson` was caught only once the model had loaded (where the scorer is built),
    though `run --help` says every input is checked first."""
    refused(r"^scorer: 'kvpress:SnapKVPres' names no kvpress ScorerPress; choose one of kvpress:ScorerPress, "
            r"kvpress:SnapKVPress$", "task=needle", "limit=1", "method=kvpress:SnapKVPres-poisson", "budget=0.25")


def test_kvpress_missing_is_refused_before_the_model_loads(no_tokenizer, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "kvpress", None)  # import kvpress raises ImportError
    refused(r"^scorer: kvpress scorers need the kvpress package", "task=needle", "limit=1",
            "method=kvpress:SnapKVPress-poisson", "budget=0.25")
