"""CPU time of a block mask's evaluation: phantora's (interpose/ops/hops.py, _cpu_block_mask)
against torch's own create_block_mask on the CPU, for TorchTitan's packed-document mask
(and_masks(causal, document ids), 4 documents a sequence) at sequence 8,192, batch 1 and 8.
Both give the same BlockMask (tests/virtual_gpu/test_block_mask_cpu.py); each row is the best
of three calls, the two measured alternately.

    python benchmarks/bench_block_mask.py
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch
from torch.nn.attention.flex_attention import and_masks, create_block_mask

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from interpose.ops import hops  # noqa: E402

SEQ = 8192
LENGTHS = (3000, 2000, 1500, SEQ - 6500)


def document_mask(batch: int):
    positions = torch.cat([torch.arange(n) for n in LENGTHS]).repeat(batch, 1)
    ids = torch.cumsum((positions == 0).int(), dim=1) - 1

    def document(b, h, q_idx, kv_idx):
        return ids[b, q_idx] == ids[b, kv_idx]

    def causal(b, h, q_idx, kv_idx):
        return q_idx >= kv_idx

    return and_masks(causal, document)


def cpu_seconds(fn) -> float:
    start = time.process_time()
    fn()
    return time.process_time() - start


def main() -> None:
    print(f"{'batch':>5} {'cells':>14} {'phantora s':>11} {'torch s':>8} {'ratio':>6}")
    for batch in (1, 8):
        mask_mod = document_mask(batch)
        ours, theirs = [], []
        for _ in range(3):
            ours.append(cpu_seconds(lambda: hops._cpu_block_mask(mask_mod, batch, None, SEQ, SEQ, (), {})))
            theirs.append(cpu_seconds(lambda: create_block_mask(mask_mod, batch, None, SEQ, SEQ, "cpu")))
        print(f"{batch:>5} {batch * SEQ * SEQ:>14,} {min(ours):>11.3f} {min(theirs):>8.3f} "
              f"{min(theirs) / min(ours):>5.1f}x")


if __name__ == "__main__":
    main()
