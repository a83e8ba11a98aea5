"""torchrun's workers' output when phantora starts the workers itself (several nodes, --ranks).

torchrun's agent sends each worker's stdout and stderr where its options say (torch/distributed/
run.py): `--redirects` into log files under `--log-dir`, `--tee` into those files and onto the
console with a `[{role}{local_rank}]:` prefix (or TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE's),
`--local-ranks-filter` keeps the other local ranks off the console; and every worker gets
TORCHELASTIC_ERROR_FILE, where torch's `@record` writes an uncaught exception. TorchTitan's
run_train.sh, for one, passes `--local-ranks-filter 0 --role rank --tee 3`.

Which file each local rank writes is torch's own decision: `DefaultLogsSpecs.reify`, run in
torchrun's interpreter (the release the user runs), once per node that has processes, as each
node's agent would. The rank process opens its files itself at its start (launch.py passes them
in interpose/launch/warm.py's STDOUT_ENV and STDERR_ENV: the fork server's open_rank_streams, or
Popen's stdout/stderr), and this launcher tails the tee'd files onto its console as torch's
TailLog does.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from string import Template
from typing import TextIO

from phantora.simulator.torchrun import TorchrunLineError, WorkerOutput, torch_only_env

PREFIX_TEMPLATE_ENV = "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"
TAIL_INTERVAL_S = 0.1  # TailLog's default

_REIFY = """
import json, sys
from torch.distributed.elastic.multiprocessing.api import DefaultLogsSpecs, Std
a = json.loads(sys.argv[1])
ranks = set(a["filter"]) if a["filter"] is not None else None
out = {}
for node in a["nodes"]:
    envs = {i: {"TORCHELASTIC_RUN_ID": a["run_id"], "TORCHELASTIC_RESTART_COUNT": "0"} for i in range(a["nproc"])}
    spec = DefaultLogsSpecs(log_dir=a["log_dir"], redirects=Std.from_str(a["redirects"]), tee=Std.from_str(a["tee"]),
                            local_ranks_filter=ranks)
    d = spec.reify(envs)
    out[node] = [[d.stdouts[i], d.stderrs[i], i in d.tee_stdouts, i in d.tee_stderrs,
                  envs[i].get("TORCHELASTIC_ERROR_FILE", "")] for i in range(a["nproc"])]
print(json.dumps(out))
"""


@dataclass(frozen=True)
class RankOutput:
    """Where one worker's streams go: a file, os.devnull, or "" for the console."""
    stdout: str
    stderr: str
    tee_stdout: bool  # the stdout file is also shown on the console, prefixed
    tee_stderr: bool
    error_file: str  # TORCHELASTIC_ERROR_FILE
    prefix: str  # what a tee'd line is prefixed with


def worker_outputs(output: WorkerOutput, nproc: int, ranks: list[int], run_id: str) -> dict[int, RankOutput]:
    """Each of `ranks` (global ranks of nodes of `nproc` workers) to its output, as torchrun's
    agent on its node would place it."""
    nodes = sorted({r // nproc for r in ranks})
    arg = {"nodes": nodes, "nproc": nproc, "run_id": run_id, "log_dir": output.log_dir,
           "redirects": output.redirects, "tee": output.tee,
           "filter": sorted(output.local_ranks_filter) if output.local_ranks_filter is not None else None}
    proc = subprocess.run([output.python, "-c", _REIFY, json.dumps(arg)], capture_output=True, text=True,
                          env=torch_only_env(), timeout=120)
    if proc.returncode != 0:
        raise TorchrunLineError(f"torchrun's log options (--log-dir {output.log_dir}, --redirects {output.redirects}, "
                                f"--tee {output.tee}) were refused: {proc.stderr.strip()[-800:]}")
    placed = json.loads(proc.stdout.strip().splitlines()[-1])
    template = os.environ.get(PREFIX_TEMPLATE_ENV)
    outputs = {}
    for rank in ranks:
        node, local = divmod(rank, nproc)
        stdout, stderr, tee_out, tee_err, error_file = placed[str(node)][local]
        prefix = (Template(template).safe_substitute(role_name=output.role, rank=rank, local_rank=local)
                  if template else f"[{output.role}{local}]:")
        outputs[rank] = RankOutput(stdout, stderr, tee_out, tee_err, error_file, prefix)
    return outputs


class Tails:
    """The tee'd files, copied line by line onto this process's stdout and stderr with each
    rank's prefix (torch's TailLog: a thread per file, polling at EOF until stopped)."""

    def __init__(self, outputs: dict[int, RankOutput]) -> None:
        self._done = threading.Event()
        self._threads = []
        for out in outputs.values():
            for path, dst, tee in ((out.stdout, sys.stdout, out.tee_stdout), (out.stderr, sys.stderr, out.tee_stderr)):
                if tee and path:
                    t = threading.Thread(target=self._tail, args=(out.prefix, path, dst), daemon=True,
                                         name=f"phantora-tail-{os.path.basename(os.path.dirname(path))}")
                    t.start()
                    self._threads.append(t)

    def _tail(self, prefix: str, path: str, dst: TextIO) -> None:
        while not os.path.exists(path):
            if self._done.is_set():
                return
            time.sleep(TAIL_INTERVAL_S)
        with open(path, errors="replace") as f:
            while True:
                line = f.readline()
                if line:
                    dst.write(f"{prefix}{line}")
                elif self._done.is_set():
                    break
                else:
                    dst.flush()
                    time.sleep(TAIL_INTERVAL_S)
        dst.flush()

    def stop(self, timeout_s: float = 30.0) -> None:
        """Copy what the files still hold, then stop (the workers have exited)."""
        self._done.set()
        deadline = time.monotonic() + timeout_s
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))
