"""A framework that replaces torch.storage._load_from_bytes (Megatron-Core does: with a torch.load),
here made slow: 200,000 loop iterations a call. The program spins as long itself once (its own
Python, counted), then all-reduces a small integer tensor, whose values phantora carries from rank
to rank through the c10d store, pickled: unpickling them is phantora's work, not the program's
(tests/e2e/test_host_time.py)."""
import os
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from spin_loop import spin  # noqa: E402

N = 200_000
calls = 0
original = torch.storage._load_from_bytes


def slow_load_from_bytes(b):
    global calls
    calls += 1
    spin(N)
    return original(b)


torch.storage._load_from_bytes = slow_load_from_bytes
dist.init_process_group("nccl")
rank = dist.get_rank()
torch.cuda.set_device(rank)
x = torch.tensor([rank + 1], device="cuda")
dist.all_reduce(torch.zeros(1, device="cuda"))  # NCCL's set-up, a start-up cost, out of the way
torch.cuda.synchronize()
calls = 0
t0 = time.perf_counter()
spin(N)
t1 = time.perf_counter()
dist.all_reduce(x)
value = x.item()
t2 = time.perf_counter()
assert value == 3, value
sys.stdout.write(f"rank {rank}: spin {1e3 * (t1 - t0):.3f} ms, all_reduce and read {1e3 * (t2 - t1):.3f} ms, "
                 f"{calls} unpickled storages\n")  # one write: the ranks share the pipe
sys.stdout.flush()
dist.destroy_process_group()
