"""Data-parallel GPT training with DistributedDataParallel (the model of gpt_train.py).

Plain PyTorch, launched like any torchrun job; runs unchanged on real GPUs:
    torchrun --nproc-per-node 8 examples/ddp_train.py
    phantora trace --nproc-per-node 8 -o run.json -- python examples/ddp_train.py
    phantora trace -o run.json -- torchrun --nproc-per-node 8 examples/ddp_train.py

bf16 autocast, fused AdamW, DDP gradient buckets overlapping the backward pass, optional
gradient accumulation with no_sync. Rank 0 prints step time, tokens/s across all ranks and
peak memory.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from gpt_train import GPT, GPTConfig


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=8, help="sequences per rank per micro-step")
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--embd", type=int, default=768)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--accum", type=int, default=1, help="micro-steps per optimizer step (no_sync on all but the last)")
    ap.add_argument("--bucket-mb", type=float, default=25.0, help="DDP bucket_cap_mb")
    args = ap.parse_args()

    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)

    cfg = GPTConfig(block_size=args.seq, n_layer=args.layers, n_head=args.heads, n_embd=args.embd)
    model = DDP(GPT(cfg).cuda(), device_ids=[local_rank], bucket_cap_mb=args.bucket_mb)
    optimizer = torch.optim.AdamW(model.parameters(), lr=6e-4, weight_decay=0.1, fused=True)
    if rank == 0:
        n = sum(p.numel() for p in model.parameters())
        print(f"DDP GPT: {n / 1e6:.1f}M parameters, {world} ranks, batch {args.batch} x {args.seq} per rank, "
              f"accumulation {args.accum}, on {torch.cuda.get_device_name()}")

    step_times = []
    for step in range(args.steps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for micro in range(args.accum):
            x = torch.randint(cfg.vocab_size, (args.batch, args.seq), device="cuda")
            y = torch.randint(cfg.vocab_size, (args.batch, args.seq), device="cuda")
            sync = contextlib.nullcontext() if micro == args.accum - 1 else model.no_sync()
            with sync:
                with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
                    loss = model(x, y) / args.accum
                loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        step_times.append(dt)
        if rank == 0:
            tokens = args.batch * args.seq * args.accum * world
            print(f"step {step}: time {dt * 1000:.2f} ms, {tokens / dt:,.0f} tokens/s")
    if rank == 0:
        steady = step_times[1:] or step_times
        print(f"mean step time (after the first): {sum(steady) / len(steady) * 1000:.2f} ms")
        print(f"peak memory allocated: {torch.cuda.max_memory_allocated() / 2**30:.3f} GiB")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
