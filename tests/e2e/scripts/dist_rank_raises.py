"""Rank 1 raises before the all-reduce rank 0 waits in."""
import os

import torch
import torch.distributed as dist

torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
dist.init_process_group("nccl")
t = torch.ones(1000, device="cuda")
if dist.get_rank() == 1:
    raise ValueError("rank 1 failed on purpose")
dist.all_reduce(t)
torch.cuda.synchronize()  # a real job would hang here; phantora raises
print("unreachable: rank 0's all_reduce must fail")
