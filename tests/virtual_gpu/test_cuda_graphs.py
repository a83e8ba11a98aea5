"""Issue 14, cause 6: CUDA graphs.

Before: torch.cuda.CUDAGraph was a function that raised, so `torch.cuda.CUDAGraph | None` in an
annotation (Transformers 5.x at import) and `class G(torch.cuda.CUDAGraph)` failed with a
TypeError at import, and torch.cuda.graph_pool_handle() gave torch's "dummy base class" error.
Now torch's own torch/cuda/graphs.py runs over a simulated torch._C._CUDAGraph: capture records
the kernels without running them, a replay runs them all for one cudaGraphLaunch.
"""

from __future__ import annotations

import json
import statistics
import sys
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from tests.virtual_gpu.harness import BUILDS, assert_ran, run_traced

REPLAYS = 20  # as in scripts/cuda_graphs_recipe.py
GPU_CATEGORIES = ("kernel", "gpu_memcpy")


def _slices(trace: Path) -> list[dict[str, Any]]:
    return [e for e in json.loads(trace.read_text())["traceEvents"] if e.get("ph") == "X"]


@BUILDS
def test_cuda_graph_recipe(tmp_path: Path, user_python: str) -> None:
    proc, trace = run_traced(tmp_path, user_python, "cuda_graphs_recipe.py",
                             options=("--export-kineto", str(tmp_path / "kineto")))
    assert_ran(proc, "import-time annotation and subclass", "is_current_stream_capturing during capture only",
               "graph pool stays reserved through empty_cache", "host time per replay is a small fraction of an eager step's",
               "launch-bound step is faster with CUDA graphs", "replays allocate nothing", "capture errors as on CUDA",
               "reset releases the graph pool", "make_graphed_callables forward and backward",
               "shared pool and debug_dump", "fork and join inside a capture")
    slices = _slices(trace)

    # The training step's graph is the one replayed REPLAYS times.
    replays = [s for s in slices if s["name"] == "graph replay"]
    per_graph = Counter(s["args"]["graph"] for s in replays)
    step_graph = next(g for g, n in per_graph.items() if n == REPLAYS)
    ends = {s["args"]["graph"]: s["args"] for s in slices if s["name"] == "cudaStreamEndCapture"}
    ops = ends[step_graph]["ops"]
    assert ops >= 20, ends[step_graph]  # forward, backward and SGD step of a 4-layer MLP

    # Capture ran nothing: each captured op has a host slice, no flow, and no GPU slice of its own;
    # every GPU slice outside a replay belongs to an eager op's launch.
    captured = [s for s in slices if s.get("args", {}).get("captured into CUDA graph") == step_graph]
    assert len(captured) == ops and not any("bind_id" in s for s in captured)
    gpu = [s for s in slices if s["cat"] in GPU_CATEGORIES]
    eager_launches = {s["args"]["correlation"] for s in slices
                      if s["cat"] == "cpu_op" and "correlation" in s.get("args", {})}
    outside = [s for s in gpu if "graph" not in s["args"]]
    assert {s["args"]["correlation"] for s in outside} <= eager_launches
    assert len(outside) == len(eager_launches)

    # Each replay puts the captured kernels on the GPU timeline once, inside its "graph replay" slice.
    kernels = defaultdict(list)
    for s in gpu:
        if s["args"].get("graph") == step_graph:
            kernels[s["args"]["graph replay"]].append(s)
    assert sorted(kernels) == list(range(REPLAYS))
    for r in (s for s in replays if s["args"]["graph"] == step_graph):
        mine = kernels[r["args"]["replay"]]
        assert len(mine) == ops == r["args"]["ops"]
        assert all(k["tid"] == r["tid"] and r["ts"] <= k["ts"] and k["ts"] + k["dur"] <= r["ts"] + r["dur"] + 1e-3
                   for k in mine)
        assert sum(k["args"]["kernels"] for k in mine) == r["args"]["kernels"]

    # One launch per replay on the host, far cheaper than an eager step's host time.
    launches = [s for s in slices if s["name"] == "cudaGraphLaunch" and s["args"]["graph"] == step_graph]
    assert len(launches) == REPLAYS
    assert max(s["dur"] for s in launches) <= 5.0  # us: one cudaGraphLaunch
    eager_steps = [s["dur"] for s in slices if s["name"].startswith("ProfilerStep#")][1:]
    assert eager_steps and max(s["dur"] for s in launches) * 100 < statistics.median(eager_steps)

    # The fork-join capture recorded the side stream's op too: 3 ops, replayed on one stream.
    streams = defaultdict(set)
    for s in slices:
        if "captured into CUDA graph" in s.get("args", {}):
            streams[s["args"]["captured into CUDA graph"]].add(s["args"]["stream"])
    fork_join = [g for g, seen in streams.items() if len(seen) == 2]
    assert len(fork_join) == 1 and ends[fork_join[0]]["ops"] == 3 and per_graph[fork_join[0]] == 1, (streams, ends)

    # Replays allocate and free nothing: no memory counter changes between the first and last one.
    counters = [e for e in json.loads(trace.read_text())["traceEvents"]
                if e.get("ph") == "C" and e["name"] == "cuda:0 memory"]
    first_launch, last_launch = min(s["ts"] for s in launches), max(s["ts"] for s in launches)
    assert not [c for c in counters if first_launch <= c["ts"] <= last_launch]

    # Kineto (HTA) export: as torch.profiler writes graphs, no event for the graph itself; its
    # kernels carry the correlation of the host's cudaGraphLaunch, with one arrow to the first.
    kineto = json.loads((tmp_path / "kineto" / "rank-0.pt.trace.json").read_text())["traceEvents"]
    assert not [e for e in kineto if e.get("name") == "graph replay"]
    k_launches = [e for e in kineto if e.get("name") == "cudaGraphLaunch" and e["args"]["graph"] == step_graph]
    assert len(k_launches) == REPLAYS
    for launch in k_launches:
        corr = launch["args"]["correlation"]
        assert [e["ph"] for e in kineto if e.get("cat") == "ac2g" and e.get("id") == corr] == ["s", "f"]
        graph_kernels = [e for e in kineto if e.get("ph") == "X" and e.get("pid") != launch["pid"]
                         and e.get("args", {}).get("External id") == corr]
        assert len(graph_kernels) == ops


CAPTURED_SITE = "cuda_graphs_collective.py:43"  # the dist.all_reduce inside torch.cuda.graph(g)
COLLECTIVE_REPLAYS = 5  # as in scripts/cuda_graphs_collective.py


@BUILDS
def test_collective_captured_in_a_graph_runs_at_each_replay(tmp_path: Path, user_python: str) -> None:
    proc, trace = run_traced(tmp_path, user_python, "cuda_graphs_collective.py", options=("--nproc-per-node", "2"))
    assert_ran(proc, "collective captured into a CUDA graph", "replays include the all-reduce",
               "collective after the replays")
    slices = _slices(trace)
    for pid in (1, 2):  # ranks 0 and 1
        mine = [s for s in slices if s["pid"] == pid]
        nccl = [s for s in mine if s["name"].startswith("ncclDevKernel_AllReduce")]
        replayed = [s for s in nccl if CAPTURED_SITE in s["args"]["call site"]]
        # one all-reduce per replay, none at the capture; the eager ones before and after stay
        assert len(replayed) == COLLECTIVE_REPLAYS and len(nccl) == COLLECTIVE_REPLAYS + 2, nccl
        # on the group's communication stream, as the eager all-reduces
        assert {s["tid"] for s in nccl} == {nccl[0]["tid"]}
        # the eager ones took sequence numbers 0 and 6, the replays 1..5 in order: the same on both ranks
        assert [s["args"]["seq"] for s in sorted(nccl, key=lambda s: s["ts"])] == list(range(COLLECTIVE_REPLAYS + 2))
        captured = [s for s in mine if s["name"] == "nccl:all_reduce" and "captured into CUDA graph" in s["args"]]
        assert len(captured) == 1, captured
        graph = captured[0]["args"]["captured into CUDA graph"]
        kernels = [s for s in mine if s["cat"] == "kernel" and s["args"].get("graph") == graph]
        for r, ar in enumerate(sorted(replayed, key=lambda s: s["ts"])):
            assert ar["args"]["call site"].endswith(f"(replay {r} of CUDA graph {graph})")
            matmul, scale = sorted((k for k in kernels if k["args"]["graph replay"] == r), key=lambda k: k["ts"])
            # after the replay's matmul, whose output it reduces; the multiply waits for it
            assert matmul["ts"] + matmul["dur"] <= ar["ts"] + 1e-3
            assert ar["ts"] + ar["dur"] <= scale["ts"] + 1e-3
            assert matmul["tid"] == scale["tid"] != ar["tid"]


def test_mismatched_replays_of_a_collective_fail_on_every_rank(tmp_path: Path) -> None:
    """Rank 1 replays once less: rank 0's last replayed all-reduce meets rank 1's next eager one."""
    proc, _ = run_traced(tmp_path, sys.executable, "cuda_graphs_collective.py", "mismatch",
                         options=("--nproc-per-node", "2"), timeout=300)
    assert proc.returncode != 0
    out = proc.stdout + proc.stderr
    assert "mismatched collective" in out and "mismatched replays must fail" not in out, out[-4000:]
    assert "(replay 4 of CUDA graph 2)" in out and "all_reduce(4,096 bytes" in out, out[-4000:]
    assert "exited with code 1 (the first rank to fail: the root cause)" in out, out[-4000:]
