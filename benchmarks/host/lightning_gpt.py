"""GPT-124M (examples/gpt_train.py's model) trained by Lightning 2.6 on one GPU, as a user would
write it: a LightningModule, `Trainer(accelerator="gpu", devices=1, precision="bf16-mixed")` with
its default progress bar and logger, a DataLoader of random tokens in the training process. A
callback prints each step's time (from one batch end to the next, after a synchronize), the first
step from the start of fit's first batch.

    python benchmarks/host/lightning_gpt.py --steps 8 --root /tmp/lgpt
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import lightning as L
import torch
from torch.utils.data import DataLoader, Dataset

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
from gpt_train import GPT, GPTConfig  # noqa: E402


class RandomTokens(Dataset):
    def __init__(self, n: int, seq: int, vocab: int) -> None:
        self.n, self.seq, self.vocab = n, seq, vocab

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(i)
        x = torch.randint(0, self.vocab, (self.seq + 1,), generator=g)
        return x[:-1], x[1:]


class LitGPT(L.LightningModule):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.model = GPT(cfg)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = self.model(x, y)
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=6e-4, weight_decay=0.1, betas=(0.9, 0.95), fused=True)


class StepTimes(L.Callback):
    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:  # noqa: ANN001
        if batch_idx == 0:
            torch.cuda.synchronize()
            self.last = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:  # noqa: ANN001
        torch.cuda.synchronize()
        now = time.perf_counter()
        print(f"step {batch_idx}: {(now - self.last) * 1e3:.2f} ms", flush=True)
        self.last = now


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--root", default="lightning_gpt_logs")
    args = ap.parse_args()
    torch.manual_seed(0)
    cfg = GPTConfig(block_size=args.seq)
    data = DataLoader(RandomTokens(args.steps * args.batch, args.seq, cfg.vocab_size), batch_size=args.batch)
    trainer = L.Trainer(accelerator="gpu", devices=1, precision="bf16-mixed", max_steps=args.steps,
                        default_root_dir=args.root, callbacks=[StepTimes()], enable_checkpointing=False)
    trainer.fit(LitGPT(cfg), data)


if __name__ == "__main__":
    main()
