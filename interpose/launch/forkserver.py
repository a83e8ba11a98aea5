"""The fork server of `phantora trace --nproc-per-node N -- python script.py`, run under the
command's own interpreter: it does once what every rank's start does first (the bootstrap's
preparation of virtual GPUs, `import torch`, then `torch._dynamo`, the first thing the
interposition imports and the bulk of its cost, which also brings in FSDP, DTensor and Inductor),
then forks one process per rank. The launcher side is phantora/simulator/forkserver.py.

A forked rank is the process `python script.py` would be, up to the moment the script first
imports torch: it gets its own environment, argv, sys.path[0] and signal handlers, runs the
script as __main__, and exits as Python exits (SystemExit code, 1 after a traceback, SIGINT
after an uncaught KeyboardInterrupt; threads joined, atexit handlers, finalizers of its
garbage, open files closed), less the teardown of the server's objects, which would cost most
of a second. The interposition is installed when the script first imports torch, as the
bootstrap's import hook does: code before that line runs outside the simulation, as usual. If
by then the environment differs from the one torch was imported with (a script that sets
CUDA_VISIBLE_DEVICES or TORCH_LOGS before `import torch`), the rank re-executes itself as a
fresh `python script.py` with its original environment, since torch read those variables at
import; what the script did before that line then runs twice.

Left shared with the server: the string hash seed (as under one PYTHONHASHSEED) and objects
made at import, frozen for the garbage collector so that their pages stay shared.

Protocol, lines over two pipes. Launcher -> server: one JSON request {"argv0", "argv",
"path0", "envs": each rank's own variables, optionally "options" (["-u"]) and "orphans": "kill"
(the ranks die with the launcher's end of the pipe)}, then {"signal": [pid, signum]} lines. Server -> launcher: "fallback <why>"
(torch could not be prepared here: the launcher starts the ranks with Popen, which shows the
real error) or "started <pid>" per rank, then "exit <pid> <returncode>" as each ends
(returncode as Popen's: -N when signal N killed it). The server exits when every rank has.

warm() is the same server kept for many runs (PHANTORA_FORK_SERVER_DIR, phantora/simulator/
forkserver.py): it prepares once, then listens on a Unix socket; each run sends its directory,
environment and five descriptors (the two pipes above, then its stdin, stdout and stderr), and
the server forks a process that takes them and serves that run as serve() does.
"""

from __future__ import annotations

import atexit
import builtins
import fcntl
import gc
import graphlib
import io
import json
import os
import runpy
import select
import signal
import socket
import sys
import time
import traceback
import types
from dataclasses import dataclass
from typing import Any

from interpose.launch.handoff import FRESH_ENV  # a fresh restart is not handed back to its server
from interpose.launch.warm import STDERR_ENV, STDOUT_ENV, server_files


@dataclass
class RankStart:
    argv0: str  # the command's interpreter as written (argv[0] of a fresh start)
    argv: list[str]  # [script, *args] or ["-m", module, *args]
    options: list[str]  # the interpreter's options before them: [] or ["-u"] (torchrun's workers)
    env: dict[str, str]  # the rank's environment, as Popen would have given it
    import_env: dict[str, str]  # the environment torch was imported with, plus what preparing added


def serve(command_fd: int, status_fd: int, prepared: dict[str, str] | str | None = None) -> RankStart:
    """Prepare (unless a warm server did: what preparing added, or why it failed), fork the
    ranks, report their exits; returns only in a rank process."""
    status = os.fdopen(status_fd, "w", buffering=1)
    request = json.loads(_read_line(command_fd))
    shared_env = dict(os.environ)
    sys.path[0] = request["path0"]  # what the script's own interpreter would have: torch imports see it
    sys.argv = list(request["argv"])
    try:
        added = _prepare() if prepared is None else prepared
        if isinstance(added, str):
            raise RuntimeError(added)
    except BaseException as e:  # noqa: BLE001 - any failure: the ranks start fresh and show it
        status.write("fallback " + f"{type(e).__name__}: {e}".replace("\n", " ") + "\n")
        os._exit(0)
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGCHLD)}
    # Ctrl-C reaches the whole process group: the ranks handle it; this server outlives them
    # to report their exits.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    sys.stdout.flush()
    sys.stderr.flush()
    gc.freeze()  # as CPython's docs advise before fork without exec: keeps these pages shared
    running: set[int] = set()
    for own in request["envs"]:
        pid = os.fork()
        if pid == 0:
            signal.set_wakeup_fd(-1)
            for s, h in handlers.items():
                signal.signal(s, h)
            for fd in (wake_r, wake_w, command_fd):
                os.close(fd)
            status.close()
            env = dict(shared_env, **own)
            open_rank_streams(env)
            import_env = dict(env, **{k: v for k, v in added.items() if k not in env})
            return RankStart(request["argv0"], request["argv"], request.get("options", []), env, import_env)
        running.add(pid)
        status.write(f"started {pid}\n")
    _report_until_done(running, command_fd, wake_r, status, request.get("orphans") == "kill")
    os._exit(0)


def warm(folder: str, key: str, idle_s: float) -> RankStart:
    """Prepare once, then fork one run's fork server per request until idle_s seconds pass
    with no run being served; returns only in a rank process."""
    sock, pid_file = server_files(folder, key)
    lock = open(f"{sock}.lock", "w")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os._exit(0)  # another server has this key
    if sock.exists():  # its last server's, which is gone (it held the lock)
        sock.unlink()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(str(sock))
    listener.listen(64)
    pid_file.write_text(f"{os.getpid()}\n")
    prepared: dict[str, str] | str
    try:
        prepared = _prepare()
    except BaseException as e:  # noqa: BLE001 - each run is told, and starts its ranks fresh
        prepared = f"{type(e).__name__}: {e}"
    gc.freeze()
    listener.settimeout(1.0)
    runs: set[int] = set()  # the processes serving runs: while one lives, the server is not idle
    idle_since = time.monotonic()
    while True:
        for pid in list(runs):
            if os.waitpid(pid, os.WNOHANG)[0] == pid:
                runs.discard(pid)
        if runs:
            idle_since = time.monotonic()
        elif time.monotonic() - idle_since > idle_s:
            sock.unlink()
            pid_file.unlink()
            os._exit(0)
        try:
            conn, _ = listener.accept()
        except TimeoutError:
            continue
        with conn:
            conn.settimeout(10)
            try:
                message, fds, _, _ = socket.recv_fds(conn, 1 << 20, 5)
            except OSError:
                continue
        if len(fds) != 5:
            for fd in fds:
                os.close(fd)
            continue
        request = json.loads(message)
        print(f"{time.strftime('%H:%M:%S')} serving {request.get('command')} in {request['cwd']}", file=sys.stderr,
              flush=True)  # the server's log: which processes it forked
        pid = os.fork()
        if pid == 0:
            listener.close()
            lock.close()
            command_fd, status_fd, *stdio = fds
            for target, fd in enumerate(stdio):
                os.dup2(fd, target)
                os.close(fd)
            if os.isatty(1):  # as a fresh interpreter buffers a terminal's output
                sys.stdout.reconfigure(line_buffering=True)
            os.chdir(request["cwd"])
            os.environ.clear()
            os.environ.update(request["env"])
            return serve(command_fd, status_fd, prepared)
        runs.add(pid)
        for fd in fds:
            os.close(fd)


def _prepare() -> dict[str, str]:
    """What a rank's start does before the interposition patches anything; returns the variables
    it set (the bootstrap sets some for the rank)."""
    from interpose.launch import hook

    before = dict(os.environ)
    hooks = [f for f in sys.meta_path if isinstance(f, hook._TorchImportHook)]
    if not hooks or "torch" in sys.modules:
        raise RuntimeError("the bootstrap's import hook is not installed ahead of torch")
    sys.meta_path.remove(hooks[0])
    hook.before_torch_import()
    import torch  # noqa: F401
    import torch._dynamo  # noqa: F401  (after_torch_import's first line, before any patch)

    return {k: v for k, v in os.environ.items() if before.get(k) != v}


def _report_until_done(running: set[int], command_fd: int, wake_r: int, status: Any, kill_orphans: bool) -> None:
    """Forward the launcher's signals, report exits. With kill_orphans the launcher stands in for
    the rank (interpose/launch/handoff.py): if it goes (SIGKILL), the rank it stood for goes too."""
    pending, commands_open = b"", True
    while running:
        ready, _, _ = select.select([wake_r] + ([command_fd] if commands_open else []), [], [])
        if wake_r in ready:
            os.read(wake_r, 4096)
        if command_fd in ready:
            data = os.read(command_fd, 65536)
            commands_open = bool(data)
            if not commands_open and kill_orphans:
                for pid in running:
                    os.kill(pid, signal.SIGKILL)
            *lines, pending = (pending + data).split(b"\n")
            for line in lines:
                pid, signum = json.loads(line)["signal"]
                if pid in running:  # not yet reaped: the pid is still this rank's
                    os.kill(pid, signum)
        while running:
            pid, wait_status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            running.discard(pid)
            try:
                status.write(f"exit {pid} {os.waitstatus_to_exitcode(wait_status)}\n")
            except BrokenPipeError:  # the launcher is gone; still reap the rest
                pass


def _read_line(fd: int) -> bytes:
    data = b""
    while not data.endswith(b"\n"):
        chunk = os.read(fd, 65536)
        if not chunk:
            raise EOFError("the launcher closed the fork server's pipe")
        data += chunk
    return data


def open_rank_streams(env: dict[str, str]) -> None:
    """This rank's stdout and stderr where torchrun's --redirects, --tee or --local-ranks-filter
    put them (phantora/simulator/worker_logs.py): a file, or os.devnull, opened as torch's agent
    opens it for its worker ("w"); the variables leave `env` before the program sees it."""
    for variable, fd in ((STDOUT_ENV, 1), (STDERR_ENV, 2)):
        path = env.pop(variable, "")
        if path:
            opened = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
            os.dup2(opened, fd)
            os.close(opened)


def run(start: RankStart) -> None:
    """Run the rank's script as `python script.py` / `python -m module` runs it."""
    os.environ.clear()
    os.environ.update(start.import_env)
    # The server froze its objects for the collector (pages stay shared). A rank ends through
    # _exit_without_server_teardown; where it leaves through Python's own finalization instead
    # (Ctrl-C, a failed restart) they must be collectable again, as in a fresh process: else
    # extensions that count their objects (Triton's nanobind) print every one as leaked.
    atexit.register(gc.unfreeze)
    sys.orig_argv = [start.argv0, *start.options, *start.argv]
    if "-u" in start.options:  # as `python -u` opens them: unbuffered, each write straight to the file
        for name in ("stdout", "stderr"):
            stream = getattr(sys, name)
            raw = io.TextIOWrapper(io.FileIO(stream.fileno(), "w", closefd=False), encoding=stream.encoding,
                                   errors=stream.errors, write_through=True)
            setattr(sys, name, raw)
            setattr(sys, f"__{name}__", raw)
    if "numpy.random" in sys.modules:  # seeded at import: a fresh process has its own seed
        sys.modules["numpy.random"].seed()
    _interpose_at_first_torch_import(start)
    module = start.argv[1] if start.argv[0] == "-m" else None
    try:
        if module is not None:
            sys.argv = ["-m", *start.argv[2:]]
            sys.modules["__main__"] = types.ModuleType("__main__")  # its own, not the server's `-c` one
            runpy._run_module_as_main(module, alter_argv=True)  # type: ignore[attr-defined]  (what `python -m` runs)
        else:
            sys.argv = list(start.argv)
            runpy.run_path(os.path.abspath(start.argv[0]), run_name="__main__")
    except SystemExit as e:
        status = _system_exit_status(e)
    except KeyboardInterrupt:
        raise  # Python's own exit: it re-raises SIGINT so that the parent sees the signal
    except BaseException as e:  # noqa: BLE001 - printed as Python prints an uncaught exception
        # Without this function's frame, and for a script without runpy's: as `python script.py`
        # and `python -m module` print it.
        tb = e.__traceback__.tb_next if e.__traceback__ is not None else None
        if module is None:
            while tb is not None and tb.tb_frame.f_code.co_filename != os.path.abspath(start.argv[0]):
                tb = tb.tb_next
        tb = tb or e.__traceback__
        sys.excepthook(type(e), e.with_traceback(tb), tb)  # some hooks format e.__traceback__
        status = 1
    else:
        status = 0
    _exit_without_server_teardown(status)


def _close_open_files() -> None:
    """Close the files the rank opened and left open, as their finalizers would in Python's teardown
    (a gzip file writes its trailer), each wrapper before the file it writes through, never stdio
    or the files under it. The server's frozen objects are not listed."""
    keep: set[int] = set()
    for stream in (sys.stdin, sys.stdout, sys.stderr, sys.__stdin__, sys.__stdout__, sys.__stderr__):
        while stream is not None and id(stream) not in keep:
            keep.add(id(stream))
            stream = getattr(stream, "buffer", getattr(stream, "raw", None))
    files = {id(o): o for o in gc.get_objects() if isinstance(o, io.IOBase) and id(o) not in keep}
    wrapped_by: dict[int, set[int]] = {i: set() for i in files}
    for i, f in files.items():  # what f writes through: its referents, or its attributes' values
        referents = gc.get_referents(f)
        referents += [v for r in referents if isinstance(r, dict) for v in r.values()]
        for inner in referents:
            if id(inner) in files and inner is not f:
                wrapped_by[id(inner)].add(i)
    try:
        order = list(graphlib.TopologicalSorter(wrapped_by).static_order())
    except graphlib.CycleError:
        order = list(files)
    for i in order:
        try:
            files[i].close()
        except Exception:  # noqa: BLE001 - as a finalizer's: what cannot close is lost
            pass


def _system_exit_status(e: SystemExit) -> int:
    """The exit status Python gives an uncaught SystemExit (its _Py_HandleSystemExit): None is 0, an
    int is itself, anything else is printed to stderr and is 1."""
    if e.code is None:
        return 0
    if isinstance(e.code, int):
        return e.code
    try:
        print(e.code, file=sys.stderr)
    except Exception:  # noqa: BLE001 - as Python's: the status stays 1 whatever printing does
        pass
    return 1


def _exit_without_server_teardown(status: int) -> None:
    """End the rank as Python's finalization does, less its teardown of the objects the server made
    before the fork (torch's, frozen and shared; freeing them costs 0.6-0.9 s of CPU per rank, as
    much as a fresh `python -c "import torch._dynamo"` spends exiting): non-daemon threads joined,
    atexit handlers run, __main__ and the rank's other garbage collected (so their finalizers run),
    the files it left open closed, stdio flushed (status 120 if that fails, as Python's), then
    os._exit. Like Python, it does not promise finalizers of other objects still referenced at
    exit."""
    import threading

    threading._shutdown()  # type: ignore[attr-defined]  (what Py_FinalizeEx calls first)
    atexit.unregister(gc.unfreeze)  # for the paths that leave through Python's own finalization
    atexit._run_exitfuncs()
    # As Python's finalization: __main__ leaves sys.modules, then a collection frees it with its
    # globals whole (so their finalizers can still use them). Frozen objects are not collected:
    # this is the rank's own garbage only.
    sys.modules.pop("__main__", None)
    gc.collect()
    _close_open_files()
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except Exception:  # noqa: BLE001
            status = 120
    os._exit(status & 0xFF)  # what the OS keeps of any int


def _interpose_at_first_torch_import(start: RankStart) -> None:
    """The bootstrap's import hook, for a torch that is already imported: every import statement
    goes through builtins.__import__, so the script's first `import torch` (direct or in a
    library) installs the interposition there, as a fresh rank's would."""
    original = builtins.__import__

    def __import__(name: str, globals: Any = None, locals: Any = None, fromlist: Any = (), level: int = 0) -> Any:
        if level == 0 and (name == "torch" or name.startswith("torch.")):
            builtins.__import__ = original
            if dict(os.environ) != start.import_env:
                _restart_fresh(start)
            from interpose.launch import hook

            try:
                hook.after_torch_import()
            except Exception as e:
                raise hook.InterpositionError(
                    f"phantora: could not install virtual GPUs into torch: {type(e).__name__}: {e}") from e
        return original(name, globals, locals, fromlist, level)

    builtins.__import__ = __import__


def _restart_fresh(start: RankStart) -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execve(sys.executable, [start.argv0, *start.options, *start.argv], dict(start.env, **{FRESH_ENV: "1"}))
    except OSError:
        traceback.print_exc()
        os._exit(1)
