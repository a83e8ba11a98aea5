"""Rank 1 never joins the all-reduce: it blocks (in real time) instead."""
import os
import threading

import torch
import torch.distributed as dist

torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
dist.init_process_group("nccl")
t = torch.ones(1000, device="cuda")
if dist.get_rank() == 1:
    threading.Event().wait(120)  # threading keeps the real clock
else:
    dist.all_reduce(t)
    torch.cuda.synchronize()  # a real job would hang here; phantora raises
print("unreachable")
