"""Two ranks on virtual GPUs, two paths of issue 14 that need a process group.

Cause 9: DDP with find_unused_parameters=True (the HF Trainer's default for DDP). DDP's reducer
copies its used-parameter map through a pinned host buffer it allocates in C++ and asserts
`is_pinned()` on it (reducer.cpp); on a virtual GPU that memory must be pinned as it is on a real
one. One parameter is never used, so the unused-parameter path runs.

Cause 1: DTensor's random ops (every TorchTitan config initialises its weights this way). The
first one builds DTensor's OffsetBasedRNGTracker inside DTensor's __torch_dispatch__, where
phantora's dispatch modes are stashed: it copies the CUDA RNG state to the GPU, broadcasts it and
compares the ranks' states."""
import os

import torch
import torch.distributed as dist
from torch.distributed.tensor import Replicate, Shard, distribute_tensor, init_device_mesh
from torch.nn.parallel import DistributedDataParallel as DDP

local_rank = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(local_rank)
dist.init_process_group("nccl")
rank = dist.get_rank()


class TwoHeads(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = torch.nn.Linear(64, 64)
        self.used = torch.nn.Linear(64, 8)
        self.unused = torch.nn.Linear(64, 8)  # never called in forward

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.used(torch.relu(self.body(x)))


model = DDP(TwoHeads().cuda(), device_ids=[local_rank], find_unused_parameters=True)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(3):
    loss = model(torch.randn(16, 64, device="cuda")).square().mean()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
torch.cuda.synchronize()
print(f"ok rank{rank}_ddp_find_unused_parameters\n", end="", flush=True)  # one write: ranks share stdout

# Host memory C++ allocates as pinned is pinned; pageable host memory is not.
pinned = torch.empty(1024, dtype=torch.int32, pin_memory=True)
assert pinned.is_pinned(), "torch.empty(pin_memory=True) is not pinned"
assert pinned[512:].is_pinned(), "a view into pinned memory is not pinned"
assert not torch.empty(1024, dtype=torch.int32).is_pinned(), "pageable memory reads as pinned"
assert torch.zeros(8, dtype=torch.int32).pin_memory().is_pinned()
big = torch.randn(512, 512)  # a virtual host tensor (no data): pinned only once pinned
assert not big.is_pinned() and big.pin_memory().is_pinned()
print(f"ok rank{rank}_pinned_host_memory\n", end="", flush=True)

mesh = init_device_mesh("cuda", (dist.get_world_size(),))
w = distribute_tensor(torch.empty(64, 32, device="cuda"), mesh, [Shard(0)])
torch.nn.init.normal_(w, std=0.02)
torch.nn.init.uniform_(w)
assert w.shape == (64, 32) and w.to_local().shape == (32, 32) and w.to_local().device.type == "cuda"
b = torch.distributed.tensor.randn(16, 8, device_mesh=mesh, placements=[Replicate()])
assert b.shape == (16, 8)
print(f"ok rank{rank}_dtensor_random_init\n", end="", flush=True)
dist.destroy_process_group()
