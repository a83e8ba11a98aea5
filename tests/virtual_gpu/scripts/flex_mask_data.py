"""create_block_mask on a virtual GPU with a mask_mod that reads a GPU tensor (document ids, as
TorchTitan's packed-document masks read them): the block counts phantora finds for it, and what a
call costs the program's host, eager and under torch.compile(create_block_mask) (TorchTitan's
form). Prints one JSON line; tests/virtual_gpu/test_hops.py compares it with the same mask on the
real CPU."""

import json
import sys
import time

import torch
from torch.nn.attention.flex_attention import create_block_mask

S = 2048  # 4M cells: past what the value policy follows through the GPU's ops, so phantora's CPU evaluation finds the blocks
LENGTHS = [int(n) for n in sys.argv[1].split(",")]
assert sum(LENGTHS) == S
with_data = torch.repeat_interleave(torch.arange(len(LENGTHS)), torch.tensor(LENGTHS)).to("cuda")  # copied: known values
without_data = torch.empty(S, dtype=torch.long, device="cuda")  # never written: no values to evaluate


def document(ids):
    def mask(b, h, q_idx, kv_idx):
        return (ids[q_idx] == ids[kv_idx]) & (q_idx >= kv_idx)

    return mask


def blocks_of_512(b, h, q_idx, kv_idx):  # reads no tensor: evaluated once on the CPU, then kept by phantora
    return (q_idx // 512 == kv_idx // 512) & (q_idx >= kv_idx)


compiled = torch.compile(create_block_mask)


def steady_call_ms(fn, ids):
    """Simulated ms of the third call (the first two warm up the kernels and the compile)."""
    for _ in range(3):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        mask = fn(document(ids) if ids is not None else blocks_of_512, None, None, S, S, device="cuda")
        torch.cuda.synchronize()
        ms = (time.perf_counter() - t0) * 1e3
    return ms, mask


eager_ms, eager_mask = steady_call_ms(create_block_mask, with_data)
compiled_ms, compiled_mask = steady_call_ms(compiled, with_data)
no_data_ms, _ = steady_call_ms(create_block_mask, without_data)
index_only_ms, _ = steady_call_ms(create_block_mask, None)
index_only_compiled_ms, _ = steady_call_ms(compiled, None)
print(json.dumps({"sparsity_eager": eager_mask.sparsity(), "sparsity_compiled": compiled_mask.sparsity(),
                  "eager_ms": eager_ms, "compiled_ms": compiled_ms, "no_data_ms": no_data_ms,
                  "index_only_ms": index_only_ms, "index_only_compiled_ms": index_only_compiled_ms}))
