"""An Accelerate training loop as its docs show one (prepare, backward, step), the stand-in for a
user's script: a Llama built from a config (no Hub download) on synthetic token ids. Each batch
carries its samples' indices, so the log shows the order each rank's shuffled DataLoader gave.

    python train_accelerate.py                            (1 GPU)
    accelerate launch --multi_gpu --num_processes 2 train_accelerate.py
    accelerate launch --use_fsdp --fsdp_version 2 --num_processes 2 train_accelerate.py
"""

from __future__ import annotations

import argparse
import json
import time

import torch
from accelerate import Accelerator
from torch.utils.data import DataLoader, Dataset
from transformers import AutoModelForCausalLM, LlamaConfig, get_linear_schedule_with_warmup


class RandomTokens(Dataset):
    """Synthetic causal-LM samples; `index` lets the log show the sampler's order."""

    def __init__(self, n: int, seq: int, vocab: int) -> None:
        self.ids = torch.randint(0, vocab, (n, seq), generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i], "index": torch.tensor(i)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--batch", type=int, default=4, help="per device")
    ap.add_argument("--samples", type=int, default=32, help="data set size (one epoch)")
    ap.add_argument("--gradient-checkpointing", action="store_true")
    ap.add_argument("--data-seed", type=int, help="seed the shuffling generator (else Accelerate seeds it)")
    args = ap.parse_args()

    accelerator = Accelerator(mixed_precision="bf16")
    config = LlamaConfig(num_hidden_layers=args.layers, hidden_size=args.hidden, intermediate_size=args.hidden * 11 // 4,
                         num_attention_heads=args.hidden // 64, num_key_value_heads=args.hidden // 256,
                         vocab_size=32000, max_position_embeddings=2048)
    model = AutoModelForCausalLM.from_config(config)
    if args.gradient_checkpointing:
        model.gradient_checkpointing_enable()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=True)
    generator = None if args.data_seed is None else torch.Generator().manual_seed(args.data_seed)
    loader = DataLoader(RandomTokens(args.samples, args.seq, config.vocab_size), batch_size=args.batch, shuffle=True,
                        generator=generator)
    scheduler = get_linear_schedule_with_warmup(optimizer, 2, len(loader))
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)

    model.train()
    tokens = args.batch * args.seq
    seen: list[int] = []
    last = time.perf_counter()
    for step, batch in enumerate(loader, 1):
        seen += batch.pop("index").tolist()
        loss = model(**batch).loss
        accelerator.backward(loss)
        norm = accelerator.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
        loss_value = loss.item()  # waits for the step, as on a GPU
        now = time.perf_counter()
        dt, last = now - last, now
        print(f"rank {accelerator.process_index} step {step}: loss {loss_value:.4f} grad_norm {float(norm):.4f} "
              f"time {dt * 1e3:.3f} ms {tokens / dt:,.0f} tokens/s", flush=True)
    print(f"rank {accelerator.process_index} order " + json.dumps(seen), flush=True)
    print(f"rank {accelerator.process_index} max_memory_allocated {torch.cuda.max_memory_allocated()}", flush=True)
    accelerator.end_training()


if __name__ == "__main__":
    main()
