"""A gloo group beside NCCL, as Megatron-Core's initialize_model_parallel makes one per data
parallel group (its distributed optimizer needs them to exist; it uses them for checkpointing).
Under mirrored ranks its creation must not wait out gloo's 30-minute connect timeout.
`--all-reduce` also sums a CPU tensor over it."""

import os
import sys

import torch
import torch.distributed as dist

torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
dist.init_process_group("nccl")
group = dist.new_group(list(range(dist.get_world_size())), backend="gloo")
print(f"rank {dist.get_rank()}: gloo group created")
if "--all-reduce" in sys.argv:
    t = torch.ones(1)
    dist.all_reduce(t, group=group)
    print(f"rank {dist.get_rank()}: gloo sum {t.item():.0f}")
dist.destroy_process_group()
