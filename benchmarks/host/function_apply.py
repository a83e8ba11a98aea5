"""What a custom torch.autograd.Function costs the host beyond its own Python, forward and
backward, on real CPU tensors (no phantora): the C++ of `Function.apply` (the context object, the
backward node, the outputs' wrapping) and of the engine calling the node's Python backward (the
GIL, the gradients' tuples, the outputs' checks).

    python benchmarks/host/function_apply.py [--device cpu|cuda] [--n 20000]

Each figure is the least of 7 repeats of a loop of n, in ns: a plain op (`x * 1.5`), the same op as
a Function's forward, a chain's backward through n plain ops and through n Functions whose
backward is `g * 1.5`. Prints one JSON line with the differences (the Function's overhead, its
Python included) and the fixed pure-Python benchmark's time here (phantora/cost/host_bench.py),
which scales them to another host.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from phantora.cost.host_bench import python_bench_ms  # noqa: E402


class Scale(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 1.5

    @staticmethod
    def backward(ctx, g):
        return g * 1.5


def least_ns(fn, n: int, repeats: int = 7) -> float:
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter_ns()
        fn(n)
        best = min(best, time.perf_counter_ns() - t)
    return best / n


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--n", type=int, default=20000)
    args = ap.parse_args()
    x = torch.ones(4, device=args.device, requires_grad=True)
    sync = torch.cuda.synchronize if args.device.startswith("cuda") else (lambda: None)

    def plain(n):
        for _ in range(n):
            x * 1.5
        sync()

    def function(n):
        for _ in range(n):
            Scale.apply(x)
        sync()

    def chain_backward(make, n):
        y = x
        for _ in range(n):
            y = make(y)
        loss = y.sum()
        sync()
        t = time.perf_counter_ns()
        loss.backward()
        sync()
        return time.perf_counter_ns() - t

    def backward_least(make, n, repeats=7):
        return min(chain_backward(make, n) for _ in range(repeats)) / n

    plain(1000), function(1000)
    out = {"device": args.device, "torch": torch.__version__,
           "plain_op_ns": least_ns(plain, args.n), "function_forward_ns": least_ns(function, args.n),
           "plain_backward_node_ns": backward_least(lambda y: y * 1.5, args.n),
           "function_backward_node_ns": backward_least(Scale.apply, args.n),
           "python_bench_ms": min(python_bench_ms() for _ in range(3))}
    out["apply_overhead_ns"] = out["function_forward_ns"] - out["plain_op_ns"]
    out["backward_overhead_ns"] = out["function_backward_node_ns"] - out["plain_backward_node_ns"]
    print(json.dumps(out))


if __name__ == "__main__":
    main()
