"""Start-up cost per rank with and without the fork server (issue 17, item 6).

    python benchmarks/bench_startup.py [--ranks 1,8,16,32] [--what startup,fsdp]
    python benchmarks/bench_startup.py --what matching [--ranks 1024,4096]

`matching` times the simulator alone (no processes): one collective of an N-rank world group as
`--ranks auto` joins it, the representative's call (its group parsed from the wire, as
CollectiveCall.from_wire makes it) then N - 1 mirrored calls (their groups from
mirrors.GroupFamilies), each matched by CollectiveMatcher.join and looked up by key once more as
collective_lifecycle's _work_for does. A collective's key holds its group, so each join hashed and
compared an N-tuple: the matching grew with GPUs x GPUs (issue 29, item 4). "interned" also
gives the representative's call the shared group object (what CollectiveCall.from_wire would
do with phantora.roles.rank_group).

matching, 2026-11-27 on the 2-core machine under a load average of 13-18 (one run each, same minute):
  GPUs | before RankGroup | mirrored groups shared (now) | representative's call interned too
  1024 |         175.3 ms |                     105.0 ms |                            19.6 ms
  4096 |       2,830.2 ms |                   1,585.9 ms |                            98.0 ms
An FSDP2 step has ~100 world-group collectives (196 per rank in the 1-step Llama 8B run of
bench_scale.py), so at 4,096 GPUs the matching alone was minutes of the run.

For each rank count, `phantora trace` runs twice per workload: with the ranks started by Popen
(PHANTORA_FORK_SERVER=0) and forked from the fork server (the default). Workloads:
  startup  the FSDP2 example's start alone (benchmarks/_startup_only.py: its imports, joining the
           process group, one all-reduce)
  fsdp     the FSDP2 example (examples/fsdp_train.py, 2 layers, one step)
Wall is the run's wall time; CPU is user + system time of phantora and every process under it
(os.wait4's rusage includes every descendant that was waited for), so CPU/rank includes the
simulator's share. PSS/rank: peak proportional set size of every process under phantora (pages
shared by forked ranks are split between them), summed and divided by the rank count. More than
8 ranks use 8-GPU nodes (--nnodes). One rank never uses the fork server (nothing to share): both
columns are Popen there. One run each: compare ratios within one invocation.

Measured 2026-11-24 on the 2-core machine under a load average of 25-48 (other sessions' jobs):
workload ranks | Popen wall s CPU/rank s PSS/rank MiB | fork wall s CPU/rank s PSS/rank MiB | wall x  CPU x
 startup     1 |          3.7       2.80          220 |         4.6       2.99          221 |   0.80   0.94
 startup     8 |         45.9       3.28          220 |         8.1       0.66          216 |   5.65   4.99
 startup    16 |        102.4       3.08          220 |        18.9       0.55          191 |   5.41   5.59
 startup    32 |        206.1       3.19          220 |        23.6       0.51          162 |   8.74   6.22
    fsdp     1 |          4.8       2.95          243 |         4.5       2.94          248 |   1.06   1.00
    fsdp     8 |         42.8       3.62          232 |        17.1       1.26          226 |   2.50   2.86
    fsdp    16 |        141.0       3.86          226 |        30.7       1.14          201 |   4.60   3.39
    fsdp    32 |        215.0       3.87          224 |        48.7       1.11          170 |   4.41   3.47
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
from dataclasses import dataclass
from pathlib import Path

from _procfs import descendants, pss_kib

ROOT = Path(__file__).resolve().parent.parent
WORKLOADS = {
    "startup": ["benchmarks/_startup_only.py"],
    "fsdp": ["examples/fsdp_train.py", "--layers", "2", "--steps", "1"],
}


@dataclass
class Run:
    wall_s: float
    cpu_s: float
    peak_pss_kib: int


def run(ranks: int, workload: str, fork_server: bool, out: Path) -> Run:
    per_node, nodes = min(ranks, 8), math.ceil(ranks / 8)
    cmd = [sys.executable, "-m", "phantora.cli", "trace", "-q", "--nnodes", str(nodes), "--nproc-per-node",
           str(per_node), "-o", str(out), "--", sys.executable, *WORKLOADS[workload]]
    env = dict(os.environ, PHANTORA_FORK_SERVER="1" if fork_server else "0")
    with tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=err)
        peak, done = [0], threading.Event()

        def sample() -> None:
            while not done.wait(0.5):
                peak[0] = max(peak[0], sum(pss_kib(p) for p in descendants(proc.pid)))

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)
        done.set()
        if proc.returncode != 0:
            err.seek(0)
            raise RuntimeError(f"{workload} at {ranks} ranks failed ({proc.returncode}):\n{err.read()[-3000:].decode()}")
    return Run(wall, usage.ru_utime + usage.ru_stime, peak[0])


def matching(gpus: int, interned: bool, collectives: int = 5) -> float:
    """Seconds per collective of matching its `gpus` members' calls (see the module docstring)."""
    sys.path.insert(0, str(ROOT))
    from phantora.engine.collectives import CollectiveCall, CollectiveMatcher
    from phantora.engine.mirrors import GroupFamilies
    from phantora.roles import rank_group

    families = GroupFamilies()
    families.add("0", tuple(range(gpus)))
    matcher, works = CollectiveMatcher(), {}
    t0 = time.perf_counter()
    for seq in range(collectives):
        wire = tuple(int(r) for r in range(gpus))
        rep = CollectiveCall(0, "all_gather", rank_group(wire) if interned else wire, seq, 1 << 20, group_name="0")
        for rank in range(gpus):
            call = rep if rank == 0 else CollectiveCall(rank, "all_gather", families.counterpart("0", rank, 0)[1], seq,
                                                       1 << 20, group_name="0", mirrored=True)
            p = matcher.join(call)
            works.setdefault(call.key, p)
    return (time.perf_counter() - t0) / collectives


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", default="1,8,16,32")
    ap.add_argument("--what", default="startup,fsdp", help="workloads: " + ", ".join(WORKLOADS) + ", or matching")
    args = ap.parse_args()
    if args.what == "matching":
        print(f"{'GPUs':>5} {'ms per collective':>18} {'interned':>9}")
        for n in (int(x) for x in args.ranks.split(",")):
            for interned in (False, True):
                print(f"{n:>5} {matching(n, interned) * 1e3:>18.1f} {'yes' if interned else 'no':>9}", flush=True)
        return
    print(f"{'workload':>8} {'ranks':>5} | {'Popen wall s':>12} {'CPU/rank s':>10} {'PSS/rank MiB':>12} | "
          f"{'fork wall s':>11} {'CPU/rank s':>10} {'PSS/rank MiB':>12} | {'wall x':>6} {'CPU x':>6}")
    with tempfile.TemporaryDirectory() as tmp:
        for workload in args.what.split(","):
            for n in (int(x) for x in args.ranks.split(",")):
                popen = run(n, workload, False, Path(tmp) / "popen.json")
                fork = run(n, workload, True, Path(tmp) / "fork.json")
                print(f"{workload:>8} {n:>5} | {popen.wall_s:>12.1f} {popen.cpu_s / n:>10.2f} "
                      f"{popen.peak_pss_kib / n / 1024:>12.0f} | {fork.wall_s:>11.1f} {fork.cpu_s / n:>10.2f} "
                      f"{fork.peak_pss_kib / n / 1024:>12.0f} | {popen.wall_s / fork.wall_s:>6.2f} "
                      f"{popen.cpu_s / fork.cpu_s:>6.2f}", flush=True)


if __name__ == "__main__":
    main()
