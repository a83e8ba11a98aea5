"""Rank 0 leaves (destroy_process_group, then exit) while rank 1, seconds behind it in wall
time, has yet to read the value rank 0 sent through the job's store."""
import sys
from datetime import datetime

import torch
import torch.distributed as dist

dist.init_process_group("nccl")
rank = dist.get_rank()
torch.cuda.set_device(rank)
x = torch.tensor([float(rank + 1)], device="cuda")
work = dist.all_reduce(x, async_op=True)
if rank == 1:
    end = datetime.now().timestamp() + float(sys.argv[1])  # real seconds: phantora leaves datetime real
    while datetime.now().timestamp() < end:
        pass
    work.wait()
    print(f"rank 1 reads {x.item()}", flush=True)
dist.destroy_process_group()
print(f"rank {rank} left at {datetime.now().timestamp():.3f}", flush=True)
