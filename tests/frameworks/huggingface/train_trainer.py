"""A Hugging Face Trainer training script as a user would write it (the stand-in for run_clm.py:
the model is built from a config, not downloaded, and the data set is synthetic token ids, since
nothing may be fetched from the Hub). It runs the same on real GPUs with `python` / `torchrun` /
`accelerate launch`.

    python train_trainer.py --model gpt2 --steps 4 [--gradient-checkpointing] [--fsdp full_shard ...]
"""

from __future__ import annotations

import argparse
import json

import torch
from torch.utils.data import Dataset
from transformers import AutoConfig, AutoModelForCausalLM, Trainer, TrainingArguments

CONFIGS = {
    # GPT-2 small's shape with fewer layers (vocab, width, heads as GPT-2).
    "gpt2": dict(model_type="gpt2", n_layer=2, n_embd=768, n_head=12, n_positions=1024, vocab_size=50257),
    # A Llama of the same size class (GQA, SwiGLU, RMSNorm, RoPE).
    "llama": dict(model_type="llama", num_hidden_layers=2, hidden_size=1024, intermediate_size=2816,
                  num_attention_heads=16, num_key_value_heads=4, vocab_size=32000, max_position_embeddings=2048),
    # Mixture-of-Experts: Mixtral's shape (8 experts, top-2) and Qwen3-MoE's (many small experts,
    # top-8), narrowed and shortened.
    "mixtral": dict(model_type="mixtral", num_hidden_layers=2, hidden_size=1024, intermediate_size=2048,
                    num_attention_heads=16, num_key_value_heads=4, num_local_experts=8, num_experts_per_tok=2,
                    vocab_size=32000, max_position_embeddings=2048),
    "qwen3_moe": dict(model_type="qwen3_moe", num_hidden_layers=2, hidden_size=1024, intermediate_size=2816,
                      moe_intermediate_size=384, num_attention_heads=16, num_key_value_heads=4, head_dim=64,
                      num_experts=64, num_experts_per_tok=8, decoder_sparse_step=1, vocab_size=32000,
                      max_position_embeddings=2048),
}
LAYER_CLASSES = {"gpt2": "GPT2Block", "llama": "LlamaDecoderLayer", "mixtral": "MixtralDecoderLayer",
                 "qwen3_moe": "Qwen3MoeDecoderLayer"}


class RandomTokens(Dataset):
    """Synthetic causal-LM samples: the values do not matter to the step time."""

    def __init__(self, n: int, seq: int, vocab: int) -> None:
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, vocab, (n, seq), generator=g)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", choices=sorted(CONFIGS), default="gpt2")
    ap.add_argument("--layers", type=int)
    ap.add_argument("--hidden", type=int, help="llama: width (heads of 64, a quarter as many KV heads)")
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--batch", type=int, default=4, help="per device")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--gradient-checkpointing", action="store_true")
    ap.add_argument("--fsdp", default="", help="TrainingArguments.fsdp, e.g. 'full_shard auto_wrap'")
    ap.add_argument("--fsdp-version", type=int, default=1)
    ap.add_argument("--output-dir", default="trainer-out")
    ap.add_argument("--experts-implementation", choices=["eager", "grouped_mm"], default=None,
                    help="MoE models: Transformers' experts forward (its default: grouped_mm where available)")
    args = ap.parse_args()

    cfg = dict(CONFIGS[args.model])
    if args.layers:
        cfg["n_layer" if args.model == "gpt2" else "num_hidden_layers"] = args.layers
    if args.hidden and args.model == "llama":
        cfg.update(hidden_size=args.hidden, intermediate_size=args.hidden * 11 // 4,
                   num_attention_heads=args.hidden // 64, num_key_value_heads=args.hidden // 256)
    config = AutoConfig.for_model(**cfg)
    extra = {"experts_implementation": args.experts_implementation} if args.experts_implementation else {}
    model = AutoModelForCausalLM.from_config(config, **extra)

    fsdp_config = None
    if args.fsdp:
        fsdp_config = {"version": args.fsdp_version, "transformer_layer_cls_to_wrap": [LAYER_CLASSES[args.model]]}
    training_args = TrainingArguments(
        output_dir=args.output_dir,
        per_device_train_batch_size=args.batch,
        max_steps=args.steps,
        learning_rate=3e-4,
        bf16=True,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        gradient_checkpointing=args.gradient_checkpointing,
        fsdp=args.fsdp,
        fsdp_config=fsdp_config,
        dataloader_num_workers=0,
    )
    dataset = RandomTokens(args.batch * args.steps * 8, args.seq, config.vocab_size)
    trainer = Trainer(model=model, args=training_args, train_dataset=dataset)
    result = trainer.train()
    # One JSON line for whoever reads this log: Trainer's own metrics.
    print("train_result " + json.dumps(result.metrics), flush=True)
    if torch.cuda.is_available():
        print(f"max_memory_allocated {torch.cuda.max_memory_allocated()}", flush=True)


if __name__ == "__main__":
    main()
