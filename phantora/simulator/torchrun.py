"""A torchrun command line, read with torchrun's own argument parser.

`phantora trace -- torchrun --nnodes 128 --nproc-per-node 8 train.py` cannot run torchrun as
it is: its agent would wait for 127 other nodes' agents. Where phantora must start the ranks
itself (several nodes, or only representatives: --ranks), it reads the line with the parser of
the torch that torchrun belongs to (torch.distributed.run.get_args_parser, run in torchrun's own
interpreter, so flags mean what they mean to that release) and starts each worker with the
environment torchrun would give it (launch.rank_env), its output where torchrun's options put it
(worker_logs.py).
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
class WorkerOutput:
    """torchrun's options for its workers' output (torch/distributed/run.py), as given."""
    python: str  # torchrun's interpreter: its torch places the log files
    log_dir: str | None  # --log-dir
    redirects: str  # --redirects / -r: "0".."3" or "0:1,1:2" per local rank
    tee: str  # --tee / -t, as --redirects
    local_ranks_filter: frozenset[int] | None  # --local-ranks-filter: the local ranks shown on the console
    role: str  # --role: ROLE_NAME, and the console prefix of tee'd lines

    def redirected(self) -> bool:
        """Whether any stream leaves the console (else workers simply inherit it)."""
        return self.redirects != "0" or self.tee != "0" or self.local_ranks_filter is not None


@dataclass(frozen=True)
class TorchrunLine:
    nnodes: int
    nproc_per_node: int | None  # None: torchrun's "gpu"/"auto" (one per GPU of the node)
    worker: list[str]  # the command each worker runs: [python, script, ...] or [python, -m, module, ...]
    output: WorkerOutput


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


def torch_only_env() -> dict[str, str]:
    """The environment to run torch's own code in torchrun's interpreter: not interposed."""
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


def parse_torchrun(command: list[str]) -> TorchrunLine | None:
    """The torchrun line in `command`, or None if `command` is not torchrun."""
    found = _interpreter(command)
    if found is None:
        return None
    python, args = found
    proc = subprocess.run([python, "-c", _PARSE, *args], capture_output=True, text=True, env=torch_only_env(),
                          timeout=120)
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
    return TorchrunLine(int(low), int(nproc) if nproc.isdigit() else None, worker, _worker_output(python, a))


def _worker_output(python: str, a: dict) -> WorkerOutput:
    ranks = None
    if a.get("local_ranks_filter"):
        try:  # as torch/distributed/run.py config_from_args reads it
            ranks = frozenset(map(int, a["local_ranks_filter"].split(",")))
        except ValueError:
            raise TorchrunLineError("--local_ranks_filter must be a comma-separated list of integers e.g. "
                                    "--local_ranks_filter=0,1,2") from None
    return WorkerOutput(python, a.get("log_dir"), str(a.get("redirects") or "0"), str(a.get("tee") or "0"), ranks,
                        str(a.get("role") or "default"))
