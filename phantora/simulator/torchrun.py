"""A torchrun command line, read with torchrun's own argument parser.

`phantora trace -- torchrun --nnodes 128 --nproc-per-node 8 train.py` cannot run torchrun as
it is: its agent would wait for 127 other nodes' agents. Where phantora must start the ranks
itself (several nodes, or only representatives: --ranks), it reads the line with the parser of
the torch that torchrun belongs to (torch.distributed.run.get_args_parser, run in torchrun's own
interpreter, so flags mean what they mean to that release) and starts each worker with the
environment torchrun would give it (launch.rank_env).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

_PARSE = ("import json, sys\n"
          "from torch.distributed.run import get_args_parser\n"
          "a = get_args_parser().parse_args(sys.argv[1:])\n"
          "print(json.dumps({k: v for k, v in vars(a).items() if isinstance(v, (str, int, bool, list, type(None)))}))\n")


class TorchrunLineError(ValueError):
    """A torchrun line phantora cannot start the workers of (the message says why)."""


@dataclass(frozen=True)
class TorchrunLine:
    nnodes: int
    nproc_per_node: int | None  # None: torchrun's "gpu"/"auto" (one per GPU of the node)
    worker: list[str]  # the command each worker runs: [python, script, ...] or [python, -m, module, ...]


def _interpreter(command: list[str]) -> tuple[str, list[str]] | None:
    """(python, torchrun's arguments) if `command` is torchrun or `python -m torch.distributed.run`."""
    exe = shutil.which(command[0]) or command[0]
    if Path(exe).name == "torchrun":
        try:
            first = Path(exe).read_bytes()[:512].split(b"\n", 1)[0].decode()
        except OSError:
            return None
        if not first.startswith("#!"):
            return None
        return first[2:].strip().split()[0], command[1:]
    if len(command) >= 3 and command[1:3] == ["-m", "torch.distributed.run"]:
        return exe, command[3:]
    return None


def parse_torchrun(command: list[str]) -> TorchrunLine | None:
    """The torchrun line in `command`, or None if `command` is not torchrun."""
    found = _interpreter(command)
    if found is None:
        return None
    python, args = found
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # the parser only, not interposed
    proc = subprocess.run([python, "-c", _PARSE, *args], capture_output=True, text=True, env=env, timeout=120)
    if proc.returncode != 0:
        raise TorchrunLineError(f"torchrun's argument parser refused the line: {proc.stderr.strip()[-800:]}")
    a = json.loads(proc.stdout.strip().splitlines()[-1])
    nnodes = str(a["nnodes"])
    low, _, high = nnodes.partition(":")
    if high and low != high:
        raise TorchrunLineError(f"torchrun --nnodes {nnodes}: an elastic range; phantora simulates a fixed number of "
                                "nodes, pass one (e.g. --nnodes " + high + ")")
    nproc = str(a["nproc_per_node"])
    script, script_args = a["training_script"], list(a["training_script_args"])
    if a.get("no_python"):
        worker = [script, *script_args]
    elif a.get("module"):
        worker = [python, "-m", script, *script_args]
    else:
        worker = [python, script, *script_args]
    return TorchrunLine(int(low), int(nproc) if nproc.isdigit() else None, worker)
