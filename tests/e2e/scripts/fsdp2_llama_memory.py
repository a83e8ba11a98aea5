"""FSDP2 Llama-style training step; prints the caching allocator's peak (plain torch, runs on GPUs).

    torchrun --nproc-per-node 1 tests/e2e/scripts/fsdp2_llama_memory.py
    phantora trace --gpu h200 -o run.json -- python tests/e2e/scripts/fsdp2_llama_memory.py
    phantora trace --gpu h200 -o run.json -- python tests/e2e/scripts/fsdp2_llama_memory.py --norm torch --time --steps 6

Every block and the root are `fully_shard` units, MixedPrecisionPolicy(bf16 params, fp32
reduce), AdamW foreach. Defaults: the 0.54B model of issue 18 (8 layers, dim 2048, 16 heads,
SwiGLU 5632, vocab 32000, batch 2 x 2048). --time synchronizes after each step and prints its
time, then the mean over the steps after the first two (issue 27's hidden program, with
nn.RMSNorm, ran at 44.34 ms per step on a real H200).
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard


class RMSNorm(nn.Module):
    """RMSNorm written out in fp32, as many Llama ports do (--norm torch: torch.nn.RMSNorm)."""

    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x) * self.weight


NORM = "manual"


def make_norm(dim: int) -> nn.Module:
    return nn.RMSNorm(dim, eps=1e-5) if NORM == "torch" else RMSNorm(dim)


class Block(nn.Module):
    def __init__(self, dim: int, heads: int, kv_heads: int, ffn: int) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.hd = heads, kv_heads, dim // heads
        self.attn_norm = make_norm(dim)
        self.wq = nn.Linear(dim, dim, bias=False)
        self.wk = nn.Linear(dim, kv_heads * self.hd, bias=False)
        self.wv = nn.Linear(dim, kv_heads * self.hd, bias=False)
        self.wo = nn.Linear(dim, dim, bias=False)
        self.ffn_norm = make_norm(dim)
        self.w1 = nn.Linear(dim, ffn, bias=False)
        self.w3 = nn.Linear(dim, ffn, bias=False)
        self.w2 = nn.Linear(ffn, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        h = self.attn_norm(x)
        q = self.wq(h).view(b, t, self.heads, self.hd).transpose(1, 2)
        k = self.wk(h).view(b, t, self.kv_heads, self.hd).transpose(1, 2)
        v = self.wv(h).view(b, t, self.kv_heads, self.hd).transpose(1, 2)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=self.kv_heads != self.heads)
        x = x + self.wo(a.transpose(1, 2).reshape(b, t, -1))
        h = self.ffn_norm(x)
        return x + self.w2(F.silu(self.w1(h)) * self.w3(h))


class Llama(nn.Module):
    def __init__(self, layers: int, dim: int, heads: int, kv_heads: int, ffn: int, vocab: int) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList(Block(dim, heads, kv_heads, ffn) for _ in range(layers))
        self.norm = make_norm(dim)
        self.out = nn.Linear(dim, vocab, bias=False)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx)
        for layer in self.layers:
            x = layer(x)
        logits = self.out(self.norm(x))
        return F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.view(-1))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--dim", type=int, default=2048)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--kv-heads", type=int, default=0, help="0: as many as --heads")
    ap.add_argument("--ffn", type=int, default=5632)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--norm", choices=["manual", "torch"], default="manual")
    ap.add_argument("--time", action="store_true", help="synchronize after each step and print its time")
    args = ap.parse_args()
    global NORM
    NORM = args.norm

    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group("nccl")
    rank = dist.get_rank()
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = Llama(args.layers, args.dim, args.heads, args.kv_heads or args.heads, args.ffn, args.vocab)
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for layer in model.layers:
        fully_shard(layer, mp_policy=mp)
    fully_shard(model, mp_policy=mp)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, foreach=True)
    n = sum(p.numel() for p in model.parameters())
    if rank == 0:
        print(f"params {n} after init: allocated {torch.cuda.memory_allocated()}")
    times = []
    for step in range(args.steps):
        if args.time:
            torch.cuda.synchronize()
            t0 = time.perf_counter()
        x = torch.randint(args.vocab, (args.batch, args.seq), device="cuda")
        y = torch.randint(args.vocab, (args.batch, args.seq), device="cuda")
        loss = model(x, y)
        if rank == 0:
            print(f"step {step} after forward: allocated {torch.cuda.memory_allocated()} "
                  f"peak {torch.cuda.max_memory_allocated()}")
        loss.backward()
        if rank == 0:
            print(f"step {step} after backward: allocated {torch.cuda.memory_allocated()} "
                  f"peak {torch.cuda.max_memory_allocated()}")
        opt.step()
        opt.zero_grad(set_to_none=True)
        if args.time:
            torch.cuda.synchronize()
            times.append((time.perf_counter() - t0) * 1e3)
            if rank == 0:
                print(f"step {step} time {times[-1]:.3f} ms")
        if rank == 0:
            print(f"step {step} after step: allocated {torch.cuda.memory_allocated()} "
                  f"peak {torch.cuda.max_memory_allocated()}")
    torch.cuda.synchronize()
    if rank == 0:
        print(f"peak memory allocated: {torch.cuda.max_memory_allocated()}")
        if len(times) > 2:
            print(f"mean step time (steps 2-{len(times) - 1}): {sum(times[2:]) / len(times[2:]):.3f} ms")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
