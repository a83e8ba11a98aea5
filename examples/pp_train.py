"""Pipeline-parallel transformer training with torch.distributed.pipelining.

Plain PyTorch, launched like any torchrun job; runs unchanged on real GPUs:
    torchrun --nproc-per-node 4 examples/pp_train.py --schedule 1f1b
    phantora trace --nproc-per-node 4 -o run.json -- python examples/pp_train.py --schedule interleaved

The transformer of tp_fsdp_train.py is cut into contiguous stages of layers, the embedding on
the first and the norm, LM head and loss on the last. --schedule picks GPipe, 1F1B or
interleaved 1F1B (two stages per rank, looped: rank r holds stages r and r + world). Stages
learn activation shapes from each other at the first step (send/recv_object_list). The batch
is split into --microbatches. Rank 0 prints step time, tokens/s and peak memory; the last
rank prints the loss.
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B

from tp_fsdp_train import Block, Config


class StageModule(nn.Module):
    """Layers [first, last) of the transformer; the embedding on stage 0, the head on the last."""

    def __init__(self, cfg: Config, first: int, last: int, is_first: bool, is_last: bool) -> None:
        super().__init__()
        self.tok_embeddings = nn.Embedding(cfg.vocab_size, cfg.n_embd) if is_first else None
        self.layers = nn.ModuleDict({str(i): Block(cfg) for i in range(first, last)})
        self.norm = nn.LayerNorm(cfg.n_embd) if is_last else None
        self.output = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False) if is_last else None

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        if self.tok_embeddings is not None:
            h = self.tok_embeddings(h)
        for layer in self.layers.values():
            h = layer(h)
        if self.output is not None:
            h = self.output(self.norm(h)).float()
        return h


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--schedule", choices=("gpipe", "1f1b", "interleaved"), default="1f1b")
    ap.add_argument("--microbatches", type=int, default=8)
    ap.add_argument("--batch", type=int, default=16, help="sequences per step (split into micro-batches)")
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--embd", type=int, default=1024)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--steps", type=int, default=4)
    args = ap.parse_args()

    local_rank = int(os.environ["LOCAL_RANK"])
    device = torch.device("cuda", local_rank)
    torch.cuda.set_device(device)
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    per_rank = 2 if args.schedule == "interleaved" else 1
    n_stages = world * per_rank
    if args.layers % n_stages:
        raise SystemExit(f"--layers {args.layers} must be a multiple of the stage count ({n_stages})")
    torch.manual_seed(0)

    cfg = Config(seq=args.seq, n_layer=args.layers, n_head=args.heads, n_embd=args.embd)
    per_stage = args.layers // n_stages
    stages = []
    for stage_index in range(rank, n_stages, world):  # looped placement: rank r holds r, r + world, ...
        with torch.device(device):
            module = StageModule(cfg, stage_index * per_stage, (stage_index + 1) * per_stage,
                                 stage_index == 0, stage_index == n_stages - 1)
        module.to(torch.bfloat16)
        stages.append(PipelineStage(module, stage_index, n_stages, device))
    if args.schedule == "interleaved":
        schedule = ScheduleInterleaved1F1B(stages, n_microbatches=args.microbatches, loss_fn=cross_entropy)
    else:
        kind = ScheduleGPipe if args.schedule == "gpipe" else Schedule1F1B
        schedule = kind(stages[0], n_microbatches=args.microbatches, loss_fn=cross_entropy)
    params = [p for s in stages for p in s.submod.parameters()]
    optimizer = torch.optim.AdamW(params, lr=3e-4, weight_decay=0.1, fused=True)
    holds_first = any(s.is_first for s in stages)
    holds_last = any(s.is_last for s in stages)
    if rank == 0:
        n = sum(p.numel() for p in params)
        print(f"pipeline ({args.schedule}): {n_stages} stages of {per_stage} layers on {world} ranks, "
              f"{n / 1e6:.1f}M parameters on rank 0, batch {args.batch} x {args.seq} in {args.microbatches} "
              f"micro-batches, on {torch.cuda.get_device_name()}")

    step_times = []
    for step in range(args.steps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        x = torch.randint(cfg.vocab_size, (args.batch, args.seq), device=device)
        y = torch.randint(cfg.vocab_size, (args.batch, args.seq), device=device)
        losses: list[torch.Tensor] = []
        inputs = (x,) if holds_first else ()
        if holds_last:
            schedule.step(*inputs, target=y, losses=losses)
        else:
            schedule.step(*inputs)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        step_times.append(dt)
        if rank == 0:
            print(f"step {step}: time {dt * 1000:.2f} ms, {args.batch * args.seq / dt:,.0f} tokens/s")
        if holds_last and losses:
            print(f"rank {rank}: step {step} loss {torch.stack(losses).mean().item():.3f}")
    if rank == 0:
        steady = step_times[1:] or step_times
        print(f"mean step time (after the first): {sum(steady) / len(steady) * 1000:.2f} ms")
        print(f"peak memory allocated: {torch.cuda.max_memory_allocated() / 2**30:.3f} GiB")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
