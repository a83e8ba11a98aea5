"""Python work counted per phase of host_probe.py's workloads: on real CPU tensors, and under phantora.

    python benchmarks/host/count_probe.py --device cpu              # plain PyTorch, no phantora
    phantora trace -o t.json -- python benchmarks/host/count_probe.py --device cuda

Each phase of each workload (benchmarks/groundtruth/host_probe.py: no-grad forward, forward,
forward + backward, optimizer step) runs after two warm-ups, and prints the bytecode instructions and
Python calls the counter of interpose/host/python_work.py saw on this thread while it ran. Without
phantora that is the program's own Python; under phantora it is what phantora charges as the
program's (its own work is paused or excluded). The two must agree: a difference is phantora's
Python leaking into the program's time, or a branch of torch's Python that differs by device.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks" / "groundtruth"))

import torch  # noqa: E402

import host_probe  # noqa: E402
from interpose.host import python_work  # noqa: E402
from phantora.cost.host import PYTHON_WORK  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--only", default="")
    args = ap.parse_args()
    counter = python_work.load()
    counter.resume()
    host_probe.DEVICE = args.device
    results = {}

    pt = None
    if args.device == "cuda":  # under phantora: what it charged, after its own per-op floor
        from interpose import runtime

        pt = runtime.get().python_time

    w = PYTHON_WORK

    def measure(fn):
        for _ in range(2):
            fn()
        a, ca = counter.all_counts(), pt.charged if pt else 0
        fn()
        b, cb = counter.all_counts(), pt.charged if pt else 0
        ins, calls, sites = (b[i] - a[i] for i in range(3))
        if pt is None:  # plain: the counts at phantora's costs
            charged = (ins - sites) * w.instruction_ps + sites * w.call_site_ps + calls * w.call_ps
        else:
            charged = cb - ca
        return [ins, calls, charged, sites]

    host_probe.timed = lambda fn, reps: measure(fn)
    host_probe.counted = lambda fn: {}
    torch.manual_seed(0)
    for name, make in host_probe.WORKLOADS.items():
        if args.only and name not in args.only.split(","):
            continue
        r = make()
        results[r["name"]] = r["us"]
        print(r["name"], json.dumps(r["us"]), flush=True)
    print("COUNTS " + json.dumps(results))


if __name__ == "__main__":
    main()
