"""Tensors passed in an `out=` list (FSDP2's all-gather copy-out into temporaries for parameters
sharded on dim 1: fsdp::split_with_sizes_copy) are freed when the program drops them, and
repeated calls share one signature: tests/virtual_gpu/test_out_list_memory.py. Automatic garbage
collection is off, as TorchTitan turns it off: only references, not cycles, can keep memory."""
import gc

import torch
import torch.distributed.fsdp._fully_shard._fsdp_collectives  # noqa: F401  (registers fsdp::split_with_sizes_copy)

from interpose import runtime

gc.disable()
MiB = 1 << 20
N = 4 * MiB  # bf16 elements: 8 MiB per output


def split_into_temporaries(op) -> int:
    """MiB still allocated after the op's out= temporaries are dropped."""
    src = torch.empty(2, 2 * N, dtype=torch.bfloat16, device="cuda")
    before = torch.cuda.memory_allocated()
    temporaries = [torch.empty(2, N, dtype=torch.bfloat16, device="cuda") for _ in range(2)]
    op(src, [N, N], dim=1, out=[t.view(2, -1) for t in temporaries])
    del temporaries
    return (torch.cuda.memory_allocated() - before) // MiB


for name, op in (("aten", torch.split_with_sizes_copy), ("fsdp", torch.ops.fsdp.split_with_sizes_copy)):
    split_into_temporaries(op)  # its signature is new once
    signatures = len(runtime.get().sig_ids)
    left = [split_into_temporaries(op) for _ in range(3)]
    added = len(runtime.get().sig_ids) - signatures
    print(f"{name}: MiB left {left}, signatures added {added}")
    if left == [0, 0, 0] and added == 0:
        print(f"ok {name}")
