"""Values exchanged in groups that hold no representative (plain torch; runs on GPUs too).

4 ranks as a (dp 2, tp 2) layout: dp groups {0, 2}, {1, 3}; tp groups {0, 1}, {2, 3}. Each rank
all-reduces rank + 1 over its dp group, gathers its rank as an object over its tp group, and
broadcasts from its tp group's first rank; prints what it got.
"""

import os

import torch
import torch.distributed as dist

dist.init_process_group("nccl")
rank = dist.get_rank()
torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
dp = [dist.new_group([0, 2]), dist.new_group([1, 3])][rank % 2]
tp = [dist.new_group([0, 1]), dist.new_group([2, 3])][rank // 2]
x = torch.tensor([rank + 1], device="cuda")
dist.all_reduce(x, group=dp)
gathered = [None, None]
dist.all_gather_object(gathered, rank, group=tp)
flag = torch.tensor([rank], device="cuda")
dist.broadcast(flag, src=(rank // 2) * 2, group=tp)
print(f"rank {rank}: dp sum {int(x.item())} tp ranks {gathered} broadcast {int(flag.item())}", flush=True)
dist.destroy_process_group()
