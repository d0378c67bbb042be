"""Faults the pipeline survives without losing or duplicating a record (local runs).

Each test runs the reduced smoke experiment of :mod:`smoke_pipeline` through the real
Snakefile and compares its records with one uninterrupted reference run (timing fields
aside):

* SIGKILL in the middle of a generation shard (plus a half-written last line): the rerun
  resumes from the last complete record, keeps the records already written byte for
  byte, recomputes the cut one, and ends with the reference's records;
* a second Snakemake run on the same results folder is refused by Snakemake's lock, with
  the message saying what to do, while the first completes;
* determinism: a rerun from scratch with the same seeds and config gives the same
  manifest (byte for byte) and the same records;
* a corrupt finished shard (a line that does not parse, a line cut short) stops scoring
  with its path and line number; following the message (rename to ``.partial``, rerun)
  resumes the shard and the recomputed records equal the reference's.

The Slurm side (submission, retried and failing jobs) is tests/test_slurm.py.
"""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

import psutil
import pytest

from smoke_pipeline import (
    GENERATE_LOG, MANIFEST, MODEL, REPO, SHARD_SIZE, SHARDS, VERIFIED, assert_same_records, complete_lines,
    reference, seed_workdir, shard_records, snakemake, start_snakemake, wait_for_lines,
)

pytestmark = [pytest.mark.pipeline, pytest.mark.slow]

LOCK_MESSAGE = "Directory cannot be locked"


@pytest.fixture(scope="module")
def ref(tmp_path_factory):
    return reference(tmp_path_factory)


def _descendants_alive(workdir: Path) -> list[str]:
    """Processes still running in ``workdir`` (a killed run must leave none)."""
    alive = []
    for proc in psutil.process_iter(["pid", "cmdline", "cwd"]):
        try:
            if proc.info["cwd"] == str(workdir) and proc.pid != os.getpid():
                alive.append(" ".join(proc.info["cmdline"] or [])[:120])
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return alive


def test_sigkill_mid_shard_resumes_without_loss_or_duplicate(ref, tmp_path):
    prereg, refdir = ref
    run = seed_workdir(tmp_path / "run", refdir, MODEL, VERIFIED, MANIFEST)
    shard = run / SHARDS[0]
    partial = shard.with_name(shard.name + ".partial")

    proc = start_snakemake(run, prereg, "--cores", "1", "--", SHARDS[0], log=tmp_path / "killed.log")
    try:
        wait_for_lines(partial, 3, proc)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:  # the run had ended already: wait_for_lines says how
            pass
        proc.wait(timeout=30)
    deadline = time.monotonic() + 10
    while _descendants_alive(run) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _descendants_alive(run), "SIGKILL left processes of the run behind"
    assert not shard.exists()
    kept = complete_lines(partial)
    assert 3 <= len(kept) < SHARD_SIZE, f"killed too late: {len(kept)} records written"
    # A kill in the middle of a write leaves a line cut short: simulate that tail too.
    next_line = complete_lines(refdir / SHARDS[0])[len(kept)]
    with open(partial, "ab") as fh:
        fh.write(next_line[: len(next_line) // 2])

    # The killed Snakemake left its lock: the rerun is refused and says how to go on.
    refused = snakemake(run, prereg, "--cores", "1", "--", SHARDS[0])
    assert refused.returncode != 0
    assert LOCK_MESSAGE in refused.stdout + refused.stderr and "--unlock" in refused.stdout + refused.stderr

    unlock = snakemake(run, prereg, "--unlock")
    assert unlock.returncode == 0, unlock.stderr[-2000:]
    rerun = snakemake(run, prereg, "--cores", "1", "--", SHARDS[0])
    assert rerun.returncode == 0, rerun.stdout[-3000:] + rerun.stderr[-3000:]

    assert shard.exists() and not partial.exists()
    final = complete_lines(shard)
    assert final[: len(kept)] == kept, "records written before the kill were recomputed or changed"
    assert len(final) == SHARD_SIZE
    log = (run / GENERATE_LOG.format(name="shard000")).read_text()
    assert "dropped a truncated last line; it is recomputed" in log
    assert_same_records(run, refdir, shards=SHARDS[:1])


@pytest.fixture(scope="module")
def second_run(ref, tmp_path_factory):
    """A second run from scratch (model copied); while it holds its lock a third one is started."""
    prereg, refdir = ref
    base = tmp_path_factory.mktemp("second-run")
    run = seed_workdir(base / "run", refdir, MODEL)
    first = start_snakemake(run, prereg, "--cores", "2", "--", *SHARDS, log=base / "first.log")
    try:
        locks = run / ".snakemake" / "locks"
        deadline = time.monotonic() + 900  # a hang guard (the lock comes within seconds), not a speed bound
        while not (locks.is_dir() and any(locks.iterdir())):
            assert first.poll() is None, (base / "first.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "the first run never took its lock"
            time.sleep(0.1)
        concurrent = snakemake(run, prereg, "--cores", "2", "--", *SHARDS)
        assert first.wait(timeout=900) == 0, (base / "first.log").read_text()[-3000:]
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
            first.wait()
    return run, concurrent


def test_second_run_on_same_results_is_refused(second_run):
    _, concurrent = second_run
    out = concurrent.stdout + concurrent.stderr
    assert concurrent.returncode != 0
    assert LOCK_MESSAGE in out
    assert "no other Snakemake process is trying to create the same files" in out
    assert "--unlock" in out  # what to do once the other run is known to be gone


def test_rerun_with_same_seeds_gives_identical_records(ref, second_run):
    _, refdir = ref
    run, _ = second_run
    assert (run / MANIFEST).read_bytes() == (refdir / MANIFEST).read_bytes()
    assert_same_records(run, refdir)
    for shard in SHARDS:  # only the timing fields may differ, byte for byte otherwise
        assert shard_records(run / shard) == shard_records(refdir / shard)


def _score(run: Path, prereg: Path):
    return snakemake(run, prereg, "--cores", "1", "--", "results/smoke/scores.parquet")


def test_corrupt_shard_is_named_at_scoring_and_resumed(ref, tmp_path):
    prereg, refdir = ref
    run = seed_workdir(tmp_path / "run", refdir, MODEL, VERIFIED, MANIFEST, *SHARDS)
    bad, cut = run / SHARDS[0], run / SHARDS[1]
    lines = complete_lines(bad)
    bad.write_bytes(b"".join(lines[:2]) + b'{"example_id": "needle-s1000\n' + b"".join(lines[3:]))
    out = _score(run, prereg)
    assert out.returncode != 0
    assert f"{SHARDS[0]}:3: line does not parse" in out.stdout + out.stderr
    assert "Error in rule score" in out.stdout + out.stderr

    bad.write_bytes(b"".join(lines))  # repaired; now cut the other shard in its last line
    whole = complete_lines(cut)
    cut.write_bytes(b"".join(whole[:-1]) + whole[-1][:40])
    out = _score(run, prereg)
    assert out.returncode != 0
    message = f"{SHARDS[1]}:{SHARD_SIZE}: truncated line (no newline at end); rename the file to shard001.jsonl.partial"
    assert message in out.stdout + out.stderr

    # Do what the message says: the shard resumes, the cut record is recomputed, scoring passes.
    cut.rename(cut.with_name(cut.name + ".partial"))
    out = _score(run, prereg)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    final = complete_lines(cut)
    assert final[: SHARD_SIZE - 1] == whole[: SHARD_SIZE - 1]  # kept as written
    assert_same_records(run, refdir)
    assert (run / "results/smoke/scores.parquet").exists()


def _checkout_copy(folder: Path) -> Path:
    """The pipeline's files (Snakefile, configs, analysis, profiles) in ``folder``."""
    import shutil

    shutil.copytree(REPO, folder, ignore=shutil.ignore_patterns(
        ".venv*", ".git", "results", ".snakemake", "build", "*.egg-info", "__pycache__", "tests", "src"))
    return folder


def _run_in(checkout: Path, prereg: Path, *args: str):
    import subprocess
    import sys

    from smoke_pipeline import CONFIG, run_env

    return subprocess.run([sys.executable, "-m", "snakemake", "--snakefile", str(checkout / "Snakefile"),
                           "--config", f"prereg={prereg}", "results=results", *CONFIG, *args],
                          cwd=checkout, capture_output=True, text=True, timeout=900, env=run_env())


@pytest.fixture(scope="module")
def finished_checkout(tmp_path_factory):
    """(pre-registration, checkout copy): a copy of the pipeline's files whose generation side has run once, in
    place (both tests below start from it: one copies it elsewhere, the other edits it)."""
    from smoke_pipeline import make_prereg

    base = tmp_path_factory.mktemp("checkout")
    prereg = make_prereg(base / "preregistration")
    checkout = _checkout_copy(base / "first" / "kvcert")
    done = _run_in(checkout, prereg, "--cores", "2", "--", *SHARDS)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return prereg, checkout


def test_a_moved_checkout_with_its_finished_run_reruns_nothing(finished_checkout, tmp_path):
    """Job params do not depend on where the checkout lives: a finished run, copied with
    its checkout to another folder (times kept), has nothing left to do there."""
    import shutil

    prereg, first = finished_checkout
    moved = tmp_path / "elsewhere" / "deeper" / "kvcert"
    shutil.copytree(first, moved, copy_function=shutil.copy2, symlinks=True)
    again = _run_in(moved, prereg, "--cores", "2", "--", *SHARDS)
    assert again.returncode == 0, again.stderr[-2000:]
    assert "Nothing to be done" in again.stdout + again.stderr, again.stdout[-2000:] + again.stderr[-2000:]


def test_reruns_follow_content_not_file_times(finished_checkout):
    """A refused pre-registration edit, once restored, reruns nothing; a config rewritten
    with the same content reruns nothing; a config whose content changes reruns exactly
    the jobs that read it. (It edits the finished checkout: it comes after the test that copies it.)"""
    prereg, checkout = finished_checkout

    def nothing_to_do():
        out = _run_in(checkout, prereg, "-n", "--", *SHARDS)
        return out.returncode == 0 and "Nothing to be done" in out.stdout + out.stderr

    claims = prereg / "claims.yaml"
    original = claims.read_bytes()
    claims.write_bytes(original.replace(b"threshold: 0.85", b"threshold: 0.80", 1))
    refused = _run_in(checkout, prereg, "--cores", "2", "--", *SHARDS)
    assert refused.returncode != 0 and "claims.yaml was edited after the freeze" in refused.stdout + refused.stderr
    claims.write_bytes(original)  # restored (a new file time, the frozen content)
    assert nothing_to_do()

    model = checkout / "configs" / "model" / "embedded.yaml"
    model.write_text("# the same settings, commented and reordered\n" + "\n".join(
        reversed([line for line in model.read_text().splitlines() if line and not line.startswith("#")])) + "\n")
    assert nothing_to_do()

    task = checkout / "configs" / "task" / "needle.yaml"
    task.write_text(task.read_text().replace("max_new_tokens: 16", "max_new_tokens: 12"))
    changed = _run_in(checkout, prereg, "-n", "--", *SHARDS)
    text = changed.stdout + changed.stderr
    stats = dict(re.findall(r"^(\w+)\s+(\d+)$", text.split("Job stats:")[1], re.M))
    assert stats == {"generate": "2", "manifest": "1", "total": "3"}, text[-2000:]


def test_sigkill_at_random_points_ends_like_an_uninterrupted_run(ref, tmp_path):
    """The whole generation side (verify, manifest, both shards) killed with SIGKILL at five
    seeded random moments, each time unlocked and resumed: the final records equal the
    reference run's (timing fields aside), every shard is sealed, and none holds a duplicate."""
    import random

    from kvcert.generation.shards import check_seal, read_records, record_key

    prereg, refdir = ref
    run = seed_workdir(tmp_path / "run", refdir, MODEL)
    rng = random.Random(20261201)
    for point in range(5):
        proc = start_snakemake(run, prereg, "--cores", "2", "--", *SHARDS, log=tmp_path / f"kill{point}.log")
        time.sleep(rng.uniform(1.0, 8.0))
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(timeout=60)
        deadline = time.monotonic() + 10
        while _descendants_alive(run) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert snakemake(run, prereg, "--unlock").returncode == 0
    done = snakemake(run, prereg, "--cores", "2", "--", *SHARDS)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert_same_records(run, refdir)
    for shard in SHARDS:
        records = read_records(run / shard)
        assert len({record_key(r) for r in records}) == len(records) == SHARD_SIZE
        check_seal(run / shard, len(records), SHARD_SIZE)


def test_an_edited_manifest_in_a_copied_results_folder_is_refused(ref, tmp_path):
    """One example's reference answers edited in a copied results folder (no Snakemake metadata, so
    its checksum cannot rerun anything): the run is refused before any job, naming the manifest and the remedy,
    and nothing is scored against the edited answers."""
    import json

    prereg, reference_run = ref
    workdir = seed_workdir(tmp_path / "copy", reference_run, MODEL, MANIFEST, VERIFIED, *SHARDS)
    manifest = workdir / MANIFEST
    lines = manifest.read_text().splitlines()
    first = json.loads(lines[0])
    first["answers"] = ["0000000"]
    manifest.write_text("\n".join([json.dumps(first)] + lines[1:]) + "\n")
    out = snakemake(workdir, prereg, "--cores", "2")
    text = out.stdout + out.stderr
    assert out.returncode != 0, text[-3000:]
    assert f"{MANIFEST}: its content differs from what `kvcert manifest` built" in text, text[-3000:]
    assert "delete" in text and "rerun to rebuild it from its registered seed" in text
    assert not (workdir / "results" / "smoke" / "scores.parquet").exists()
    assert not (workdir / "results" / "smoke" / "claims.json").exists()


def test_a_resealed_or_copied_manifest_stops_the_run_before_any_shard_is_deleted(ref, tmp_path):
    """In a copy of the finished run with its Snakemake metadata (Snakemake knows every
    file): (2) one example's answers changed to ["1111111"] and the seal's SHA-256 and count recomputed, which the
    seal cannot show and Snakemake would answer by regenerating both shards from the edit; (3) a manifest whose seal
    says another cell's length (needle/2048's, resealed over needle/512). Each stops the run in the pre-flight,
    before any job: the finished shards are neither deleted nor scored against the edit."""
    import hashlib
    import json
    import shutil

    prereg, reference_run = ref
    workdir = tmp_path / "run"
    shutil.copytree(reference_run, workdir, symlinks=True)  # .snakemake too: its metadata knows the outputs
    manifest, seal = workdir / MANIFEST, workdir / (MANIFEST + ".seal.json")
    shards = {s: (workdir / s).read_bytes() for s in SHARDS}
    original, sealed = manifest.read_bytes(), seal.read_bytes()

    def reseal(content: bytes, **built_from):
        data = json.loads(sealed)
        manifest.write_bytes(content)
        data["sha256"], data["records"] = hashlib.sha256(content).hexdigest(), content.count(b"\n")
        data["built_from"].update(built_from)
        seal.write_text(json.dumps(data))

    lines = original.decode().splitlines()
    edited = json.loads(lines[2])
    edited["answers"] = ["1111111"]
    reseal(("\n".join(lines[:2] + [json.dumps(edited, ensure_ascii=False)] + lines[3:]) + "\n").encode())
    out = snakemake(workdir, prereg, "--cores", "2")
    text = out.stdout + out.stderr
    assert out.returncode != 0, text[-3000:]
    assert f"{MANIFEST}: not what `kvcert manifest` builds" in text and "differs in answers" in text, text[-3000:]
    assert {s: (workdir / s).read_bytes() for s in SHARDS} == shards  # nothing deleted, nothing regenerated

    reseal(original, length=2048)  # another cell's manifest and seal (its bytes aside)
    out = snakemake(workdir, prereg, "--cores", "2")
    text = out.stdout + out.stderr
    assert out.returncode != 0 and "built from other inputs than the plan's (length 2048 != 512)" in text, text[-3000:]
    assert {s: (workdir / s).read_bytes() for s in SHARDS} == shards
    assert not (workdir / "results" / "smoke" / "scores.parquet").exists()


def test_a_results_folder_whose_path_holds_a_space_runs_every_rule(ref, tmp_path):
    """`--config results=…/p S/résults ü`: every shell argument is quoted, so the analysis rules run
    there (score, claims, report), the report rule reruns there, and no file lands outside the results folder."""
    import shutil
    import subprocess
    import sys

    from smoke_pipeline import CONFIG, run_env

    prereg, reference_run = ref
    base = tmp_path / "p S"
    results = base / "résults ü"
    shutil.copytree(reference_run / "results", results, copy_function=shutil.copy2)
    workdir = base / "run ü"
    workdir.mkdir()

    def run(*args):
        argv = [sys.executable, "-m", "snakemake", "--snakefile", str(REPO / "Snakefile"), "--config",
                f"prereg={prereg}", f"results={results}", *CONFIG, "--cores", "2", *args]
        out = subprocess.run(argv, cwd=workdir, capture_output=True, text=True, timeout=900, env=run_env())
        assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
        return out

    run()
    report = results / "smoke" / "report.md"
    assert report.is_file() and (results / "smoke" / "claims.json").is_file()
    before = report.stat().st_mtime_ns
    again = run("--forcerun", "report")
    assert "report" in again.stdout + again.stderr and report.stat().st_mtime_ns > before
    assert sorted(p.name for p in base.iterdir()) == ["run ü", "résults ü"]  # no stray file beside them
    assert sorted(p.name for p in workdir.iterdir() if not p.name.startswith(".")) == []
