"""DTensor's random ops on virtual GPUs (issue 14, cause 2): OffsetBasedRNGTracker reads the CUDA
generator state, rewrites its offset per shard and writes it back (torch/distributed/tensor/_random.py).

Run with 2 ranks. Plain torch only; each check prints `ok <name>`.
"""

import os

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard, distribute_tensor
from torch.distributed.tensor import _random as dtensor_random


def seed_and_offset(device):
    seed, offset = torch.cuda.get_rng_state(device).view(torch.int64).tolist()
    return seed, offset


rank = int(os.environ["RANK"])
torch.cuda.set_device(rank)
dist.init_process_group("nccl")
mesh = init_device_mesh("cuda", (2,))

assert dtensor_random.is_rng_supported_mesh(mesh)

# DTensor's random factories run the tracker under the program's dispatch modes. The first one
# creates the OffsetBasedRNGTracker, which broadcasts rank 0's state (moved to the GPU) and
# sets it on every rank (moved back to the host). Rank r draws its [4, 16] shard from offset
# 64 * r; afterwards every rank's offset is the whole tensor's numel: 8 * 16 = 128.
torch.manual_seed(55 + rank)  # different seeds: the tracker's state sync makes them rank 0's
t = torch.distributed.tensor.randn(8, 16, device_mesh=mesh, placements=[Shard(0)])
assert t.to_local().shape == (4, 16)
assert seed_and_offset(rank) == (55, 128), seed_and_offset(rank)
torch.distributed.tensor.rand(8, 16, device_mesh=mesh, placements=[Shard(0)])
assert seed_and_offset(rank) == (55, 256), seed_and_offset(rank)
print("ok dtensor_random_factories")

dtensor_random.manual_seed(1234, mesh)  # = torch.manual_seed on every rank, no state broadcast
assert seed_and_offset(rank) == (1234, 0), seed_and_offset(rank)
print("ok dtensor_manual_seed")

# A [8, 16] DTensor sharded over 2 ranks: each rank draws from its own slice of the Philox
# stream (rank r from offset 64 * r) and afterwards every rank's offset is the whole tensor's
# numel (128): _set_pre_op_offset / _set_post_op_offset.
dt = distribute_tensor(torch.empty(8, 16, device="cuda"), mesh, [Shard(0)])
# PHANTORA-CUDAKEY: the tracker moves the state to cuda (`.to(device)`) with the dispatch modes
# off (DTensor's own dispatch); without a CUDA-key fallback for that copy this line raises
# "Could not run 'aten::...' with arguments from the 'CUDA' backend" (helper cudakey's fix).
torch.nn.init.normal_(dt)
assert seed_and_offset(rank) == (1234, 128), seed_and_offset(rank)
dt.uniform_()
assert seed_and_offset(rank) == (1234, 256), seed_and_offset(rank)
print("ok dtensor_random_op_offsets")

dist.destroy_process_group()
