"""Starting the rank processes of `phantora trace --nproc-per-node N`: from a fork server that
has imported torch once (interpose/launch/forkserver.py), where that is sound, else one Popen each.

Every rank of `python script.py` pays torch's import (torch, torch._dynamo, FSDP: about 2-3 s
of CPU) before doing anything else; a fork server pays it once and forks the ranks from there.
It is used when the command is a Python interpreter (python, python3.11, a path to one) followed
by a script file or `-m module`, and the ranks' environments differ only in the variables that
name the rank (nothing reads those while torch is imported: tests/e2e/test_forkserver.py).
Anything else (torchrun, a shell script, `python -c`, interpreter options) starts with Popen,
as does everything when PHANTORA_FORK_SERVER=0.

A forked rank is a child of the server, not of this launcher: RankProcess gives RankWatch what
it uses of Popen (pid, returncode, poll, wait, send_signal, terminate, kill), with the exit status
the server reports and signals sent through the server, which knows whether a pid is still
that rank's.

Warm fork servers (opt-in: PHANTORA_FORK_SERVER_DIR names a directory): the fork server outlives
the run and serves later runs too, one-rank runs included, so a sequence of runs (a sweep, a test
suite) pays torch's import once per interpreter and environment instead of once per run. Each
run's launcher connects to the server of its key (the interpreter and every variable of the
ranks' common environment except RUN_VARIABLES, which phantora or torchrun set per run and
nothing reads while torch is imported: tests/e2e/test_forkserver.py), starting it if none
listens, and hands it the run's pipes, standard streams, directory and environment; the server
forks a process that is this run's fork server from there on (interpose/launch/warm.py; the
Python processes that other launchers start hand themselves to it the same way: interpose/
launch/handoff.py). A server exits after PHANTORA_FORK_SERVER_IDLE_S seconds (default 120)
without a run. Every run it serves shares its string hash seed.
"""

from __future__ import annotations

import json
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass

from interpose.launch.handoff import forkable, path0_of
from interpose.launch.warm import DIR_ENV as WARM_DIR_ENV
from interpose.launch.warm import RANK_VARIABLES, STDERR_ENV, STDOUT_ENV, hand_to_warm_server

_PYTHON = re.compile(r"python(\d+(\.\d+)*)?")
_SERVER_CODE = "import sys; from interpose.launch.forkserver import serve, run; run(serve(int(sys.argv[1]), int(sys.argv[2])))"


@dataclass
class ForkPlan:
    interpreter: str  # the command's interpreter, resolved on the ranks' PATH
    command: list[str]
    path0: str  # sys.path[0] of the command (handoff.path0_of)
    common_env: dict[str, str]  # what every rank's environment shares: the server's
    rank_envs: list[dict[str, str]]


def fork_plan(command: list[str], envs: list[dict[str, str]]) -> ForkPlan | None:
    """How to fork these ranks from one server, or None when only Popen is sound (or wanted)."""
    warm = bool(envs and envs[0].get(WARM_DIR_ENV))
    if len(envs) < (1 if warm else 2) or envs[0].get("PHANTORA_FORK_SERVER", "1") == "0" or len(command) < 2:
        return None
    if not _PYTHON.fullmatch(os.path.basename(command[0])):
        return None
    interpreter = shutil.which(command[0], path=envs[0].get("PATH"))
    if interpreter is None:
        return None
    found = forkable(command)
    if found is None or found[0]:
        return None  # interpreter options (-u included), -c, stdin, a directory or zip
    path0 = path0_of(found[1])
    common = {k: v for k, v in envs[0].items() if all(e.get(k) == v for e in envs[1:])}
    differing = set().union(*envs) - common.keys()
    if not differing <= RANK_VARIABLES:
        return None
    return ForkPlan(interpreter, command, path0, common, envs)


def start_rank_processes(command: list[str], envs: list[dict[str, str]]) -> Iterator["RankProcess | subprocess.Popen"]:
    """One process per environment, in order. Raises FileNotFoundError / PermissionError as
    Popen does when the command cannot be run."""
    plan = fork_plan(command, envs)
    if plan is not None:
        server = ForkServer(plan)
        if server.processes is not None:
            yield from server.processes
            return
    for env in envs:
        yield _popen_rank(command, env)


def _popen_rank(command: list[str], env: dict[str, str]) -> subprocess.Popen:
    """A rank started on its own, its streams where STDOUT_ENV / STDERR_ENV say (as the fork
    server's open_rank_streams puts a forked rank's)."""
    env = dict(env)
    paths = [env.pop(STDOUT_ENV, ""), env.pop(STDERR_ENV, "")]
    files = [open(p, "w") if p else None for p in paths]  # noqa: SIM115 - the child holds them
    try:
        return subprocess.Popen(command, env=env, stdout=files[0], stderr=files[1])
    finally:
        for f in files:
            if f is not None:
                f.close()


class ForkServer:
    def __init__(self, plan: ForkPlan) -> None:
        self.command = plan.command
        command_r, command_w = os.pipe()
        self._status_r, status_w = os.pipe()
        self.popen: subprocess.Popen | None = None
        try:
            if not hand_to_warm_server(plan.interpreter, plan.common_env, command_r, status_w, plan.command,
                                       "the ranks"):
                self.popen = subprocess.Popen([plan.interpreter, "-c", _SERVER_CODE, str(command_r), str(status_w)],
                                              env=plan.common_env, pass_fds=(command_r, status_w))
        finally:
            os.close(command_r)
            os.close(status_w)
        self._commands = os.fdopen(command_w, "wb")
        self._pending = b""
        self._by_pid: dict[int, RankProcess] = {}
        self._started: list[RankProcess] = []
        self._expected = len(plan.rank_envs)
        self.fallback: str | None = None
        self._send({"argv0": plan.command[0], "argv": plan.command[1:], "path0": plan.path0,
                    "envs": [{k: v for k, v in env.items() if k not in plan.common_env} for env in plan.rank_envs]})
        self.processes: list[RankProcess] | None = None
        while len(self._started) < len(plan.rank_envs) and self._status_r >= 0:
            self.read(None)
        if len(self._started) == len(plan.rank_envs):
            self.processes = self._started
            return
        while self._status_r >= 0:  # it could not prepare torch (it says why and exits) or it died
            self.read(None)

    def _send(self, message: object) -> None:
        try:
            self._commands.write(json.dumps(message).encode() + b"\n")
            self._commands.flush()
        except (BrokenPipeError, ValueError):  # the server is gone (ValueError: we closed the pipe)
            self.read(0)  # the status pipe tells what became of its ranks

    def signal(self, pid: int, signum: int) -> None:
        self._send({"signal": [pid, signum]})

    def read(self, timeout: float | None) -> None:
        """Take in what the server has reported, waiting up to `timeout` seconds for something."""
        if self._status_r < 0 or not select.select([self._status_r], [], [], timeout)[0]:
            return
        data = os.read(self._status_r, 65536)
        if not data:
            self._server_ended()
            return
        *lines, self._pending = (self._pending + data).split(b"\n")
        for line in lines:
            word, _, rest = line.decode().partition(" ")
            if word == "started":
                p = RankProcess(self, int(rest))
                self._started.append(p)
                self._by_pid[p.pid] = p
            elif word == "exit":
                pid, code = rest.split()
                self._by_pid[int(pid)].returncode = int(code)
            elif word == "fallback":
                self.fallback = rest
        if len(self._started) == self._expected and all(p.returncode is not None for p in self._started):
            while self._status_r >= 0:  # it exits after the last rank: reap it now
                self.read(None)

    def _server_ended(self) -> None:
        os.close(self._status_r)
        self._status_r = -1
        try:
            self._commands.close()
        except BrokenPipeError:
            pass
        code = "unknown (forked by a warm fork server)" if self.popen is None else self.popen.wait()
        orphans = [p for p in self._started if p.returncode is None]
        if orphans:  # it reports every exit before it exits: it was killed
            print(f"phantora: the fork server of the rank processes ended with code {code}; "
                  f"killing its {len(orphans)} remaining rank(s), whose exit status is unknown", file=sys.stderr)
        for p in orphans:
            try:
                os.kill(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.returncode = -signal.SIGKILL


class RankProcess:
    """A rank forked by the fork server, with the part of subprocess.Popen's interface the
    launcher uses."""

    def __init__(self, server: ForkServer, pid: int) -> None:
        self._server = server
        self.pid = pid
        self.args = server.command
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self._server.read(0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.returncode is None:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
            self._server.read(left)
        return self.returncode

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:
            self._server.signal(self.pid, signum)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)
