"""A small Llama-style language model trained with DeepSpeed, written as DeepSpeed's getting-started
docs show a GPU user (https://www.deepspeed.ai/getting-started/): plain torch model,
`deepspeed.initialize(args=..., model=..., model_parameters=...)` with the ds_config JSON given on
the command line (`--deepspeed_config`, from `deepspeed.add_config_arguments`), `engine.backward(loss)`,
`engine.step()`. Runs unchanged on real GPUs:

    torchrun --nproc-per-node 2 train.py --deepspeed_config ds_zero2.json
    deepspeed --num_gpus 2 train.py --deepspeed_config ds_zero2.json

It is a stand-in for a user's training script (the tests need one small enough for the CI
machine); the model is built in plain torch, nothing is downloaded. At the end every rank prints
what a user checks after a run (each is asserted by tests/frameworks/test_deepspeed.py):
the gradient norm DeepSpeed computed, the optimizer steps it took and skipped, and the peak memory.
"""

from __future__ import annotations

import argparse
import math
import os

import deepspeed
import torch
import torch.nn as nn
import torch.nn.functional as F


class SwiGLU(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.gate_up = nn.Linear(dim, 2 * hidden, bias=False)
        self.down = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up(x).chunk(2, dim=-1)
        return self.down(F.silu(gate) * up)


class Block(nn.Module):
    def __init__(self, dim: int, heads: int, hidden: int, experts: int = 0, ep_size: int = 1, top_k: int = 1) -> None:
        super().__init__()
        self.heads = heads
        self.attn_norm = nn.RMSNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.proj = nn.Linear(dim, dim, bias=False)
        self.mlp_norm = nn.RMSNorm(dim)
        # DeepSpeed's MoE layer (deepspeed.moe.layer.MoE: top-k gating, capacity, expert parallel)
        self.mlp = SwiGLU(dim, hidden) if not experts else \
            deepspeed.moe.layer.MoE(hidden_size=dim, expert=SwiGLU(dim, hidden), num_experts=experts, ep_size=ep_size,
                                    k=top_k)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | float]:
        b, t, d = x.shape
        q, k, v = self.qkv(self.attn_norm(x)).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        out = self.mlp(self.mlp_norm(x))
        if isinstance(out, tuple):  # MoE: (output, auxiliary load-balancing loss, expert counts)
            return x + out[0], out[1]
        return x + out, 0.0


class LM(nn.Module):
    def __init__(self, vocab: int, dim: int, layers: int, heads: int, experts: int = 0, ep_size: int = 1,
                 top_k: int = 1) -> None:
        super().__init__()
        hidden = 256 * math.ceil(8 * dim / 3 / 256)
        self.embed = nn.Embedding(vocab, dim)
        self.blocks = nn.ModuleList(Block(dim, heads, hidden, experts, ep_size, top_k) for _ in range(layers))
        self.norm = nn.RMSNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        aux = 0.0
        for block in self.blocks:
            x, block_aux = block(x)
            aux = aux + block_aux
        logits = self.head(self.norm(x))
        return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten()) + 0.01 * aux


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--local_rank", type=int, default=-1, help="set by the deepspeed launcher")
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--dim", type=int, default=256)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--moe-experts", type=int, default=0, help="experts per MoE layer (0: dense MLPs)")
    ap.add_argument("--ep-size", type=int, default=1, help="expert parallel size")
    ap.add_argument("--top-k", type=int, default=1, help="experts per token (DeepSpeed's top-1 or top-2 gating)")
    ap = deepspeed.add_config_arguments(ap)
    args = ap.parse_args()

    deepspeed.init_distributed()
    torch.manual_seed(0)
    model = LM(args.vocab, args.dim, args.layers, args.heads, args.moe_experts, args.ep_size, args.top_k)
    parameters = model.parameters()
    if args.moe_experts:  # as DeepSpeed's MoE tutorial: expert parameters in groups of their own
        from deepspeed.moe.utils import split_params_into_different_moe_groups_for_optimizer

        parameters = split_params_into_different_moe_groups_for_optimizer(
            {"params": [p for p in model.parameters()], "name": "parameters"})
    engine, optimizer, _, _ = deepspeed.initialize(args=args, model=model, model_parameters=parameters)
    rank = engine.global_rank
    micro_batch = engine.train_micro_batch_size_per_gpu()
    n_params = sum(p.ds_numel if hasattr(p, "ds_numel") else p.numel() for p in model.parameters())
    if rank == 0:
        print(f"model: {n_params} parameters, ZeRO stage {engine.zero_optimization_stage()}, "
              f"micro batch {micro_batch} x {args.seq}, {engine.world_size} ranks, optimizer "
              f"{type(optimizer).__name__} over {type(engine.basic_optimizer).__name__}", flush=True)

    norms = []
    for _ in range(args.steps):
        for _ in range(engine.gradient_accumulation_steps()):
            tokens = torch.randint(args.vocab, (micro_batch, args.seq), device=engine.device)
            targets = torch.randint(args.vocab, (micro_batch, args.seq), device=engine.device)
            loss = engine(tokens, targets)
            engine.backward(loss)
            engine.step()
        norms.append(engine.get_global_grad_norm())
    skipped = getattr(engine, "skipped_steps", None)
    print(f"rank {rank}: global_steps {engine.global_steps} global_samples {engine.global_samples} "
          f"skipped_steps {skipped} grad_norms {[float(n) if n is not None else None for n in norms]} "
          f"loss_scale {engine.optimizer.cur_scale if hasattr(engine.optimizer, 'cur_scale') else None} "
          f"peak_allocated {torch.cuda.max_memory_allocated()}", flush=True)


if __name__ == "__main__":
    main()
