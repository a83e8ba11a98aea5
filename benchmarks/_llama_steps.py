"""A Llama-style decoder (RMSNorm, rotary embeddings, grouped-query attention through SDPA,
SwiGLU MLP, untied output head) trained on random tokens, eagerly or with torch.compile of each
block as TorchTitan does. Plain PyTorch (runs unchanged on a GPU); used by bench_compile.py.

    python benchmarks/_llama_steps.py [--compile] [--checkpoint] [--accum 2] [--layers 8] [--dim 2048] ...
Prints per-step times and `mean step time (after the first): X ms`.
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn as nn
import torch.utils.checkpoint
import torch.nn.functional as F


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x) * self.weight


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x1, x2 = x[..., ::2], x[..., 1::2]
    return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)


class Block(nn.Module):
    def __init__(self, dim: int, heads: int, kv_heads: int, hidden: int) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, dim // heads
        self.attn_norm, self.mlp_norm = RMSNorm(dim), RMSNorm(dim)
        self.wq = nn.Linear(dim, dim, bias=False)
        self.wk = nn.Linear(dim, kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(dim, kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(dim, dim, bias=False)
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        h = self.attn_norm(x)
        q = self.wq(h).view(B, T, self.heads, self.head_dim)
        k = self.wk(h).view(B, T, self.kv_heads, self.head_dim)
        v = self.wv(h).view(B, T, self.kv_heads, self.head_dim)
        q, k = rope(q, cos, sin), rope(k, cos, sin)
        y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True,
                                           enable_gqa=True)
        x = x + self.wo(y.transpose(1, 2).reshape(B, T, -1))
        h = self.mlp_norm(x)
        return x + self.w2(F.silu(self.w1(h)) * self.w3(h))


class Llama(nn.Module):
    def __init__(self, vocab: int, dim: int, layers: int, heads: int, kv_heads: int, hidden: int, seq: int) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList(Block(dim, heads, kv_heads, hidden) for _ in range(layers))
        self.norm = RMSNorm(dim)
        self.out = nn.Linear(dim, vocab, bias=False)
        head_dim = dim // heads
        freqs = 1.0 / (500000.0 ** (torch.arange(0, head_dim, 2).float() / head_dim))
        angles = torch.outer(torch.arange(seq).float(), freqs)
        self.register_buffer("cos", angles.cos()[None, :, None, :], persistent=False)
        self.register_buffer("sin", angles.sin()[None, :, None, :], persistent=False)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor, checkpoint: bool = False) -> torch.Tensor:
        x = self.tok(idx)
        for layer in self.layers:
            if checkpoint:
                x = torch.utils.checkpoint.checkpoint(layer, x, self.cos, self.sin, use_reentrant=False)
            else:
                x = layer(x, self.cos, self.sin)
        logits = self.out(self.norm(x))
        return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--dim", type=int, default=2048)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=5632)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--compile", action="store_true", help="torch.compile each block (TorchTitan's way)")
    ap.add_argument("--checkpoint", action="store_true",
                    help="recompute each block in backward (activation checkpointing)")
    ap.add_argument("--accum", type=int, default=1, help="micro-batches of --batch accumulated per optimizer step")
    args = ap.parse_args()

    torch.manual_seed(0)
    with torch.device("cuda"):
        model = Llama(args.vocab, args.dim, args.layers, args.heads, args.kv_heads, args.hidden, args.seq)
    model.to(torch.bfloat16)
    if args.compile:
        for i, layer in enumerate(model.layers):
            model.layers[i] = torch.compile(layer, fullgraph=True)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=True)
    n = sum(p.numel() for p in model.parameters())
    print(f"Llama-style: {n / 1e6:.0f}M parameters, batch {args.batch} x {args.seq}, compile={args.compile}, "
          f"checkpoint={args.checkpoint}, accum={args.accum}")
    times = []
    for step in range(args.steps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(args.accum):
            x = torch.randint(args.vocab, (args.batch, args.seq), device="cuda")
            loss = model(x, x, args.checkpoint)
            if args.accum > 1:
                loss = loss / args.accum
            loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        print(f"step {step}: time {times[-1] * 1000:.2f} ms")
    steady = times[1:] or times
    print(f"mean step time (after the first): {sum(steady) / len(steady) * 1000:.2f} ms")


if __name__ == "__main__":
    main()
