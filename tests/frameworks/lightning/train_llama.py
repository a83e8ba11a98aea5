"""A Lightning user's training script: a small Llama-style decoder as a LightningModule, trained on
a synthetic token dataset with `Trainer(accelerator="gpu", precision="bf16-mixed")`, the default
TQDM progress bar, Lightning's ThroughputMonitor, and a step-timing Callback as a user writes one.
It runs unchanged on real GPUs:

    python train_llama.py --devices 1
    python train_llama.py --devices 2                      # Lightning's own launcher spawns rank 1
    torchrun --nproc-per-node 2 train_llama.py --devices 2 # Lightning detects torchrun
    python train_llama.py --devices 2 --strategy fsdp
    python train_llama.py --devices 2 --strategy ddp_spawn # torch.multiprocessing.spawn starts both ranks

This is a stand-in for a user's project (no Hub model, no data download): the model is built from
its sizes and the data are random token ids, which is all the timing depends on.
"""

from __future__ import annotations

import argparse
import math
import time

import lightning as L
import torch
import torch.nn.functional as F
from lightning.fabric.utilities.throughput import measure_flops
from lightning.pytorch.callbacks import ThroughputMonitor, TQDMProgressBar
from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.strategies import ModelParallelStrategy
from torch import nn
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.utils.data import DataLoader, Dataset


class Block(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.attn_norm = nn.RMSNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.proj = nn.Linear(dim, dim, bias=False)
        self.mlp_norm = nn.RMSNorm(dim)
        hidden = 256 * math.ceil(8 * dim / 3 / 256)
        self.gate_up = nn.Linear(dim, 2 * hidden, bias=False)
        self.down = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.attn_norm(x)).view(b, t, 3, self.heads, d // self.heads).unbind(2)
        y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
        gate, up = self.gate_up(self.mlp_norm(x)).chunk(2, dim=-1)
        return x + self.down(F.silu(gate) * up)


class Llama(L.LightningModule):
    def __init__(self, vocab: int, dim: int, layers: int, heads: int, seq: int, batch: int, lr: float) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.embed = nn.Embedding(vocab, dim)
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.norm = nn.RMSNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.embed(idx)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))

    def configure_model(self) -> None:
        # ModelParallelStrategy (FSDP2): the module shards itself on the mesh Lightning built,
        # one unit per block, bf16 parameters and fp32 gradient reduction
        if self.device_mesh is None:
            return
        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        mesh = self.device_mesh["data_parallel"]
        for block in self.blocks:
            fully_shard(block, mesh=mesh, mp_policy=policy)
        fully_shard(self, mesh=mesh, mp_policy=policy)

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        inputs, targets = batch[:, :-1], batch[:, 1:]
        logits = self(inputs)
        loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten())
        self.log("loss", loss, prog_bar=True)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=self.hparams.lr, weight_decay=0.1)

    def setup(self, stage: str) -> None:
        # Lightning's recipe for ThroughputMonitor's MFU: count one training step's FLOPs on meta
        h = self.hparams
        with torch.device("meta"):
            meta = Llama(h.vocab, h.dim, h.layers, h.heads, h.seq, h.batch, h.lr)
            x = torch.randint(0, h.vocab, (h.batch, h.seq))
            self.flops_per_batch = measure_flops(meta, lambda: meta(x), loss_fn=torch.Tensor.sum)
        if self.trainer.global_rank == 0:
            print(f"FLOPs per batch per device: {self.flops_per_batch:,}", flush=True)


class RandomTokens(Dataset):
    """Random token ids, seq + 1 per sample (inputs and shifted targets)."""

    def __init__(self, vocab: int, seq: int, samples: int) -> None:
        self.data = torch.randint(0, vocab, (samples, seq + 1), generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int) -> torch.Tensor:
        return self.data[i]


def batch_size(batch: torch.Tensor) -> int:
    return batch.shape[0]


def batch_tokens(batch: torch.Tensor) -> int:
    return batch.shape[0] * (batch.shape[1] - 1)


class StepTimer(L.Callback):
    """Wall time per training step as a user measures it: wait for the GPU, read perf_counter."""

    def __init__(self, tokens_per_step: int) -> None:
        self.tokens_per_step = tokens_per_step
        self.last: float | None = None

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, batch_idx) -> None:
        torch.cuda.synchronize()
        now = time.perf_counter()
        if self.last is not None:
            ms = (now - self.last) * 1e3
            print(f"rank {trainer.global_rank} step {trainer.global_step}: time {ms:.3f} ms, "
                  f"{self.tokens_per_step / ms * 1e3:,.0f} tokens/s, "
                  f"max memory {torch.cuda.max_memory_allocated() / 2**30:.3f} GiB", flush=True)
        self.last = now


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--devices", type=int, default=1)
    ap.add_argument("--strategy", default="auto", help="auto, ddp, ddp_spawn, fsdp, or model_parallel (FSDP2)")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--dim", type=int, default=256)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--clip", type=float, default=None, help="gradient_clip_val (clip by norm)")
    ap.add_argument("--root", default="lightning_logs")
    ap.add_argument("--progress-bar", choices=["default", "tqdm"], default="default",
                    help="default: Lightning's choice (RichProgressBar when rich is installed, else TQDM)")
    args = ap.parse_args()

    L.seed_everything(0)
    model = Llama(args.vocab, args.dim, args.layers, args.heads, args.seq, args.batch, lr=3e-4)
    data = DataLoader(RandomTokens(args.vocab, args.seq, args.batch * args.steps * args.devices),
                      batch_size=args.batch, shuffle=True)
    # ModelParallelStrategy puts all of a node's GPUs in the tensor-parallel dimension by default
    strategy = (ModelParallelStrategy(data_parallel_size=args.devices, tensor_parallel_size=1)
                if args.strategy == "model_parallel" else args.strategy)
    trainer = L.Trainer(
        accelerator="gpu", devices=args.devices, strategy=strategy, precision="bf16-mixed",
        max_steps=args.steps, log_every_n_steps=1, default_root_dir=args.root, gradient_clip_val=args.clip,
        logger=CSVLogger(args.root, name="llama"),
        callbacks=[StepTimer(args.batch * args.seq),
                   # module-level functions, not lambdas: ddp_spawn pickles the callbacks
                   ThroughputMonitor(batch_size_fn=batch_size, length_fn=batch_tokens, window_size=2),
                   *([TQDMProgressBar()] if args.progress_bar == "tqdm" else [])],
    )
    trainer.fit(model, data)
    if trainer.global_rank == 0:
        print(f"trained {trainer.global_step} steps; peak memory {torch.cuda.max_memory_allocated() / 2**30:.3f} GiB")


if __name__ == "__main__":
    main()
