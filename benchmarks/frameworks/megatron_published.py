"""NVIDIA's published Megatron-Bridge H100 rows, predicted by running Megatron-LM's own
`pretrain_gpt.py` (the same Megatron-Core) under phantora with the configuration the row's recipe
sets, `--ranks auto`.

    PHANTORA_MEGATRON_LM=DIR PHANTORA_MEGATRON_LM_PYTHON=PY python benchmarks/frameworks/megatron_published.py

(the environment benchmarks/frameworks/setup_megatron_lm.sh prepares.)

The published figures are Megatron-Bridge's docs/performance-summary-archive.md, "DGX-H100"
tables; the configurations are its performance recipes at v0.3.0 (the 26.02 container):
scripts/performance/configs/llama/llama3_workload_base_configs.py (parallelism, batch),
llama3_llm_pretrain.py and recipes/llama/llama3.py (sequence 8192, vocabulary 128,256,
gradients reduced in BF16, distributed optimizer with overlapped gradient reduce and parameter
gather, 128 MiB buckets, manual GC every 100 iterations, no attention mask from the data
loader), utils/precision.py (FP8-CS: hybrid format, tensorwise current scaling, FP8 parameter
all-gather, no BF16 first/last layers).

What differs from the published run, each said where it applies:
- tp_comm_overlap (TE userbuffers: TP all-gathers and reduce-scatters overlapped with the GEMMs)
  is not passed: the row was set up before phantora's Transformer Engine stand-in modelled
  userbuffers (interpose/device/transformer_engine/userbuffers.py) and has not been run with
  them, so the TP collectives run on NCCL after and before their GEMMs.
- cross_entropy_fusion_impl "te": Megatron-LM 0.19 refuses TE's fused cross entropy
  ("disabled due to stability issues"), so Megatron's native fused cross entropy runs.
"""

from __future__ import annotations

import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

from benchmarks.frameworks.megatron_lm import run_pretrain_gpt

_MAX_ALLOCATED = re.compile(r"\| max allocated: ([\d.]+) \|")

LLAMA3_70B = ["--num-layers", "80", "--hidden-size", "8192", "--ffn-hidden-size", "28672",
              "--num-attention-heads", "64", "--group-query-attention", "--num-query-groups", "8",
              "--position-embedding-type", "rope", "--rotary-base", "500000", "--normalization", "RMSNorm",
              "--swiglu", "--untie-embeddings-and-output-weights", "--disable-bias-linear",
              "--attention-dropout", "0", "--hidden-dropout", "0"]
COMMON = ["--seq-length", "8192", "--max-position-embeddings", "8192", "--vocab-size", "128256",
          "--tokenizer-type", "NullTokenizer", "--mock-data", "--no-create-attention-mask-in-dataloader",
          "--lr", "3e-4", "--min-lr", "3e-5", "--lr-warmup-iters", "10", "--lr-decay-iters", "50", "--bf16",
          "--grad-reduce-in-bf16", "--use-distributed-optimizer", "--overlap-grad-reduce", "--overlap-param-gather",
          "--ddp-bucket-size", "134217728", "--cross-entropy-loss-fusion", "--cross-entropy-fusion-impl", "native",
          "--manual-gc", "--manual-gc-interval", "100", "--log-interval", "1", "--eval-iters", "0",
          "--eval-interval", "100000"]
FP8_CS = ["--fp8-format", "hybrid", "--fp8-recipe", "tensorwise", "--fp8-param-gather"]


@dataclass(frozen=True)
class PublishedRow:
    name: str
    gpus: int
    seq: int
    global_batch: int
    published_tokens_per_s_per_gpu: float
    source: str
    args: tuple[str, ...]
    iterations: int = 3  # 1 and 2 hold NCCL's communicator set-up and torch.compile's compiles


ROWS = [
    PublishedRow("Llama 3 70B, FP8-CS, TP4 x PP8 x VP5, GBS 128", 64, 8192, 128, 1602.0,
                 "performance-summary-archive.md, 25.11 container, DGX-H100 (1,619 in 25.09)",
                 (*LLAMA3_70B, *COMMON, *FP8_CS, "--micro-batch-size", "1", "--global-batch-size", "128",
                  "--tensor-model-parallel-size", "4", "--pipeline-model-parallel-size", "8",
                  "--num-layers-per-virtual-pipeline-stage", "2", "--sequence-parallel")),
]


def run(row: PublishedRow, work: Path) -> dict:
    iterations, _, wall_s = run_pretrain_gpt(
        [*row.args, "--train-iters", str(row.iterations)], work, row.iterations, phantora_options=("--ranks", "auto"),
        torchrun_options=("--nnodes", str(row.gpus // 8), "--nproc-per-node", "8"), timeout_s=4 * 3600)
    last_ms = iterations[row.iterations]
    predicted = row.global_batch * row.seq / (last_ms / 1e3) / row.gpus
    # Peak memory from Megatron's own "[Rank N] ... max allocated: MB" lines (torch.cuda's peak on
    # the virtual GPU), not from the trace: at 64 GPUs it is 3.4 GB of JSON.
    peak_mb = max(float(mb) for mb in _MAX_ALLOCATED.findall((work / "output.txt").read_text()))
    return {"row": row.name, "published": row.published_tokens_per_s_per_gpu, "predicted": round(predicted),
            "error": f"{predicted / row.published_tokens_per_s_per_gpu - 1:+.1%}", "iteration ms": last_ms,
            "peak GiB": round(peak_mb / 1024, 2), "wall s": round(wall_s)}


def main() -> None:
    for row in ROWS:
        with tempfile.TemporaryDirectory() as work:
            print(run(row, Path(work)), flush=True)


if __name__ == "__main__":
    main()
