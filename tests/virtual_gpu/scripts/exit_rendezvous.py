"""Rank 0 hosts the c10d store (init_process_group with an explicit rank, as Lightning's launcher
and mp.spawn do) and leaves first; rank 1 reads a value another rank sent it only afterwards.
On a real GPU the all-reduced tensor is simply there; under phantora the value travels through
the store, so rank 0 must not take the store away before rank 1 has read it.

Real-time waits (threading.Event.wait stays on the real clock) order the two ranks: rank 1
posts its contribution first (rank 0's is not there yet, so the read is deferred to first use),
rank 0 posts 1 s later and exits at once, rank 1 reads 3 s later."""
import os
import threading

import torch
import torch.distributed as dist

rank = int(os.environ["RANK"])
dist.init_process_group("nccl")
torch.cuda.set_device(rank)
t = torch.full((4,), rank + 1, dtype=torch.int64, device="cuda")
if rank == 0:
    threading.Event().wait(1.0)
dist.all_reduce(t)
if rank == 0:
    dist.destroy_process_group()
    print("ok rank 0 left", flush=True)
else:
    threading.Event().wait(3.0)
    got = t.tolist()
    assert got == [3, 3, 3, 3], got
    print("ok rank 1 read after rank 0 left", flush=True)
    dist.destroy_process_group()
