"""FSDP2 (a 2-layer MLP whose 62 output rows shard unevenly over 4 ranks) and AdamW: two steps,
then the model and optimizer saved with torch.distributed.checkpoint to argv[1] and loaded back.
Plain torch; runs on GPUs too."""

import os
import sys

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

dist.init_process_group("nccl")
rank = dist.get_rank()
torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
mesh = init_device_mesh("cuda", (dist.get_world_size(),))
model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 62)).cuda()
for layer in (model[0], model[2], model):
    fully_shard(layer, mesh=mesh)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
for _ in range(2):
    model(torch.randn(8, 64, device="cuda")).sum().backward()
    optimizer.step()
    optimizer.zero_grad()
state = {"model": model.state_dict(), "optim": optimizer.state_dict()}
dcp.save(state, checkpoint_id=sys.argv[1])
print(f"rank {rank}: saved", flush=True)
dcp.load(state, checkpoint_id=sys.argv[1])
print(f"rank {rank}: loaded", flush=True)
dist.destroy_process_group()
