"""A Python process that something else started under phantora (torchrun's agent and its
workers, DeepSpeed's or Lightning's launcher and theirs) hands itself to a warm fork server.

`phantora trace` forks the ranks it starts itself from a server that imported torch once
(phantora/simulator/forkserver.py); a process started by torchrun, a shell script or a
framework's launcher would import torch and torch._dynamo afresh (~5 s of CPU each). With
PHANTORA_FORK_SERVER_DIR set, such a process, at its very start (the bootstrap, before
anything of the program runs), asks the warm server of its interpreter and environment to fork
the process it is about to be: same argv, directory, environment and standard streams. It then
stands in for that process towards whoever started it: it passes on the signals it gets
(SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2; torchrun stops its workers with SIGTERM),
exits with its exit status (killed by the same signal if a signal ended it), and, if killed
itself (SIGKILL), takes it down with it. Where the server cannot serve it (interpreter options
other than -u, `python -c`, stdin, a server that cannot prepare torch) the process runs itself,
as without the directory.
"""

from __future__ import annotations

import json
import os
import signal
import sys

from interpose.launch.warm import DIR_ENV, hand_to_warm_server

FRESH_ENV = "PHANTORA_FRESH_START"  # set by a forked process that restarts itself fresh: it must not come back
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)


def forkable(orig_argv: list[str]) -> tuple[list[str], list[str]] | None:
    """(interpreter options, [script, *args] or ["-m", module, *args]) of a command line a fork
    server can start as it is, or None."""
    args = orig_argv[1:]
    options = []
    while args and args[0] == "-u":
        options.append(args.pop(0))
    if not args:
        return None
    if args[0] == "-m":
        return (options, args) if len(args) >= 2 and not args[1].startswith("-") else None
    if args[0].startswith("-") or not os.path.isfile(args[0]):
        return None  # other options, -c, stdin, a directory or zip
    return options, args


def path0_of(argv: list[str]) -> str:
    """sys.path[0] of `python script.py` (the script's directory) or `python -m module` (cwd)."""
    return os.getcwd() if argv[0] == "-m" else os.path.dirname(os.path.realpath(argv[0]))


def hand_off() -> None:
    """Have the warm server run this process; returns only where this process must run itself."""
    if os.environ.pop(FRESH_ENV, None) is not None:  # before the program can see it
        return
    env = dict(os.environ)
    if not env.get(DIR_ENV) or env.get("PHANTORA_FORK_SERVER", "1") == "0":
        return
    command = forkable(list(sys.orig_argv))
    if command is None:
        return
    options, argv = command
    path0 = path0_of(argv)
    command_r, command_w = os.pipe()
    status_r, status_w = os.pipe()
    try:
        handed = hand_to_warm_server(sys.executable, env, command_r, status_w, list(sys.orig_argv), "this process")
    finally:
        os.close(command_r)
        os.close(status_w)
    if not handed:
        os.close(command_w)
        os.close(status_r)
        return
    request = {"argv0": sys.orig_argv[0], "argv": argv, "options": options, "path0": path0, "envs": [{}],
               "orphans": "kill"}
    os.write(command_w, json.dumps(request).encode() + b"\n")
    status = os.fdopen(status_r, "rb")
    line = status.readline().decode()
    word, _, rest = line.strip().partition(" ")
    if word != "started":  # "fallback <why>": it could not prepare torch; a fresh start shows why
        status.close()
        os.close(command_w)
        return
    pid = int(rest)

    def forward(signum: int, frame: object) -> None:
        try:
            os.write(command_w, json.dumps({"signal": [pid, signum]}).encode() + b"\n")
        except OSError:  # the server is gone: the exit below says so
            pass

    for s in FORWARDED:
        signal.signal(s, forward)
    for line in status:
        word, _, rest = line.decode().strip().partition(" ")
        if word == "exit":
            code = int(rest.split()[1])
            if code < 0:
                signal.signal(-code, signal.SIG_DFL)
                os.kill(os.getpid(), -code)
            os._exit(code if code >= 0 else 128 - code)
    print(f"phantora: the fork server running this process ({sys.orig_argv}) ended before it; its exit status "
          "is unknown", file=sys.stderr)
    os._exit(1)
