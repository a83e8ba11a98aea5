"""Rank 0 all-reduces 1,000 floats, rank 1 4,000: a bug that hangs or corrupts a real job."""
import os

import torch
import torch.distributed as dist

torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
dist.init_process_group("nccl")
n = 1000 if dist.get_rank() == 0 else 4000
t = torch.ones(n, device="cuda")
dist.all_reduce(t)
torch.cuda.synchronize()  # where a real job would hang: the error surfaces here
print("unreachable: the mismatch must raise")
