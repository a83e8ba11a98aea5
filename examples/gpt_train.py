"""Train a GPT-2-style language model on random tokens (nanoGPT's model and loop, trimmed).

Plain PyTorch: runs unchanged on a real GPU, and under phantora on a virtual one:
    python examples/gpt_train.py
    phantora trace -o run.json -- python examples/gpt_train.py

bf16 autocast, fused AdamW, scaled_dot_product_attention, pinned non_blocking input copies,
optional activation checkpointing and torch.compile. Prints step time, tokens/s, MFU and peak memory.
"""

from __future__ import annotations

import argparse
import math
import time
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint


@dataclass
class GPTConfig:
    block_size: int = 1024
    vocab_size: int = 50304
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.n_head = cfg.n_head
        self.c_attn = nn.Linear(cfg.n_embd, 3 * cfg.n_embd, bias=False)
        self.c_proj = nn.Linear(cfg.n_embd, cfg.n_embd, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.n_embd)
        self.attn = CausalSelfAttention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.n_embd)
        self.mlp = nn.Sequential(
            nn.Linear(cfg.n_embd, 4 * cfg.n_embd, bias=False),
            nn.GELU(approximate="tanh"),
            nn.Linear(4 * cfg.n_embd, cfg.n_embd, bias=False),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig, activation_checkpointing: bool = False) -> None:
        super().__init__()
        self.cfg = cfg
        self.checkpointing = activation_checkpointing
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.wpe = nn.Embedding(cfg.block_size, cfg.n_embd)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.n_embd)
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        self.wte.weight = self.lm_head.weight  # weight tying
        self.apply(self._init_weights)

    @staticmethod
    def _init_weights(m: nn.Module) -> None:
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, mean=0.0, std=0.02)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        T = idx.shape[1]
        pos = torch.arange(T, device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.blocks:
            x = checkpoint(block, x, use_reentrant=False) if self.checkpointing else block(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))

    def flops_per_token(self) -> float:
        """Training FLOPs per token (PaLM appendix B): 6N + 12 L H Q T."""
        n_params = sum(p.numel() for p in self.parameters())
        c = self.cfg
        return 6 * n_params + 12 * c.n_layer * c.n_head * (c.n_embd // c.n_head) * c.block_size


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--embd", type=int, default=768)
    ap.add_argument("--vocab", type=int, default=50304, help="GPT-2's 50257 padded to a multiple of 64, as nanoGPT does")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--checkpoint", action="store_true", help="activation checkpointing per block")
    ap.add_argument("--accum", type=int, default=1, help="gradient accumulation: micro-batches of --batch per step")
    ap.add_argument("--compile", action="store_true", help="torch.compile the model (nanoGPT's default)")
    ap.add_argument("--peak-tflops", type=float, default=989.4, help="GPU bf16 peak for MFU (H100 SXM)")
    args = ap.parse_args()

    torch.manual_seed(0)
    device = "cuda"
    cfg = GPTConfig(block_size=args.seq, vocab_size=args.vocab, n_layer=args.layers, n_head=args.heads, n_embd=args.embd)
    model = GPT(cfg, activation_checkpointing=args.checkpoint).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=6e-4, weight_decay=0.1, betas=(0.9, 0.95), fused=True)
    if args.compile:
        model = torch.compile(model)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"GPT: {n_params / 1e6:.1f}M parameters, batch {args.batch} x {args.seq} tokens, "
          f"on {torch.cuda.get_device_name()}")

    def get_batch() -> tuple[torch.Tensor, torch.Tensor]:
        data = torch.randint(cfg.vocab_size, (args.batch, args.seq + 1))
        x, y = data[:, :-1].pin_memory(), data[:, 1:].pin_memory()
        return x.to(device, non_blocking=True), y.to(device, non_blocking=True)

    tokens_per_step = args.batch * args.seq * args.accum
    step_times = []
    for step in range(args.steps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(args.accum):
            x, y = get_batch()
            with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
                loss = model(x, y)
            if args.accum > 1:
                loss = loss / args.accum  # the mean over the step's micro-batches
            loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        loss_value = loss.item() * args.accum  # waits for the step to finish
        dt = time.perf_counter() - t0
        step_times.append(dt)
        mfu = model.flops_per_token() * tokens_per_step / dt / (args.peak_tflops * 1e12)
        print(f"step {step}: loss {loss_value:.4f}, norm {norm:.2f}, time {dt * 1000:.2f} ms, "
              f"{tokens_per_step / dt:,.0f} tokens/s, MFU {mfu * 100:.1f}%")
    steady = step_times[1:] or step_times
    print(f"mean step time (after the first): {sum(steady) / len(steady) * 1000:.2f} ms")
    print(f"peak memory allocated: {torch.cuda.max_memory_allocated() / 2**30:.3f} GiB, "
          f"reserved: {torch.cuda.max_memory_reserved() / 2**30:.3f} GiB")
    assert math.isfinite(loss_value)


if __name__ == "__main__":
    main()
