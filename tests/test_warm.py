"""Warm starts (kvcert.commands.warm): a local run's jobs in forks of one process that imported torch once.

The unit tests check when a job asks for a warm start at all. The pipeline tests run real ``kvcert`` jobs
through a real server: the job's streams, folder and exit status are its own; the job's process imports
no torch (the fork did the work); killing the job's process kills its fork; the server ends with its owner.
Every pipeline test of a local Snakemake run also runs warm (the Snakefile's ``onstart``), and compares its
records with the reference run's.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from kvcert.commands import warm

REPO = Path(__file__).resolve().parents[1]


def test_the_server_name_follows_the_environment_folder_and_path():
    env = {"OMP_NUM_THREADS": "1", "KVCERT_WARM": "123"}
    name = warm.server_name(env, "/a", ["/p"])
    assert name == warm.server_name(dict(env, _="/usr/bin/kvcert"), "/a", ["/p"])  # bash's $_ aside
    others = {warm.server_name(dict(env, OMP_NUM_THREADS="2"), "/a", ["/p"]), warm.server_name(env, "/b", ["/p"]),
              warm.server_name(env, "/a", ["/q"]), warm.server_name(dict(env, KVCERT_WARM="124"), "/a", ["/p"])}
    assert name not in others and len(others) == 4
    assert len(name) < 100  # an abstract socket name fits sockaddr_un


def test_a_local_run_owns_its_jobs_unless_turned_off(monkeypatch):
    monkeypatch.delenv("KVCERT_WARM", raising=False)
    warm.own_jobs_warm(local=False)  # a cluster run: its jobs run elsewhere
    assert "KVCERT_WARM" not in os.environ
    warm.own_jobs_warm(local=True)
    assert os.environ["KVCERT_WARM"] == str(os.getpid())
    monkeypatch.setenv("KVCERT_WARM", "0")
    warm.own_jobs_warm(local=True)
    assert os.environ["KVCERT_WARM"] == "0"


@pytest.mark.parametrize("env, argv", [
    ({}, ["shard"]),  # no owner: not a job of a local run
    ({"KVCERT_WARM": "0", "OMP_NUM_THREADS": "1"}, ["shard"]),  # turned off
    ({"KVCERT_WARM": "{pid}", "OMP_NUM_THREADS": "1"}, ["claims"]),  # a command without torch
    ({"KVCERT_WARM": "{pid}", "OMP_NUM_THREADS": "2"}, ["shard"]),  # OpenBLAS would start threads in the server
    ({"KVCERT_WARM": "{pid}"}, ["shard"]),  # likewise, with no thread count set
    ({"KVCERT_WARM": "999999999", "OMP_NUM_THREADS": "1"}, ["shard"]),  # the owner is gone
])
def test_a_job_runs_in_its_own_process_unless_a_warm_start_applies(monkeypatch, env, argv):
    for key in ("KVCERT_WARM", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value.format(pid=os.getpid()))
    monkeypatch.setattr(warm, "_spawn", lambda *a: pytest.fail("no server may be started"))
    assert warm.run_warm(argv) is None


# --- real jobs through a real server --------------------------------------------------------------------------
def _servers(owner: int) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline", "environ"]):
        try:
            cmdline = " ".join(proc.info["cmdline"] or [])
            if "kvcert.commands.warm import serve" in cmdline and cmdline.endswith(f" {owner}"):
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


@pytest.fixture(scope="module")
def owner():
    """A stand-in for the run's Snakemake process: its pid is the owner; the server must end when it does."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(900)"])
    yield proc
    proc.kill()
    proc.wait()


def _env(owner_pid: int, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env.update(KVCERT_WARM=str(owner_pid), OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    env.update(extra)
    return env


def _shard_args(tmp_path_factory, out: Path) -> list[str]:
    """``kvcert shard`` of the reduced smoke run's first shard (tests/smoke_pipeline.py), into ``out``."""
    from smoke_pipeline import MANIFEST, MODEL, VERIFIED, reference

    prereg, ref = reference(tmp_path_factory)
    return ["shard", "--experiment", "smoke", "--prereg", str(prereg), "--configs", str(REPO / "configs"),
            "--model", "embedded", "--cell", "main", "--task", "needle", "--length", "512", "--index", "000",
            "--manifest", str(ref / MANIFEST), "--verified", str(ref / VERIFIED), "--model-path", str(ref / MODEL),
            "--threads", "1", "--out", str(out)]


def _kvcert(args: list[str], cwd: Path, env: dict):
    """``kvcert ARGS`` as a job runs it (argv from the command line: the warm path), importtime on stderr."""
    return subprocess.run([sys.executable, "-X", "importtime", "-m", "kvcert.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)


def _imported_torch(stderr: str) -> bool:
    return any(re.search(r"\|\s+torch$", line.rstrip()) for line in stderr.splitlines())


def _messages(text: str) -> list[str]:
    """Output lines without import times and durations."""
    return [re.sub(r"\d+ s\b", "N s", line) for line in text.splitlines() if not line.startswith("import time:")]



@pytest.mark.pipeline
@pytest.mark.slow
def test_a_warm_job_writes_what_a_cold_one_does_with_its_own_streams_and_status(owner, tmp_path_factory, tmp_path):
    from smoke_pipeline import shard_records

    env = _env(owner.pid)
    cold = _kvcert(_shard_args(tmp_path_factory, Path("cold.jsonl")), tmp_path, dict(env, KVCERT_WARM="0"))
    assert cold.returncode == 0, cold.stderr[-2000:]
    assert _imported_torch(cold.stderr)  # a cold job imports torch itself

    job = _kvcert(_shard_args(tmp_path_factory, Path("warm.jsonl")), tmp_path, env)  # relative: the job's folder
    assert job.returncode == 0, job.stderr[-2000:]
    assert not _imported_torch(job.stderr), "the job's process imported torch: it did not run warm"
    assert shard_records(tmp_path / "warm.jsonl") == shard_records(tmp_path / "cold.jsonl")  # timing aside
    assert _messages(job.stdout + job.stderr) == [m.replace("cold", "warm") for m in _messages(cold.stdout + cold.stderr)]
    assert len(_servers(owner.pid)) == 1

    failed = _kvcert(_shard_args(tmp_path_factory, tmp_path / "x.jsonl") + ["--index", "x"], tmp_path, env)
    assert failed.returncode == 2 and "error" in failed.stderr  # argparse's message and status
    assert len(_servers(owner.pid)) == 1  # one server serves the run's jobs


@pytest.mark.pipeline
@pytest.mark.slow
def test_killing_a_warm_job_kills_its_fork(owner, tmp_path_factory, tmp_path):
    """SIGKILL to the job's process (as Snakemake, or a killed run, does): its fork stops writing at once, and
    the shard is left for the resume; the server lives on for the run's next jobs."""
    from smoke_pipeline import complete_lines

    shard = tmp_path / "shard000.jsonl"
    partial = shard.with_name(shard.name + ".partial")
    job = subprocess.Popen([sys.executable, "-m", "kvcert.cli", *_shard_args(tmp_path_factory, shard)], cwd=tmp_path,
                           env=_env(owner.pid), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300  # a hang guard
    while len(complete_lines(partial)) < 5:
        assert job.poll() is None and time.monotonic() < deadline, "the job ended before its first example"
        time.sleep(0.05)
    (server,) = [s for s in _servers(owner.pid) if s.children()]  # this folder's server (one per folder)
    forks = server.children()
    job.send_signal(signal.SIGKILL)
    job.wait()
    gone, alive = psutil.wait_procs(forks, timeout=30)
    assert not alive, "the fork outlived its job"
    size = partial.stat().st_size
    time.sleep(1.0)
    assert partial.stat().st_size == size and not shard.exists()  # nothing written after the kill
    assert len(complete_lines(partial)) < 40  # cut short: the rerun resumes it (tests/test_faults.py)
    assert server.is_running()


@pytest.mark.pipeline
def test_the_server_ends_with_its_owner(tmp_path):
    owner = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        name = warm.server_name(_env(owner.pid), str(tmp_path), sys.path)
        server = warm._spawn(name, owner.pid)
        sock = warm._connect(name, wait=60, server=server)
        assert sock is not None and warm._same_user(sock), "the server did not start"
        sock.close()
        assert server.poll() is None
    finally:
        owner.kill()
        owner.wait()
    server.wait(timeout=60)  # a hang guard: the server looks for its owner twice a second, after its imports


def test_the_entry_point_is_resolved_by_name_to_the_console_commands():
    """The server runs what pyproject.toml's console script names, found by name (warm imports no command)."""
    import tomllib
    from pathlib import Path

    from kvcert.cli import main

    project = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())
    assert project["project"]["scripts"]["kvcert"] == warm.ENTRY_POINT
    assert warm.entry_point() is main


# --- one job's environment reaches no later job -------------------------------------------------------------
def _job(name: str, env: dict, argv: list[str], cwd: Path, out: Path) -> tuple[int, str]:
    """One job sent to the server ``name`` as a client does (:func:`kvcert.commands.warm.run_warm`), with ``env`` as
    its environment; (its exit status, its stdout)."""
    sock = warm._connect(name, wait=5)
    assert sock is not None
    with sock, open(os.devnull) as stdin, open(out, "w") as stdout, open(out.with_suffix(".err"), "w") as stderr:
        warm._send(sock, {"argv": argv, "argv0": "kvcert", "cwd": str(cwd), "env": env, "ignored": []},
                   fds=(stdin.fileno(), stdout.fileno(), stderr.fileno()))
        started = warm._recv(sock)
        assert started and "pid" in started, started
        ended = warm._recv(sock)
    return int(ended["status"]), out.read_text()


@pytest.mark.pipeline
def test_an_environment_set_for_one_warm_job_reaches_no_later_job(tmp_path, monkeypatch):
    """A ``KVCERT_*`` setting given to one job, in a fork of a server: the next job forked from the same server
    sees the server's environment, not the setting (each fork takes its own job's environment, and what a fork
    sets never returns to the server). Jobs of another environment go to a server of their own anyway (the
    server's name is a hash of the environment); here both are sent to one server on purpose, the worst case."""
    owner = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    base = _env(owner.pid)
    base.pop("KVCERT_MODEL_DIR", None)
    base["XDG_CACHE_HOME"] = str(tmp_path / "xdg")  # `kvcert model path` prints $KVCERT_MODEL_DIR/NAME, else this
    setting = dict(base, KVCERT_MODEL_DIR=str(tmp_path / "set-for-one-job"))
    assert warm.server_name(setting, str(tmp_path), sys.path) != warm.server_name(base, str(tmp_path), sys.path)
    name = warm.server_name(base, str(tmp_path), sys.path)
    for key in set(os.environ) - set(base):  # the server starts in the environment of the job that starts it
        monkeypatch.delenv(key)
    for key, value in base.items():
        monkeypatch.setenv(key, value)
    try:
        server = warm._spawn(name, owner.pid)
        sock = warm._connect(name, wait=60, server=server)
        assert sock is not None, "the server did not start"
        sock.close()
        argv = ["model", "path", "smollm2-135m-instruct"]
        status, first = _job(name, setting, argv, tmp_path, tmp_path / "first.out")
        assert status == 0 and first.strip() == str(tmp_path / "set-for-one-job" / "smollm2-135m-instruct")
        status, later = _job(name, base, argv, tmp_path, tmp_path / "later.out")
        assert status == 0 and later.strip() == str(tmp_path / "xdg" / "kvcert" / "models" / "smollm2-135m-instruct")
        environ = psutil.Process(server.pid).environ()
        assert "KVCERT_MODEL_DIR" not in environ and not any(v == str(tmp_path / "set-for-one-job")
                                                            for v in environ.values())
    finally:
        owner.kill()
        owner.wait()
    server.wait(timeout=60)
