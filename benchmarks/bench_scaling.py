"""Wall time per simulated step and memory per rank against rank count, FSDP2 example.

    python benchmarks/bench_scaling.py [--ranks 1,2,4,8,16] [--sync optimistic,conservative] [--layers 2 ...]

Ranks are processes sharing this machine's cores. For each rank count the FSDP2 example
(examples/fsdp_train.py) runs twice under `phantora trace`, with 1 and with 1 + --steps steps;
the difference in wall time divided by --steps is the wall time per step without start-up.
More than 8 ranks use 8-GPU nodes (--nnodes). While the longer run goes, the proportional
set size (PSS: shared pages split between the processes sharing them) of every rank process
and the simulator's RSS are sampled from /proc; the table shows their peaks.
"""

from __future__ import annotations

import argparse
import math
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _pss_kib(pid: int) -> int:
    try:
        text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except OSError:
        return 0
    m = re.search(r"^Pss:\s+(\d+) kB", text, re.M)
    return int(m.group(1)) if m else 0


def _children(pid: int) -> list[int]:
    """Every process under `pid`: ranks forked by the fork server are its children, not phantora's."""
    out, todo = [], [pid]
    while todo:
        for task in Path(f"/proc/{todo.pop()}/task").glob("*"):
            try:
                kids = [int(c) for c in (task / "children").read_text().split()]
            except OSError:
                continue
            out += kids
            todo += kids
    return out


class MemorySampler(threading.Thread):
    """Peak summed PSS of the processes under the simulator (ranks, fork server) and the simulator's PSS."""

    def __init__(self, root_pid: int) -> None:
        super().__init__(daemon=True)
        self.root_pid = root_pid
        self.peak_ranks_kib = 0
        self.peak_ranks = 0
        self.peak_sim_kib = 0
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(0.5):
            ranks = [p for p in _children(self.root_pid)]
            total = sum(_pss_kib(p) for p in ranks)
            if total > self.peak_ranks_kib:
                self.peak_ranks_kib, self.peak_ranks = total, len(ranks)
            self.peak_sim_kib = max(self.peak_sim_kib, _pss_kib(self.root_pid))


def run(ranks: int, steps: int, model: list[str], out: Path, sync: str) -> tuple[float, MemorySampler, str]:
    per_node = min(ranks, 8)
    nodes = math.ceil(ranks / 8)
    cmd = [sys.executable, "-m", "phantora.cli", "trace", "--nnodes", str(nodes), "--nproc-per-node", str(per_node),
           "--sync", sync, "-o", str(out), "--", sys.executable, "examples/fsdp_train.py", *model, "--steps", str(steps)]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    sampler = MemorySampler(proc.pid)
    sampler.start()
    stdout, stderr = proc.communicate(timeout=3600)
    wall = time.perf_counter() - t0
    sampler.stop.set()
    if proc.returncode != 0:
        raise RuntimeError(f"{ranks} ranks failed ({proc.returncode}):\n{stderr[-3000:]}")
    return wall, sampler, stdout


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", default="1,2,4,8,16")
    ap.add_argument("--steps", type=int, default=2, help="extra steps of the longer run")
    ap.add_argument("--sync", default="optimistic", help="comma-separated --sync modes to compare")
    ap.add_argument("--layers", default="2")
    ap.add_argument("--embd", default="256")
    ap.add_argument("--heads", default="4")
    ap.add_argument("--seq", default="256")
    ap.add_argument("--batch", default="4")
    args = ap.parse_args()
    model = ["--layers", args.layers, "--embd", args.embd, "--heads", args.heads, "--seq", args.seq,
             "--batch", args.batch]
    print(f"FSDP2 example {' '.join(model)}; wall per step = (wall({1 + args.steps} steps) - wall(1 step)) / {args.steps}")
    print(f"{'sync':>12} {'ranks':>5} {'wall 1 step s':>13} {'wall/step s':>11} {'per rank s':>10} {'sim step ms':>11} "
          f"{'PSS/rank MiB':>12} {'sim PSS MiB':>11}")
    with tempfile.TemporaryDirectory() as tmp:
        for n, sync in ((int(x), m) for x in args.ranks.split(",") for m in args.sync.split(",")):
            short, _, _ = run(n, 1, model, Path(tmp) / f"s{n}.json", sync)
            long, mem, stdout = run(n, 1 + args.steps, model, Path(tmp) / f"l{n}.json", sync)
            per_step = (long - short) / args.steps
            sim = re.findall(r"^step \d+: time ([\d.]+) ms", stdout, re.M)
            pss = mem.peak_ranks_kib / n / 1024  # the fork server's share counts too
            print(f"{sync:>12} {n:>5} {short:>13.1f} {per_step:>11.2f} {per_step / n:>10.2f} {float(sim[-1]):>11.2f} "
                  f"{pss:>12.0f} {mem.peak_sim_kib / 1024:>11.0f}", flush=True)


if __name__ == "__main__":
    main()
