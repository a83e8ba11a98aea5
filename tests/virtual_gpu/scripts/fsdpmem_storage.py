"""Device memory that FSDP2 frees and reallocates without a new tensor: runs unchanged on a GPU.

    phantora trace -o run.json -- python tests/virtual_gpu/scripts/fsdpmem_storage.py

Checks torch.cuda.memory_allocated() against byte counts a real caching allocator gives (every
size here is a multiple of 2 MiB, so no rounding or block splitting enters):
  resize        UntypedStorage.resize_ frees (size 0) and reallocates a tensor's memory
  out_resize    an op's `out=` tensor of 0 elements grows to the result's size
  dtensor       a DTensor holds no memory beside its local tensor
  fully_shard   the original parameters are freed once fully_shard has copied them into shards
  fsdp_step     after a step only the fp32 shards and AdamW's two states remain (FSDP2 freed
                the bf16 unsharded parameters with resize_(0))
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor, Shard

MiB = 1 << 20
WORKSPACE = 32 * MiB  # cuBLAS workspace, allocated through the caching allocator at the first GEMM


def mem() -> int:
    return torch.cuda.memory_allocated()


def check_resize() -> None:
    t = torch.empty(MiB, device="cuda")  # 4 MiB
    base = mem()
    storage = t.untyped_storage()
    storage.resize_(0)
    assert mem() == base - 4 * MiB, (base, mem())
    storage.resize_(4 * MiB)
    assert mem() == base, (base, mem())
    storage.resize_(6 * MiB)
    assert mem() == base + 2 * MiB, (base, mem())
    del t, storage
    assert mem() == base - 4 * MiB, (base, mem())
    print("ok resize")


def check_out_resize() -> None:
    a = torch.ones(1024, 1024, device="cuda")
    base = mem()
    out = torch.empty(0, device="cuda")
    torch.mm(a, a, out=out)
    assert mem() == base + 4 * MiB + WORKSPACE, (base, mem())
    del out
    assert mem() == base + WORKSPACE, (base, mem())
    print("ok out_resize")


def check_dtensor() -> None:
    mesh = init_device_mesh("cuda", (1,))
    base = mem()
    local = torch.ones(1024, 1024, device="cuda")
    d = DTensor.from_local(local, mesh, [Shard(0)])
    assert mem() == base + 4 * MiB, (base, mem())
    d2 = d * 2
    assert mem() == base + 8 * MiB, (base, mem())
    del d2
    assert mem() == base + 4 * MiB, (base, mem())
    del d, local
    assert mem() == base, (base, mem())
    print("ok dtensor")


def check_fsdp() -> None:
    base = mem()
    with torch.device("cuda"):
        model = nn.Sequential(nn.Linear(1024, 1024, bias=False), nn.Linear(1024, 1024, bias=False))
    param_bytes = 2 * 1024 * 1024 * 4
    assert mem() == base + param_bytes, (base, mem())
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for layer in model:
        fully_shard(layer, mp_policy=mp)
    fully_shard(model, mp_policy=mp)
    assert mem() == base + param_bytes, (base, mem())
    print("ok fully_shard")
    opt = torch.optim.AdamW(model.parameters(), foreach=True)
    for _ in range(2):
        x = torch.randn(1024, 1024, device="cuda")
        model(x).float().sum().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        del x
    assert mem() == base + 3 * param_bytes, (base, mem(), base + 3 * param_bytes)
    print("ok fsdp_step")


def main() -> None:
    torch.cuda.set_device(0)
    dist.init_process_group("nccl")
    check_resize()
    check_out_resize()
    check_dtensor()
    check_fsdp()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
