"""Fully sharded data-parallel GPT training with FSDP2 (`fully_shard`), the model of gpt_train.py.

Plain PyTorch, launched like any torchrun job; runs unchanged on real GPUs:
    torchrun --nproc-per-node 8 examples/fsdp_train.py
    phantora trace --nproc-per-node 8 -o run.json -- python examples/fsdp_train.py

Each transformer block is its own FSDP unit (parameters all-gathered before its forward and
backward, gradients reduce-scattered after its backward), then the root module. Mixed
precision: bf16 parameters for compute, fp32 gradient reduction (MixedPrecisionPolicy).
--no-reshard keeps the last blocks' gathered parameters between forward and backward
(reshard_after_forward=False); --checkpoint wraps each block in activation checkpointing.
Rank 0 prints step time, tokens/s across all ranks and peak memory.
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from gpt_train import GPT, GPTConfig


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=8, help="sequences per rank")
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--embd", type=int, default=768)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--no-reshard", action="store_true", help="reshard_after_forward=False for every block")
    ap.add_argument("--checkpoint", action="store_true", help="activation checkpointing of each block")
    ap.add_argument("--compile", action="store_true", help="torch.compile each block (as TorchTitan does)")
    args = ap.parse_args()

    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)

    cfg = GPTConfig(block_size=args.seq, n_layer=args.layers, n_head=args.heads, n_embd=args.embd)
    with torch.device("cuda"):
        model = GPT(cfg, activation_checkpointing=args.checkpoint)
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for i, block in enumerate(model.blocks):
        if args.compile:
            block = model.blocks[i] = torch.compile(block, fullgraph=True)
        fully_shard(block, mp_policy=mp, reshard_after_forward=not args.no_reshard)
    fully_shard(model, mp_policy=mp)
    optimizer = torch.optim.AdamW(model.parameters(), lr=6e-4, weight_decay=0.1, fused=True)
    if rank == 0:
        n = sum(p.numel() for p in model.parameters())
        print(f"FSDP2 GPT: {n / 1e6:.1f}M parameters, {world} ranks, batch {args.batch} x {args.seq} per rank, "
              f"reshard_after_forward={not args.no_reshard}, checkpointing={args.checkpoint}, "
              f"on {torch.cuda.get_device_name()}")

    step_times = []
    for step in range(args.steps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        x = torch.randint(cfg.vocab_size, (args.batch, args.seq), device="cuda")
        y = torch.randint(cfg.vocab_size, (args.batch, args.seq), device="cuda")
        loss = model(x, y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        step_times.append(dt)
        if rank == 0:
            print(f"step {step}: time {dt * 1000:.2f} ms, {args.batch * args.seq * world / dt:,.0f} tokens/s")
    if rank == 0:
        steady = step_times[1:] or step_times
        print(f"mean step time (after the first): {sum(steady) / len(steady) * 1000:.2f} ms")
        print(f"peak memory allocated: {torch.cuda.max_memory_allocated() / 2**30:.3f} GiB")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
