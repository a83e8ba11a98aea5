"""Reaching a warm fork server (PHANTORA_FORK_SERVER_DIR): which server may serve a process, and
handing it one.

A warm server (interpose/launch/forkserver.py warm()) has imported torch once, under one
interpreter and one import-time environment, and forks later runs' processes from there. Two
kinds of caller hand it work: `phantora trace`'s launcher, for the ranks it starts itself
(phantora/simulator/forkserver.py), and a Python process that something else under phantora
started (torchrun's agent and its workers, a framework's launcher; interpose/launch/handoff.py).
Both reach the server of their key here, starting it if none listens. This module runs at every
such process's start-up (the bootstrap): it imports nothing heavy.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from interpose.host.host_time import ENV as HOST_TIME_ENV
from phantora.mask_fraction import ENV as MASK_FRACTION_ENV
from phantora.roles import ENV as REPRESENTATIVES_ENV

# phantora.routing.ENV (a test checks they agree): importing phantora.routing brings numpy into
# every process's start-up.
ROUTING_ENV = "PHANTORA_ROUTING"
DIR_ENV = "PHANTORA_FORK_SERVER_DIR"
IDLE_ENV = "PHANTORA_FORK_SERVER_IDLE_S"
CONNECT_S = 30.0  # to reach a server just started: it listens before it imports torch

# Where a rank's stdout and stderr go when torchrun's options send them to a file or nowhere
# (phantora/simulator/worker_logs.py): the rank process opens it at its start and removes the
# variable before the program runs.
STDOUT_ENV = "PHANTORA_RANK_STDOUT"
STDERR_ENV = "PHANTORA_RANK_STDERR"
# The variables rank_env (phantora/simulator/launch.py) gives each rank its own value of.
RANK_VARIABLES = frozenset({"RANK", "LOCAL_RANK", "GROUP_RANK", "ROLE_RANK", "TORCHELASTIC_ERROR_FILE", STDOUT_ENV,
                            STDERR_ENV})
# What differs between processes that a warm server may serve alike, because nothing reads them
# while torch is imported (tests/e2e/test_forkserver.py): the rest of torchrun's variables
# (less OMP_NUM_THREADS, which OpenMP reads when torch loads it; TORCHELASTIC_ERROR_FILE is
# per rank and run), phantora's settings that a rank reads once it is one (not the GPU, the
# node's GPU count or CUDA_VISIBLE_DEVICES, which preparing torch reads), and pytest's name of
# the current test, which it changes per test.
RUN_VARIABLES = RANK_VARIABLES | frozenset({
    "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_WORLD_SIZE", "ROLE_WORLD_SIZE", "ROLE_NAME", "MASTER_ADDR",
    "MASTER_PORT", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS",
    "TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_ERROR_FILE", "TORCH_NCCL_ASYNC_ERROR_HANDLING",
    "PHANTORA_SOCKET", "PHANTORA_CALL_TIMEOUT", "PHANTORA_VRAM", HOST_TIME_ENV, MASK_FRACTION_ENV, ROUTING_ENV,
    REPRESENTATIVES_ENV, "PYTEST_CURRENT_TEST"})

_WARM_CODE = ("import sys; from interpose.launch.forkserver import warm, run; "
              "run(warm(sys.argv[1], sys.argv[2], float(sys.argv[3])))")


def warm_key(interpreter: str, env: dict[str, str]) -> str:
    """Which warm server may serve processes of this interpreter and environment."""
    shared = sorted((k, v) for k, v in env.items() if k not in RUN_VARIABLES)
    return hashlib.sha256(json.dumps([interpreter, shared]).encode()).hexdigest()[:16]


def server_files(folder: str, key: str) -> tuple[Path, Path]:
    """The socket a server of `key` listens on, and the file holding its pid."""
    return Path(folder) / f"{key}.sock", Path(folder) / f"{key}.pid"


def hand_to_warm_server(interpreter: str, env: dict[str, str], command_r: int, status_w: int, command: list[str],
                        what: str) -> bool:
    """Hand one run's fork-server protocol (the pipes of interpose/launch/forkserver.py serve()),
    this process's standard streams and directory to the warm server of its key, starting one if
    none listens; the server's log (<key>.log) names `command`. False when there is none to ask
    (not wanted, or it could not be reached): the caller then starts `what` ("the ranks", "this
    process") without one, as it says."""
    folder = env.get(DIR_ENV)
    if not folder:
        return False
    key = warm_key(interpreter, env)
    path, _ = server_files(folder, key)
    if len(os.fsencode(path)) >= 100:  # a Unix socket's path has room for 107 bytes
        print(f"phantora: {DIR_ENV}={folder} is too long a path for a socket; starting {what} without a warm "
              "fork server", file=sys.stderr)
        return False
    Path(folder).mkdir(parents=True, exist_ok=True)
    deadline, server = time.monotonic() + CONNECT_S, None
    while True:
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            conn.connect(str(path))
            break
        except (FileNotFoundError, ConnectionRefusedError):
            conn.close()
        if time.monotonic() > deadline:
            print(f"phantora: no warm fork server answered at {path} within {CONNECT_S:.0f} s; starting {what} "
                  "without one", file=sys.stderr)
            return False
        if server is None or server.poll() is not None:  # none yet, or it lost the race for the key
            log = open(Path(folder) / f"{key}.log", "ab")
            server = subprocess.Popen([interpreter, "-c", _WARM_CODE, folder, key, env.get(IDLE_ENV, "120")],
                                      env=env, cwd="/", stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                      stderr=log, start_new_session=True)
            log.close()
        time.sleep(0.02)
    with conn:
        request = {"cwd": os.getcwd(), "env": env, "command": command}
        try:
            socket.send_fds(conn, [json.dumps(request).encode()], [command_r, status_w, 0, 1, 2])
        except OSError as e:
            print(f"phantora: the warm fork server at {path} did not take the run ({e}); starting {what} "
                  "without it", file=sys.stderr)
            return False
    return True
