"""2-D parallel transformer training: tensor parallel (DTensor) inside a node, FSDP2 across.

Plain PyTorch, launched like any torchrun job; runs unchanged on real GPUs:
    torchrun --nproc-per-node 8 examples/tp_fsdp_train.py --tp 4
    phantora trace --nproc-per-node 8 -o run.json -- python examples/tp_fsdp_train.py --tp 4

A device mesh of (dp, tp) = (world / tp, tp) from init_device_mesh. Each block follows the
Megatron / torchtitan plan: q, k, v and the first MLP projection ColwiseParallel, the output
projections RowwiseParallel, layer norms SequenceParallel (activations sharded along the
sequence between blocks). The embedding is RowwiseParallel and the LM head ColwiseParallel
with replicated logits. Then fully_shard over the dp dimension with bf16 parameters and fp32
gradient reduction. Rank 0 prints step time, tokens/s and peak memory.
"""

from __future__ import annotations

import argparse
import os
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)


@dataclass
class Config:
    vocab_size: int = 50304
    seq: int = 1024
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768


class Attention(nn.Module):
    def __init__(self, cfg: Config) -> None:
        super().__init__()
        self.head_dim = cfg.n_embd // cfg.n_head
        self.wq = nn.Linear(cfg.n_embd, cfg.n_embd, bias=False)
        self.wk = nn.Linear(cfg.n_embd, cfg.n_embd, bias=False)
        self.wv = nn.Linear(cfg.n_embd, cfg.n_embd, bias=False)
        self.wo = nn.Linear(cfg.n_embd, cfg.n_embd, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        # -1 heads: under tensor parallelism each rank holds n_head / tp of them
        q = self.wq(x).view(B, T, -1, self.head_dim).transpose(1, 2)
        k = self.wk(x).view(B, T, -1, self.head_dim).transpose(1, 2)
        v = self.wv(x).view(B, T, -1, self.head_dim).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(y.transpose(1, 2).reshape(B, T, -1))


class MLP(nn.Module):
    def __init__(self, cfg: Config) -> None:
        super().__init__()
        self.w1 = nn.Linear(cfg.n_embd, 4 * cfg.n_embd, bias=False)
        self.w2 = nn.Linear(4 * cfg.n_embd, cfg.n_embd, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.gelu(self.w1(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, cfg: Config) -> None:
        super().__init__()
        self.attention_norm = nn.LayerNorm(cfg.n_embd)
        self.attention = Attention(cfg)
        self.ffn_norm = nn.LayerNorm(cfg.n_embd)
        self.feed_forward = MLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x))
        return x + self.feed_forward(self.ffn_norm(x))


class Transformer(nn.Module):
    def __init__(self, cfg: Config) -> None:
        super().__init__()
        self.tok_embeddings = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.norm = nn.LayerNorm(cfg.n_embd)
        self.output = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        h = self.tok_embeddings(idx)  # no position embedding: attention alone orders tokens (NoPE)
        for layer in self.layers:
            h = layer(h)
        logits = self.output(self.norm(h))
        return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())


def apply_tensor_parallel(model: Transformer, tp_mesh) -> None:
    parallelize_module(model, tp_mesh, {
        "tok_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
        "norm": SequenceParallel(),
        "output": ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate()),
    })
    for block in model.layers:
        parallelize_module(block, tp_mesh, {
            "attention_norm": SequenceParallel(),
            "attention": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
            "attention.wq": ColwiseParallel(),
            "attention.wk": ColwiseParallel(),
            "attention.wv": ColwiseParallel(),
            "attention.wo": RowwiseParallel(output_layouts=Shard(1)),
            "ffn_norm": SequenceParallel(),
            "feed_forward": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
            "feed_forward.w1": ColwiseParallel(),
            "feed_forward.w2": RowwiseParallel(output_layouts=Shard(1)),
        })


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tp", type=int, default=2, help="tensor-parallel degree (divides the world size)")
    ap.add_argument("--batch", type=int, default=8, help="sequences per data-parallel rank")
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--embd", type=int, default=768)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--steps", type=int, default=4)
    args = ap.parse_args()

    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    world = int(os.environ["WORLD_SIZE"])
    if world % args.tp or args.heads % args.tp:
        raise SystemExit(f"--tp {args.tp} must divide the world size ({world}) and the head count ({args.heads})")
    mesh = init_device_mesh("cuda", (world // args.tp, args.tp), mesh_dim_names=("dp", "tp"))
    rank = dist.get_rank()
    torch.manual_seed(0)

    cfg = Config(seq=args.seq, n_layer=args.layers, n_head=args.heads, n_embd=args.embd)
    with torch.device("cuda"):
        model = Transformer(cfg)
    apply_tensor_parallel(model, mesh["tp"])
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for block in model.layers:
        fully_shard(block, mesh=mesh["dp"], mp_policy=mp)
    fully_shard(model, mesh=mesh["dp"], mp_policy=mp)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1, foreach=True)
    if rank == 0:
        n = sum(p.numel() for p in model.parameters())
        print(f"TP+FSDP2 transformer: {n / 1e6:.1f}M parameters, mesh dp={world // args.tp} x tp={args.tp}, "
              f"batch {args.batch} x {args.seq} per dp rank, on {torch.cuda.get_device_name()}")

    dp_rank = mesh["dp"].get_local_rank()
    step_times = []
    for step in range(args.steps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        # ranks of one tp group see the same batch
        g = torch.Generator().manual_seed(step * 1000 + dp_rank)
        x = torch.randint(cfg.vocab_size, (args.batch, args.seq), generator=g).cuda()
        y = torch.randint(cfg.vocab_size, (args.batch, args.seq), generator=g).cuda()
        loss = model(x, y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        step_times.append(dt)
        if rank == 0:
            tokens = args.batch * args.seq * (world // args.tp)
            print(f"step {step}: time {dt * 1000:.2f} ms, {tokens / dt:,.0f} tokens/s")
    if rank == 0:
        steady = step_times[1:] or step_times
        print(f"mean step time (after the first): {sum(steady) / len(steady) * 1000:.2f} ms")
        print(f"peak memory allocated: {torch.cuda.max_memory_allocated() / 2**30:.3f} GiB")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
