"""Wall time per simulated step and memory per rank against rank count, FSDP2 example.

    python benchmarks/bench_scaling.py [--ranks 1,2,4,8,16] [--sync optimistic,conservative] [--layers 2 ...]

Ranks are processes sharing this machine's cores. For each rank count the FSDP2 example
(examples/fsdp_train.py) runs twice under `phantora trace`, with 1 and with 1 + --steps steps;
the difference in wall time divided by --steps is the wall time per step without start-up.
More than 8 ranks use 8-GPU nodes (--nnodes). While the longer run goes, the proportional
set size (PSS: shared pages split between the processes sharing them) of every rank process
and the simulator's RSS are sampled from /proc; the table shows their peaks.

The simulator's own CPU per step (the engine and network in the `phantora trace` process, not
the rank processes) is read from /proc/PID/stat of that process each time rank 0 prints a step
line of the longer run: (CPU at the last step line - CPU at step 1's) / (steps - 1). Ranks wait
for the simulator's answer to their synchronize each step, so the lines keep pace with it.
--one-run skips the 1-step run (its wall columns are then left empty): one run per rank count,
for the largest counts. The exponent of the CPU per step against ranks is fitted at the end.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from _procfs import descendants, pss_kib

ROOT = Path(__file__).resolve().parent.parent


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
            ranks = descendants(self.root_pid)
            total = sum(pss_kib(p) for p in ranks)
            if total > self.peak_ranks_kib:
                self.peak_ranks_kib, self.peak_ranks = total, len(ranks)
            self.peak_sim_kib = max(self.peak_sim_kib, pss_kib(self.root_pid))


def _cpu_s(pid: int) -> float:
    """CPU time (user + system) of the process itself, not of its children."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return math.nan
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run(ranks: int, steps: int, model: list[str], out: Path, sync: str) -> tuple[float, MemorySampler, str, list[float]]:
    """Wall time, memory, stdout, and the simulator's CPU time at each of rank 0's step lines."""
    per_node = min(ranks, 8)
    nodes = math.ceil(ranks / 8)
    cmd = [sys.executable, "-m", "phantora.cli", "trace", "--nnodes", str(nodes), "--nproc-per-node", str(per_node),
           "--sync", sync, "-o", str(out), "--", sys.executable, "examples/fsdp_train.py", *model, "--steps", str(steps)]
    t0 = time.perf_counter()
    env = dict(os.environ, PYTHONUNBUFFERED="1")  # step lines as they are printed
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    sampler = MemorySampler(proc.pid)
    sampler.start()
    err: list[str] = []
    reader = threading.Thread(target=lambda: err.append(proc.stderr.read()), daemon=True)  # type: ignore[union-attr]
    reader.start()
    lines, step_cpu = [], []
    for line in proc.stdout:  # type: ignore[union-attr]
        if line.startswith("step "):
            step_cpu.append(_cpu_s(proc.pid))
        lines.append(line)
    proc.wait(timeout=3600)
    reader.join()
    wall = time.perf_counter() - t0
    sampler.stop.set()
    if proc.returncode != 0:
        raise RuntimeError(f"{ranks} ranks failed ({proc.returncode}):\n{''.join(err)[-3000:]}")
    return wall, sampler, "".join(lines), step_cpu


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
    ap.add_argument("--one-run", action="store_true", help="only the longer run (no wall per step)")
    args = ap.parse_args()
    model = ["--layers", args.layers, "--embd", args.embd, "--heads", args.heads, "--seq", args.seq,
             "--batch", args.batch]
    print(f"FSDP2 example {' '.join(model)}; wall per step = (wall({1 + args.steps} steps) - wall(1 step)) / {args.steps}")
    print(f"{'sync':>12} {'ranks':>5} {'wall 1 step s':>13} {'wall/step s':>11} {'per rank s':>10} {'sim step ms':>11} "
          f"{'PSS/rank MiB':>12} {'sim PSS MiB':>11} {'sim CPU/step s':>14}")
    cpu: dict[str, list[tuple[int, float]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for n, sync in ((int(x), m) for x in args.ranks.split(",") for m in args.sync.split(",")):
            short = math.nan if args.one_run else run(n, 1, model, Path(tmp) / f"s{n}.json", sync)[0]
            long, mem, stdout, step_cpu = run(n, 1 + args.steps, model, Path(tmp) / f"l{n}.json", sync)
            per_step = (long - short) / args.steps
            sim = re.findall(r"^step \d+: time ([\d.]+) ms", stdout, re.M)
            pss = mem.peak_ranks_kib / n / 1024  # the fork server's share counts too
            cpu_step = (step_cpu[-1] - step_cpu[1]) / (len(step_cpu) - 2) if len(step_cpu) > 2 else math.nan
            cpu.setdefault(sync, []).append((n, cpu_step))
            print(f"{sync:>12} {n:>5} {short:>13.1f} {per_step:>11.2f} {per_step / n:>10.2f} {float(sim[-1]):>11.2f} "
                  f"{pss:>12.0f} {mem.peak_sim_kib / 1024:>11.0f} {cpu_step:>14.3f}", flush=True)
    for sync, points in cpu.items():
        pts = [(math.log(n), math.log(c)) for n, c in points if c > 0]
        if len(pts) >= 2:
            mx, my = sum(x for x, _ in pts) / len(pts), sum(y for _, y in pts) / len(pts)
            slope = sum((x - mx) * (y - my) for x, y in pts) / sum((x - mx) ** 2 for x, _ in pts)
            print(f"{sync}: simulator CPU per step grows as ranks^{slope:.2f} (least squares in log-log)")


if __name__ == "__main__":
    main()
