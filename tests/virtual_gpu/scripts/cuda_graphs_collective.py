"""NCCL collectives captured in a CUDA graph are replayed with it, as on a GPU: each replay runs
the all-reduce again on the same communicator, matched with the other rank's replay, between the
replayed compute before and after it. Eager collectives after the replays still match.

`python cuda_graphs_collective.py mismatch`: rank 1 replays the graph once less than rank 0, so
rank 0's last replayed all-reduce meets rank 1's next eager collective (a different size): on a
GPU that hangs or corrupts data; here both ranks fail with a message naming both calls.
"""

import sys
import time

import torch
import torch.distributed as dist

REPLAYS = 5
N = 4096  # y = x @ w is N x N fp32: a 64 MiB all-reduce
NVLINK_BYTES_PER_S = 450e9  # one H100's NVLink bandwidth in one direction (900 GB/s both ways)

dist.init_process_group("nccl")
rank = dist.get_rank()
torch.cuda.set_device(rank)
mismatch = sys.argv[1:] == ["mismatch"]

x = torch.randn(N, N, device="cuda")
w = torch.randn(N, N, device="cuda")
dist.all_reduce(x)  # the communicator is set up eagerly, as NCCL needs before a capture
s = torch.cuda.Stream()
s.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(s):  # warm-up on a side stream, as torch's CUDA graph recipe does
    y = x @ w
    z = y * 2
torch.cuda.current_stream().wait_stream(s)

compute_only = torch.cuda.CUDAGraph()
with torch.cuda.graph(compute_only):
    y = x @ w
    z = y * 2

g = torch.cuda.CUDAGraph()
with torch.cuda.graph(g):
    y = x @ w
    dist.all_reduce(y)  # captured: runs at each replay
    z = y * 2
print("ok collective captured into a CUDA graph")


def replay(graph: torch.cuda.CUDAGraph, times: int) -> float:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(times):
        graph.replay()
    torch.cuda.synchronize()
    return time.perf_counter() - t0


if mismatch:
    replay(g, REPLAYS - rank)
    dist.all_reduce(torch.ones(1024, device="cuda"))
    torch.cuda.synchronize()
    raise AssertionError("mismatched replays must fail")

t_compute = replay(compute_only, REPLAYS)
t_comm = replay(g, REPLAYS)
# Each replay's all-reduce moves at least its 64 MiB over NVLink on each of the 2 GPUs (ring:
# half out and half back in each of two phases), after the matmul and before the multiply.
floor = REPLAYS * y.nbytes / NVLINK_BYTES_PER_S
assert t_comm - t_compute > floor, (t_comm, t_compute, floor)
print(f"ok replays include the all-reduce: {t_comm * 1e3:.3f} ms vs {t_compute * 1e3:.3f} ms without it "
      f"(at least {floor * 1e3:.3f} ms more)")

dist.all_reduce(x)  # eager collectives after the replays: the same sequence on both ranks
torch.cuda.synchronize()
print("ok collective after the replays")
dist.destroy_process_group()
