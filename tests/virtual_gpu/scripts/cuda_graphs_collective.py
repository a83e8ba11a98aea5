"""A collective inside a CUDA graph capture: phantora refuses it at the call, naming the rank,
the collective, the graph and what to change; the process group works on afterwards."""

import torch
import torch.distributed as dist

dist.init_process_group("nccl")
rank = dist.get_rank()
torch.cuda.set_device(rank)
x = torch.ones(1024, device="cuda")
s = torch.cuda.Stream()
s.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(s):
    y = x * 2
torch.cuda.current_stream().wait_stream(s)

g = torch.cuda.CUDAGraph()
try:
    with torch.cuda.graph(g):
        y = x * 2
        dist.all_reduce(y)
except RuntimeError as e:
    msg = str(e)
    assert f"rank {rank}" in msg and "all_reduce" in msg and "capturing CUDA graph" in msg, msg
    assert "does not simulate NCCL collectives inside CUDA graphs" in msg, msg
    print("ok collective in a capture refused:", msg.splitlines()[0][:160])
else:
    raise AssertionError("a collective inside a capture must be refused")

dist.all_reduce(x)  # outside a capture it runs as usual
torch.cuda.synchronize()
print("ok collective after the refused capture")
dist.destroy_process_group()
