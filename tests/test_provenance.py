"""The code digest covers all the code that makes records (:func:`kvcert.provenance.record_modules`): a module that a
generation or replay job imports is inside it, and a change to any module inside it moves the digest."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from kvcert import provenance
from kvcert.provenance import RECORD_EXCLUDED, code_digest, record_modules

ROOT = Path(__file__).resolve().parents[1]


def _outside_closure(loaded: list[str]) -> list[str]:
    inside = record_modules()
    return sorted(m for m in loaded if m.partition(".")[0] in ("kvcert", "kvcert_kernels") and m not in inside
                  and not any(m == s or m.startswith(s + ".") for s in RECORD_EXCLUDED))


def test_the_closure_holds_what_records_are_made_by():
    """The modules named by the issue that first found the gap (the budget's kept count, the checks, the method
    and design parameters, the digest) and the four packages of the earlier list are inside; the stages that make
    no record are not."""
    inside = record_modules()
    for name in ("kvcert.checks", "kvcert.budget", "kvcert.config.design_params", "kvcert.config.methods",
                 "kvcert.config.digest", "kvcert.generation.engine", "kvcert.method.press", "kvcert.tasks.needle",
                 "kvcert_kernels.certified_decode"):
        assert name in inside, name
    assert not [m for m in inside if m.startswith(RECORD_EXCLUDED)]
    assert all(path.is_file() for path in inside.values())


def test_a_change_anywhere_in_the_closure_moves_the_digest(monkeypatch, tmp_path):
    """Each module's bytes enter the digest: the same modules with one file's bytes changed (here
    ``kvcert.checks``, whose ``resolve_budget`` once changed every Poisson record's kept count under an unchanged
    digest) give another digest."""
    before = code_digest()
    modules = dict(record_modules())
    changed = tmp_path / "checks.py"
    changed.write_bytes(modules["kvcert.checks"].read_bytes() + b"\n# changed\n")
    modules["kvcert.checks"] = changed
    monkeypatch.setattr(provenance, "record_modules", lambda: modules)
    provenance.code_digest.cache_clear()
    try:
        assert provenance.code_digest() != before
    finally:
        monkeypatch.undo()
        provenance.code_digest.cache_clear()
    assert code_digest() == before


def test_an_import_seen_in_source_is_followed(tmp_path):
    """Imports inside functions, relative ones, ``from . import module`` and ``importlib.import_module`` of a
    literal name are all read."""
    pkg = tmp_path / "kvcert"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "a.py").write_text(textwrap.dedent("""
        import importlib
        def f():
            from ..b import x
            from . import c
            importlib.import_module("kvcert.d")
    """))
    names = provenance._imported_names(pkg / "sub" / "a.py", "kvcert.sub.a")
    assert {"kvcert.b", "kvcert.sub.c", "kvcert.d", "kvcert.sub", "kvcert"} <= names


_JOBS = textwrap.dedent("""
    import json, sys
    from pathlib import Path
    from kvcert.cli import main
    out = Path(sys.argv[1])
    for argv in (["run", "model=embedded", "task=needle", "limit=1", "method=snapkv-poisson", "budget=0.5",
                  f"out={out / 'run'}", "threads=1"],
                 ["replay", "--model", "embedded", "--records", str(out / "manifest.jsonl"), "--max-examples", "1",
                  "--max-layers", "1", "--threads", "1", "--out", str(out / "replay.parquet"),
                  "--impossibility-out", str(out / "imp.json")]):
        try:
            rc = main(argv)
        except SystemExit as exc:
            rc = exc.code
        assert not rc, (argv, rc)
    print(json.dumps(sorted(sys.modules)))
""")


@pytest.mark.pipeline
def test_nothing_a_generation_or_replay_job_imports_is_outside_the_digest(tmp_path):
    """A one-off run (its shard goes through the generation path of ``kvcert shard``) and a replay job on the embedded
    model, in a fresh process: every kvcert module loaded by the end, less the analysis, commands and bench stages,
    is in :func:`record_modules`."""
    from kvcert.tasks import generate, write_jsonl
    from kvcert.training.tokenizer import build_tokenizer

    write_jsonl(generate("needle", build_tokenizer(), n_examples=1, target_tokens=400, seed=11, answer_tokens=0),
                tmp_path / "manifest.jsonl")
    done = subprocess.run([sys.executable, "-c", _JOBS, str(tmp_path)], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "replay.parquet").exists() and list((tmp_path / "run").glob("generations/*.jsonl"))
    loaded = json.loads(done.stdout.strip().splitlines()[-1])
    assert "kvcert.generation.replay" in loaded and "kvcert.generation.forked" in loaded
    outside = _outside_closure(loaded)
    assert outside == [], ", ".join(outside)
