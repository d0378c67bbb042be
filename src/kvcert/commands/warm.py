"""Warm starts for the jobs of a local Snakemake run: one process imports torch, transformers and kvcert
once, and each job runs in a fork of it.

A job's own work is often the smaller part of its time: a short ``kvcert shard`` spends most of it importing torch
and transformers before its generation (measured with ``python -m cProfile``: CHANGELOG.md, warm starts). With
``KVCERT_WARM`` set to the run's owner — the Snakemake process's pid, which the Snakefile's ``onstart`` sets
for the jobs of a local run — the ``kvcert`` commands of :data:`COMMANDS` ask a warm server to run them:

* the first job to find no server starts one (:func:`serve`, through ``python -c``, with the job's ``sys.path``,
  environment and working folder): it listens at once on an abstract Unix socket, imports :data:`PRELOAD`,
  then forks a child per request;
* the child takes the job's standard streams (passed over the socket), working folder, environment and
  arguments, runs :data:`ENTRY_POINT` (:func:`kvcert.cli.main`) as the job's own process would, and sends back its exit status;
* the job's process waits for that status. A signal it receives (SIGTERM, SIGINT, SIGHUP) is passed on to the
  child; when the job's process dies (SIGKILL) the child kills itself. Every process stays in the run's
  process group, so killing a job, or the whole run, kills its work as before;
* a server serves one run and one environment: the socket's name is a hash of the owner, the working folder,
  the Python executable, ``sys.path`` and the environment (Snakemake sets ``OMP_NUM_THREADS`` and the like per
  rule, so a rule with another thread count gets a server of its own). The server exits when the owner does;
* whatever goes wrong before the child starts (no server can start, no abstract sockets off Linux, a
  thread already running in the server, where a fork would be unsafe) and the job runs in its own process,
  exactly as without ``KVCERT_WARM``. ``KVCERT_WARM=0`` in Snakemake's environment turns warm starts off.

The fork runs the same code on the same inputs, so records are the same either way; what differs is
that the modules were imported before the job's process existed (a warning printed while importing goes to
the server, whose output is discarded).
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import struct
import sys

#: the environment variable naming the run's owner (a pid); unset or "0": every job starts cold
ENV = "KVCERT_WARM"
#: the subcommands worth a warm start (they import torch and transformers)
COMMANDS = frozenset({"manifest", "shard", "replay", "train-model", "generate"})
#: imported once by the server, before it forks (best effort: a module that fails to import is skipped). Not
#: pandas: pyarrow starts jemalloc's background thread as it loads, and a process that holds a thread is not
#: forked; a job that needs pandas imports it in its fork.
PRELOAD = (
    "torch", "transformers", "transformers.modeling_utils", "transformers.models.llama.modeling_llama",
    "transformers.models.qwen2.modeling_qwen2", "transformers.models.mistral.modeling_mistral",
    "kvcert.cli", "kvcert.method.models", "kvcert.method.integration", "kvcert.generation.runner", "kvcert.commands.cli",
    "kvcert.training.cli", "scipy.stats",
)
#: transformers' lazy attributes the model loading reads (the first access scans its model packages)
PRELOAD_ATTRIBUTES = (("transformers", "AutoModelForCausalLM"), ("transformers", "AutoTokenizer"),
                      ("transformers", "AutoConfig"))
#: what a job runs, by name: the ``kvcert`` console command's entry point (pyproject.toml's
#: ``[project.scripts]``), resolved in the fork so that this module imports nothing of the commands it serves
ENTRY_POINT = "kvcert.cli:main"
_VOLATILE = frozenset({"_"})  # bash's last-command variable
_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
_HEADER = struct.Struct("!I")


def entry_point():
    """The function :data:`ENTRY_POINT` names."""
    import importlib

    module, _, name = ENTRY_POINT.partition(":")
    return getattr(importlib.import_module(module), name)


def own_jobs_warm(local: bool) -> None:
    """Make the jobs this process starts from now on (a local Snakemake run's) ask for warm starts, with this
    process as their owner; not for a cluster run (``local`` False) or where ``KVCERT_WARM=0``."""
    if local and os.environ.get(ENV) != "0":
        os.environ[ENV] = str(os.getpid())


def _interpreter_flags() -> list[str]:
    """This interpreter's command-line flags (-X, -W, -O, ...), for the server to start with the same ones."""
    import subprocess

    return subprocess._args_from_interpreter_flags()


def server_name(env: dict[str, str], cwd: str, path: list[str]) -> str:
    """The abstract socket name (without its leading NUL) of the server for this environment."""
    key = [sys.executable, _interpreter_flags(), cwd, list(path),
           sorted((k, v) for k, v in env.items() if k not in _VOLATILE)]
    return "kvcert-warm-" + hashlib.sha256(json.dumps(key).encode()).hexdigest()[:32]


def _send(sock: socket.socket, obj: dict, fds: tuple[int, ...] = ()) -> None:
    data = json.dumps(obj).encode()
    header = _HEADER.pack(len(data))
    if fds:
        socket.send_fds(sock, [header], list(fds))
    else:
        sock.sendall(header)
    sock.sendall(data)


def _recv_exact(sock: socket.socket, n: int) -> bytes | None:
    chunks, got = [], 0
    while got < n:
        chunk = sock.recv(n - got)
        if not chunk:
            return None
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def _recv(sock: socket.socket) -> dict | None:
    """One message, or None at the end of the stream."""
    header = _recv_exact(sock, _HEADER.size)
    if header is None:
        return None
    data = _recv_exact(sock, _HEADER.unpack(header)[0])
    return None if data is None else json.loads(data)


def _connect(name: str, wait: float = 0.0, server=None) -> socket.socket | None:
    """A connection to the server of ``name``, trying for ``wait`` seconds, or until ``server`` (the process just
    started to be it) has ended: then once more, since it may have ended for another that got the name first."""
    import time

    deadline = time.monotonic() + wait
    while True:
        last = time.monotonic() >= deadline or (server is not None and server.poll() is not None)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect("\0" + name)
            return sock
        except OSError:
            sock.close()
            if last:
                return None
            time.sleep(0.02)


def _same_user(sock: socket.socket) -> bool:
    """Whether the process at the other end of ``sock`` runs as this user (SO_PEERCRED: pid, uid, gid): an abstract
    socket has no file permissions, so each side checks the other's."""
    try:
        _, uid, _ = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
    except (OSError, AttributeError):
        return False
    return uid == os.getuid()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _spawn(name: str, owner: int):
    """Start the server of ``name`` (it exits at once if another one got the name first); its Popen."""
    import subprocess

    code = ("import json, sys; sys.path[:] = json.loads(sys.argv[1]); from kvcert.commands.warm import serve; "
            "serve(sys.argv[2], int(sys.argv[3]))")
    argv = [sys.executable, *_interpreter_flags(), "-c", code, json.dumps(sys.path), name, str(owner)]
    return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            close_fds=True)


def run_warm(argv: list[str]) -> int | None:
    """The exit status of ``kvcert argv`` run in a fork of the warm server, or None: run it in this process."""
    owner = os.environ.get(ENV, "")
    if not owner.isdigit() or owner == "0" or not argv or argv[0] not in COMMANDS:
        return None
    if os.environ.get("OMP_NUM_THREADS") != "1" or os.environ.get("OPENBLAS_NUM_THREADS", "1") != "1":
        return None  # numpy's OpenBLAS would start its threads as the server imports it: no fork then
    if not sys.platform.startswith("linux") or not hasattr(socket, "send_fds") or not _alive(int(owner)):
        return None
    try:
        for fd in (0, 1, 2):
            os.fstat(fd)
    except OSError:  # a closed standard stream cannot be passed on
        return None
    env, cwd = dict(os.environ), os.getcwd()
    name = server_name(env, cwd, sys.path)
    sock = _connect(name)
    if sock is None:
        sock = _connect(name, wait=10.0, server=_spawn(name, int(owner)))
        if sock is None:
            return None
    with sock:
        if not _same_user(sock):
            return None
        ignored = [int(s) for s in _SIGNALS if signal.getsignal(s) == signal.SIG_IGN]  # e.g. SIGHUP under nohup
        try:
            _send(sock, {"argv": argv, "argv0": sys.argv[0], "cwd": cwd, "env": env, "ignored": ignored},
                  fds=(0, 1, 2))
            started = _recv(sock)
        except OSError:
            return None
        if not started or "pid" not in started:  # refused, or the server went away: the job has not started
            if started and "cold" in started:
                print(f"kvcert {argv[0]}: no warm start ({started['cold']}); running in this process", file=sys.stderr)
            return None
        child = int(started["pid"])
        forwarded: list[int] = []

        def forward(signum, frame):
            """Pass a signal on to the child, unless it got it already: a terminal's SIGINT or SIGHUP goes to the
            whole process group, which the child shares with this process."""
            try:
                if signum == signal.SIGTERM or os.getpgid(child) != os.getpgrp():
                    forwarded.append(signum)
                    sock.send(bytes([signum]))
            except OSError:
                pass

        for s in _SIGNALS:
            if int(s) not in ignored:
                signal.signal(s, forward)
        try:
            ended = _recv(sock)
        except OSError:
            ended = None
        if ended is not None:
            return int(ended["status"])
        if forwarded:  # the child died of the signal passed on: so does this process, as a cold job would
            signal.signal(forwarded[-1], signal.SIG_DFL)
            os.kill(os.getpid(), forwarded[-1])
        print(f"kvcert {argv[0]}: the warm job (pid {child}) ended without an exit status", file=sys.stderr)
        return 1


# --- the server --------------------------------------------------------------------------------------------
def _threads() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return 0  # unknown: refuse (a fork is safe only in a single-threaded process)


def _preload() -> None:
    import importlib

    for module in PRELOAD:
        try:
            importlib.import_module(module)
        except Exception:  # noqa: BLE001 — best effort; the job imports what it needs itself
            pass
    for module, attribute in PRELOAD_ATTRIBUTES:
        try:
            getattr(importlib.import_module(module), attribute)
        except Exception:  # noqa: BLE001
            pass


def serve(name: str, owner: int) -> None:
    """Listen on ``name``, import :data:`PRELOAD`, then fork a child per request until ``owner`` exits."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind("\0" + name)
    except OSError:  # another server of this run and environment holds the name
        return
    listener.listen(64)
    _preload()
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children are reaped by the kernel
    listener.settimeout(0.5)
    while _alive(owner):
        try:
            conn, _ = listener.accept()
        except (socket.timeout, InterruptedError):
            continue
        try:
            _serve_one(conn, listener)
        except Exception:  # noqa: BLE001 — a bad request costs its job a cold start, never the server
            pass
        finally:
            conn.close()


def _serve_one(conn: socket.socket, listener: socket.socket) -> None:
    if not _same_user(conn):  # only this user's jobs run here
        return
    conn.settimeout(30.0)
    header, fds, _, _ = socket.recv_fds(conn, _HEADER.size, 3)
    try:
        if len(header) != _HEADER.size or len(fds) != 3:
            return
        data = _recv_exact(conn, _HEADER.unpack(header)[0])
        if data is None:
            return
        request = json.loads(data)
        if _threads() != 1:
            _send(conn, {"cold": "the warm server holds a thread"})
            return
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            status = 70
            try:
                listener.close()
                conn.settimeout(None)
                status = _child(conn, fds, request)
            except BaseException:  # noqa: BLE001 — before the job started: on the job's stderr if it is there yet
                import traceback

                traceback.print_exc()
            finally:
                os._exit(status)
    finally:
        for fd in fds:
            os.close(fd)


def _stream(fd: int, old, write: bool, unbuffered: bool):
    """A text stream on ``fd`` as Python makes one at start (stderr line-buffered; PYTHONUNBUFFERED: written
    through)."""
    import io

    raw = io.FileIO(fd, "w" if write else "r", closefd=False)  # a standard stream on the job's descriptor
    if not (write and unbuffered):  # PYTHONUNBUFFERED: no buffer between the text layer and the descriptor
        raw = io.BufferedWriter(raw) if write else io.BufferedReader(raw)
    line = write and (os.isatty(fd) or fd == 2)
    return io.TextIOWrapper(raw, encoding=old.encoding, errors=old.errors, line_buffering=line,
                            write_through=write and unbuffered)


def _child(conn: socket.socket, fds: list[int], request: dict) -> int:
    """The job, in the fork: the client's streams, folder, environment and arguments; returns its exit status."""
    import threading
    import traceback

    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for s in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, signal.SIG_DFL)
    for s in request.get("ignored", ()):  # what the job's process ignores (nohup), its fork ignores too
        signal.signal(s, signal.SIG_IGN)
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
    for fd in fds:
        if fd > 2:
            os.close(fd)
    unbuffered = bool(request["env"].get("PYTHONUNBUFFERED"))
    sys.stdin = sys.__stdin__ = _stream(0, sys.stdin, False, unbuffered)
    sys.stdout = sys.__stdout__ = _stream(1, sys.stdout, True, unbuffered)
    sys.stderr = sys.__stderr__ = _stream(2, sys.stderr, True, unbuffered)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    argv = list(request["argv"])
    sys.argv = [request.get("argv0") or "kvcert", *argv]
    _send(conn, {"pid": os.getpid()})
    done = threading.Event()

    def watch():  # the client's signals, and its death
        while True:
            try:
                data = conn.recv(64)
            except OSError:
                data = b""
            if not data:
                if not done.is_set():
                    os.kill(os.getpid(), signal.SIGKILL)
                return
            for signum in data:
                os.kill(os.getpid(), signum)

    threading.Thread(target=watch, name="kvcert-warm-watch", daemon=True).start()
    try:
        status = entry_point()(argv)
    except SystemExit as exc:
        code = exc.code
        if code is None or isinstance(code, int):
            status = code or 0
        else:
            print(code, file=sys.stderr)
            status = 1
    except KeyboardInterrupt:
        traceback.print_exc()
        status = 130
    except BaseException:  # noqa: BLE001 — what Python prints for an uncaught exception, and its status
        traceback.print_exc()
        status = 1
    shutdown = getattr(threading, "_shutdown", None)  # as the interpreter's exit does: non-daemon threads, pools
    if shutdown is not None:
        shutdown()
    else:
        for thread in threading.enumerate():
            if thread is not threading.main_thread() and not thread.daemon:
                thread.join()
    try:
        import atexit

        atexit._run_exitfuncs()
    except Exception:  # noqa: BLE001
        pass
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    done.set()
    try:
        _send(conn, {"status": int(status or 0)})
    except OSError:
        pass
    return int(status or 0) & 0xFF
