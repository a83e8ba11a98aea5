"""A gloo group beside NCCL (as Megatron-Core's initialize_model_parallel makes one per data
parallel group for checkpointing): under mirrored ranks its creation must fail at once, saying
what to change, rather than wait out gloo's 30-minute connect timeout."""

import os

import torch
import torch.distributed as dist

torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
dist.init_process_group("nccl")
group = dist.new_group(list(range(dist.get_world_size())), backend="gloo")
t = torch.ones(1)
dist.all_reduce(t, group=group)
print(f"rank {dist.get_rank()}: gloo sum {t.item():.0f}")
dist.destroy_process_group()
