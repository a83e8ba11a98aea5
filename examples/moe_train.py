"""Train a Mixtral-style Mixture-of-Experts language model on random tokens (plain PyTorch).

Runs unchanged on real GPUs, and under phantora on virtual ones:
    python examples/moe_train.py
    torchrun --nproc-per-node 8 examples/moe_train.py --ep 8
    phantora trace -o run.json -- python examples/moe_train.py
    phantora trace --routing zipf:1.2 -o skew.json -- python examples/moe_train.py

Each block routes every token to its top-k experts (a softmax router). The experts run as
Mixtral's eager loop (`torch.where` per expert, `index_add_` back; what Hugging Face's "eager"
experts do) or, with --grouped, as one grouped GEMM over tokens sorted by expert
(`torch._grouped_mm`, offsets from a histogram of the routed ids). With --ep N the experts are
split over N ranks: tokens go to their experts' ranks and back with all_to_all of uneven sizes
(expert parallelism, as TorchTitan's and Megatron's dispatchers do); the other parameters are
replicated and their gradients all-reduced. Prints step time, tokens/s, MFU and peak memory.
"""

from __future__ import annotations

import argparse
import math
import os
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class MoEConfig:
    vocab: int = 32000
    dim: int = 1024
    layers: int = 4
    heads: int = 16
    experts: int = 8
    top_k: int = 2
    expert_hidden: int = 2816
    seq: int = 1024


class Attention(nn.Module):
    def __init__(self, cfg: MoEConfig) -> None:
        super().__init__()
        self.heads = cfg.heads
        self.qkv = nn.Linear(cfg.dim, 3 * cfg.dim, bias=False)
        self.out = nn.Linear(cfg.dim, cfg.dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in self.qkv(x).split(d, dim=-1))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(y.transpose(1, 2).reshape(b, t, d))


class Experts(nn.Module):
    """This rank's experts (all of them without expert parallelism): SwiGLU weights stacked."""

    def __init__(self, n: int, dim: int, hidden: int) -> None:
        super().__init__()
        self.w_gate_up = nn.Parameter(torch.randn(n, dim, 2 * hidden) * dim ** -0.5)
        self.w_down = nn.Parameter(torch.randn(n, hidden, dim) * hidden ** -0.5)

    def loop(self, x: torch.Tensor, expert_of_row: torch.Tensor) -> torch.Tensor:
        """Mixtral's eager loop: each expert takes the rows routed to it."""
        out = torch.zeros_like(x)
        for e in range(self.w_gate_up.shape[0]):
            (rows,) = torch.where(expert_of_row == e)
            gate, up = (x[rows] @ self.w_gate_up[e]).chunk(2, dim=-1)
            out.index_add_(0, rows, (F.silu(gate) * up) @ self.w_down[e])
        return out

    def grouped(self, x: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """Rows sorted by expert, one grouped GEMM per projection (offsets: where each ends)."""
        offsets = torch.cumsum(counts, dim=0, dtype=torch.int32)
        gate, up = torch._grouped_mm(x, self.w_gate_up, offs=offsets).chunk(2, dim=-1)
        return torch._grouped_mm(F.silu(gate) * up, self.w_down, offs=offsets)


class MoE(nn.Module):
    def __init__(self, cfg: MoEConfig, ep: int, grouped: bool) -> None:
        super().__init__()
        self.cfg, self.ep, self.grouped = cfg, ep, grouped
        self.router = nn.Linear(cfg.dim, cfg.experts, bias=False)
        self.experts = Experts(cfg.experts // ep, cfg.dim, cfg.expert_hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        x = x.reshape(-1, d)
        probs = F.softmax(self.router(x), dim=-1, dtype=torch.float)
        weights, chosen = torch.topk(probs, self.cfg.top_k, dim=-1)  # [tokens, k]
        weights = (weights / weights.sum(-1, keepdim=True)).to(x.dtype)
        # one row per (token, choice), sorted by expert
        order = torch.argsort(chosen.view(-1), stable=True)
        expert_of_row = chosen.view(-1)[order]
        rows = x[order // self.cfg.top_k]
        counts = torch.bincount(expert_of_row, minlength=self.cfg.experts)
        if self.ep > 1:
            rows, expert_of_row, counts, splits = self._dispatch(rows, expert_of_row, counts)
        y = self.experts.grouped(rows, counts) if self.grouped else self.experts.loop(rows, expert_of_row)
        if self.ep > 1:
            y = _all_to_all(y, splits[1], splits[0])  # back to the ranks the tokens came from
        out = torch.zeros_like(x).index_add_(0, order // self.cfg.top_k, y * weights.view(-1, 1)[order])
        return out.view(b, t, d)

    def _dispatch(self, rows: torch.Tensor, expert_of_row: torch.Tensor, counts: torch.Tensor):
        """Send each row to the rank holding its expert; receive this rank's experts' rows."""
        local = self.cfg.experts // self.ep
        received = torch.empty_like(counts)
        dist.all_to_all_single(received, counts)  # [ep, local]: what each rank sends to each of my experts
        send = counts.view(self.ep, local).sum(1).tolist()
        recv = received.view(self.ep, local).sum(1).tolist()
        rows = _all_to_all(rows, send, recv)
        ids = _all_to_all(expert_of_row, send, recv) % local
        # rows arrive grouped by source rank; regroup them by local expert
        by_expert = torch.argsort(ids, stable=True)
        per_expert = received.view(self.ep, local).sum(0)
        return rows[by_expert], ids[by_expert], per_expert, (send, recv)


def _exchange(x: torch.Tensor, send: list[int], recv: list[int]) -> torch.Tensor:
    """Rows of x to the ranks in `send` sizes; rows from them in `recv` sizes."""
    out = x.new_empty((sum(recv), *x.shape[1:]))
    dist.all_to_all_single(out, x.contiguous(), recv, send)
    return out


class _AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, send: list[int], recv: list[int]) -> torch.Tensor:  # type: ignore[override]
        ctx.splits = (send, recv)
        return _exchange(x, send, recv)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # type: ignore[override]
        send, recv = ctx.splits
        return _AllToAll.apply(grad, recv, send), None, None


def _all_to_all(x: torch.Tensor, send: list[int], recv: list[int]) -> torch.Tensor:
    return _AllToAll.apply(x, send, recv) if x.is_floating_point() else _exchange(x, send, recv)


class Block(nn.Module):
    def __init__(self, cfg: MoEConfig, ep: int, grouped: bool) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.RMSNorm(cfg.dim), nn.RMSNorm(cfg.dim)
        self.attn = Attention(cfg)
        self.moe = MoE(cfg, ep, grouped)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.moe(self.norm2(x))


class MoELM(nn.Module):
    def __init__(self, cfg: MoEConfig, ep: int = 1, grouped: bool = False) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab, cfg.dim)
        self.blocks = nn.ModuleList(Block(cfg, ep, grouped) for _ in range(cfg.layers))
        self.norm = nn.RMSNorm(cfg.dim)
        self.head = nn.Linear(cfg.dim, cfg.vocab, bias=False)

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.norm(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)).float(), targets.reshape(-1))

    def flops_per_token(self) -> float:
        """Training FLOPs per token: 6 x the parameters a token uses (attention and head, the
        router, top-k experts) + causal attention scores, as PaLM appendix B counts a dense model."""
        c = self.cfg
        active = c.layers * (4 * c.dim * c.dim + c.dim * c.experts + c.top_k * 3 * c.dim * c.expert_hidden)
        active += c.dim * c.vocab
        return 6 * active + 6 * c.layers * c.dim * c.seq


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--dim", type=int, default=1024)
    ap.add_argument("--experts", type=int, default=8)
    ap.add_argument("--top-k", type=int, default=2)
    ap.add_argument("--expert-hidden", type=int, default=2816)
    ap.add_argument("--grouped", action="store_true", help="experts as grouped GEMMs instead of Mixtral's loop")
    ap.add_argument("--ep", type=int, default=1, help="expert parallel: experts split over this many ranks (torchrun)")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--peak-tflops", type=float, default=989.4, help="GPU bf16 peak for MFU (H100 SXM)")
    args = ap.parse_args()

    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:
        dist.init_process_group("nccl")
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    if args.ep != world or args.experts % args.ep:
        raise SystemExit(f"--ep {args.ep} must equal the number of ranks ({world}) and divide --experts {args.experts}")
    rank = dist.get_rank() if world > 1 else 0
    torch.manual_seed(0)
    cfg = MoEConfig(dim=args.dim, layers=args.layers, heads=args.dim // 64, experts=args.experts, top_k=args.top_k,
                    expert_hidden=args.expert_hidden, seq=args.seq)
    model = MoELM(cfg, args.ep, args.grouped).cuda().to(torch.bfloat16)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=True)
    shared = [p for n, p in model.named_parameters() if ".experts." not in n]  # replicated: gradients all-reduced
    n_params = sum(p.numel() for p in model.parameters())
    if rank == 0:
        print(f"MoE: {n_params / 1e6:.1f}M parameters on this rank, {args.experts} experts top-{args.top_k}, "
              f"{'grouped GEMM' if args.grouped else 'eager loop'}, EP {args.ep}, batch {args.batch} x {args.seq}, "
              f"on {torch.cuda.get_device_name()}", flush=True)

    tokens_per_step = args.batch * args.seq
    times = []
    for step in range(args.steps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        data = torch.randint(cfg.vocab, (args.batch, args.seq + 1), device="cuda")
        loss = model(data[:, :-1], data[:, 1:])
        loss.backward()
        if world > 1:
            for p in shared:
                dist.all_reduce(p.grad, op=dist.ReduceOp.AVG)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        loss_value = loss.item()
        dt = time.perf_counter() - t0
        times.append(dt)
        if rank == 0:
            mfu = model.flops_per_token() * tokens_per_step / dt / (args.peak_tflops * 1e12)
            print(f"step {step}: loss {loss_value:.4f}, time {dt * 1000:.2f} ms, {tokens_per_step / dt:,.0f} tokens/s "
                  f"per GPU, MFU {mfu * 100:.1f}%", flush=True)
    if rank == 0:
        steady = times[1:] or times
        print(f"mean step time (after the first): {sum(steady) / len(steady) * 1000:.2f} ms", flush=True)
        print(f"peak memory allocated: {torch.cuda.max_memory_allocated() / 2**30:.3f} GiB", flush=True)
    assert math.isfinite(loss_value)
    if world > 1:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
