"""NVIDIA's published Megatron-Bridge H100 rows, predicted by running Megatron-LM's own
`pretrain_gpt.py` (the same Megatron-Core) under phantora with the configuration the row's recipe
sets, `--ranks auto`.

    PHANTORA_MEGATRON_LM=DIR PHANTORA_MEGATRON_LM_PYTHON=PY python benchmarks/frameworks/megatron_published.py [--only TEXT]

(the environment benchmarks/frameworks/setup_megatron_lm.sh prepares.)

The published figures are Megatron-Bridge's docs/performance-summary-archive.md, "DGX-H100"
tables; the configurations are its performance recipes at v0.3.0 (the 26.02 container):
scripts/performance/configs/llama/llama3_workload_base_configs.py (parallelism, batch),
llama3_llm_pretrain.py and recipes/llama/llama3.py (sequence 8192, vocabulary 128,256,
gradients reduced in BF16, distributed optimizer with overlapped gradient reduce and parameter
gather, 128 MiB buckets, manual GC every 100 iterations, no attention mask from the data
loader), utils/precision.py (FP8-CS: hybrid format, tensorwise current scaling, FP8 parameter
all-gather, no BF16 first/last layers).

GPT-OSS 120B (the 26.04.01 container's row, BF16, 64 GPUs): the recipe at Megatron-Bridge's main
(src/megatron/bridge/perf_recipes/gpt_oss/h100/gpt_oss.py, gpt_oss_120b_pretrain_64gpu_h100_bf16_config:
TP 1, PP 4, EP 8, no sequence parallel, global batch 1,280, micro-batch 1, selective recompute of
the norms and the MoE activation, the fused router, forced load balancing; over the base recipe's
alltoall dispatcher, grouped GEMM, permute fusion, per-token loss) and the model as its bridge
builds it from the Hugging Face config (models/gpt_oss/gpt_oss_bridge.py: biases, YaRN, the quick
GeGLU with offset 1 and clamp 7, learnable softmax offsets, a 128-token window on every other
layer), whose sizes are those of Megatron-LM's own gpt-oss-120b launch arguments
(examples/post_training/modelopt/conf/openai/gpt-oss-120b.sh: 36 layers, hidden 2,880, 64 heads of
64 with 8 key/value groups, 128 experts of 2,880, top 4, vocabulary 201,088). Megatron-Bridge
runs it with CUDA_DEVICE_MAX_CONNECTIONS=32; the script keeps Megatron-LM's 1 (one compute queue
per GPU in phantora either way).

GPT 1.7B, 7.1B and 70B (dense, BF16): the table of Megatron-LM's README (images/model_table.png,
Megatron-Core r0.8.0 on H100s, per-GPU model teraFLOP/s as Megatron-LM logs them with
`--log-throughput`): heads, hidden size, layers, TP, PP, data-parallel size and global batch from
the table; vocabulary 131,072, sequence 4,096, overlapped gradient reduce and parameter gather
(so the distributed optimizer), `--tp-comm-overlap` (so sequence parallel) where TP > 1, from the
README's text. Not stated, and taken as Megatron-LM's defaults and examples/gpt3's script: micro-batch
1, BF16 (the MFU column is against the BF16 peak), the TE layer spec, dropout 0.1, learned absolute
positions, GELU MLP of 4x hidden. The comparison is of teraFLOP/s, Megatron's own count on both sides.
The 70B row (768 GPUs, TP 8 with --tp-comm-overlap) takes about an hour of wall on a 2-core
machine (7 GB); it is the last row, so `--only` the others to leave it out.

Llama 3 8B on 8 B200s (the 25.11 container's DGX-B200 row): the v0.3.0 recipe
(llama3_workload_base_configs.py LLAMA3_8B_PRETRAIN_CONFIG_B200_FP8_CS_V1: micro-batch 2, global
batch 128, no model parallelism, the distributed optimizer over 8 ranks) with the 70B row's Llama 3
settings and FP8-CS, and the recipe's full-iteration CUDA graph (cuda_graph_impl "local" with
scope "full_iteration" there; Megatron-LM 0.19 spells it --cuda-graph-impl full_iteration, which
needs --no-check-for-nan-in-loss-and-grad). Megatron captures the graph after 3 warm-up steps, so
the row runs 6 iterations and reads the 6th (a replay). phantora's B200 rates are estimates
(phantora/hardware.py: no B200 measurement in the repository), so this row tests them.

What differs from the published run, each said where it applies:
- Llama 3 70B: tp_comm_overlap (TE userbuffers: TP all-gathers and reduce-scatters overlapped with the GEMMs)
  is not passed: the row was set up before phantora's Transformer Engine stand-in modelled
  userbuffers (interpose/device/transformer_engine/userbuffers.py) and has not been run with
  them, so the TP collectives run on NCCL after and before their GEMMs.
- Llama 3 and GPT-OSS rows: cross_entropy_fusion_impl "te": Megatron-LM 0.19 refuses TE's fused cross entropy
  ("disabled due to stability issues"), so Megatron's native fused cross entropy runs.
"""

from __future__ import annotations

import argparse
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
LLAMA3_8B = ["--num-layers", "32", "--hidden-size", "4096", "--ffn-hidden-size", "14336",
             "--num-attention-heads", "32", *LLAMA3_70B[8:]]  # the 70B's GQA, norm, positions and MLP
LLAMA3_DATA = ["--seq-length", "8192", "--max-position-embeddings", "8192", "--vocab-size", "128256",
               "--ddp-bucket-size", "134217728"]  # the Llama recipes' 128 MiB buckets
COMMON = ["--tokenizer-type", "NullTokenizer", "--mock-data", "--no-create-attention-mask-in-dataloader",
          "--lr", "3e-4", "--min-lr", "3e-5", "--lr-warmup-iters", "10", "--lr-decay-iters", "50", "--bf16",
          "--grad-reduce-in-bf16", "--use-distributed-optimizer", "--overlap-grad-reduce", "--overlap-param-gather",
          "--cross-entropy-loss-fusion", "--cross-entropy-fusion-impl", "native",
          "--manual-gc", "--manual-gc-interval", "100", "--log-interval", "1", "--eval-iters", "0",
          "--eval-interval", "100000"]
FP8_CS = ["--fp8-format", "hybrid", "--fp8-recipe", "tensorwise", "--fp8-param-gather"]
GPT_OSS_120B = ["--num-layers", "36", "--hidden-size", "2880", "--ffn-hidden-size", "2880", "--num-attention-heads", "64",
                "--group-query-attention", "--num-query-groups", "8", "--kv-channels", "64", "--normalization", "RMSNorm",
                "--untie-embeddings-and-output-weights", "--position-embedding-type", "yarn", "--rotary-base", "150000",
                "--rotary-scaling-factor", "32", "--yarn-original-max-position-embeddings", "4096",
                "--yarn-beta-fast", "32", "--yarn-beta-slow", "1", "--no-yarn-correction-range-round-to-int",
                "--quick-geglu", "--glu-linear-offset", "1.0", "--activation-func-clamp-value", "7.0",
                "--softmax-type", "learnable", "--window-size", "127,0", "--window-attn-skip-freq", "2",
                "--hidden-dropout", "0", "--attention-dropout", "0", "--no-bias-dropout-fusion",
                "--num-experts", "128", "--moe-ffn-hidden-size", "2880", "--moe-router-topk", "4",
                "--moe-router-score-function", "softmax", "--moe-router-load-balancing-type", "none",
                "--moe-aux-loss-coeff", "0", "--moe-token-dispatcher-type", "alltoall", "--moe-grouped-gemm",
                "--moe-permute-fusion", "--calculate-per-token-loss",
                "--seq-length", "4096", "--max-position-embeddings", "131072", "--vocab-size", "201088"]


README_GPT = ["--seq-length", "4096", "--max-position-embeddings", "4096", "--vocab-size", "131072",
              "--tokenizer-type", "NullTokenizer", "--mock-data", "--no-create-attention-mask-in-dataloader",
              "--micro-batch-size", "1", "--bf16", "--use-distributed-optimizer", "--overlap-grad-reduce",
              "--overlap-param-gather", "--lr", "6e-5", "--min-lr", "6e-6", "--lr-warmup-iters", "10",
              "--lr-decay-iters", "50", "--log-throughput", "--log-interval", "1", "--eval-iters", "0",
              "--eval-interval", "100000"]


def readme_gpt(layers: int, hidden: int, heads: int, tp: int, pp: int, global_batch: int) -> tuple[str, ...]:
    """A row of Megatron-LM's README table as pretrain_gpt.py arguments."""
    overlap = ["--sequence-parallel", "--tp-comm-overlap"] if tp > 1 else []
    return ("--num-layers", str(layers), "--hidden-size", str(hidden), "--num-attention-heads", str(heads),
            "--tensor-model-parallel-size", str(tp), "--pipeline-model-parallel-size", str(pp),
            "--global-batch-size", str(global_batch), *overlap, *README_GPT)


@dataclass(frozen=True)
class PublishedRow:
    name: str
    gpus: int
    seq: int
    global_batch: int
    published: float  # in `metric`
    source: str
    args: tuple[str, ...]
    iterations: int = 3  # 1 and 2 hold NCCL's communicator set-up and torch.compile's compiles
    metric: str = "tokens/s/GPU"  # or "TFLOP/s/GPU": Megatron's model FLOPs, as logged with --log-throughput
    gpu: str = "h100"  # phantora's --gpu


ROWS = [
    PublishedRow("Llama 3 70B, FP8-CS, TP4 x PP8 x VP5, GBS 128", 64, 8192, 128, 1602.0,
                 "performance-summary-archive.md, 25.11 container, DGX-H100 (1,619 in 25.09)",
                 (*LLAMA3_70B, *LLAMA3_DATA, *COMMON, *FP8_CS, "--micro-batch-size", "1", "--global-batch-size", "128",
                  "--tensor-model-parallel-size", "4", "--pipeline-model-parallel-size", "8",
                  "--num-layers-per-virtual-pipeline-stage", "2", "--sequence-parallel")),
    PublishedRow("GPT-OSS 120B, BF16, PP4 x EP8, GBS 1280", 64, 4096, 1280, 5824.0,
                 "performance-summary-archive.md, 26.04.01 container, DGX-H100 (5,810 in 26.04)",
                 (*GPT_OSS_120B, *COMMON, "--micro-batch-size", "1", "--global-batch-size", "1280",
                  "--tensor-model-parallel-size", "1", "--pipeline-model-parallel-size", "4",
                  "--expert-model-parallel-size", "8", "--moe-router-fusion", "--moe-router-force-load-balancing",
                  "--recompute-granularity", "selective", "--recompute-modules", "layernorm", "moe_act",
                  "--no-check-for-nan-in-loss-and-grad")),
    PublishedRow("Llama 3 8B, FP8-CS, B200, DP8, GBS 128", 8, 8192, 128, 30624.0,
                 "performance-summary-archive.md, 25.11 container, DGX-B200 (29,994 in 25.09)",
                 (*LLAMA3_8B, *LLAMA3_DATA, *COMMON, *FP8_CS, "--micro-batch-size", "2", "--global-batch-size", "128",
                  "--cuda-graph-impl", "full_iteration", "--no-check-for-nan-in-loss-and-grad"),
                 iterations=6, gpu="b200"),
    PublishedRow("GPT 1.7B, BF16, DP48, GBS 192", 48, 4096, 192, 408.8, "Megatron-LM README, Megatron-Core r0.8.0",
                 readme_gpt(24, 2048, 16, 1, 1, 192), metric="TFLOP/s/GPU"),
    PublishedRow("GPT 7.1B, BF16, TP2 x DP48, GBS 192", 96, 4096, 192, 465.9, "Megatron-LM README, Megatron-Core r0.8.0",
                 readme_gpt(30, 4096, 32, 2, 1, 192), metric="TFLOP/s/GPU"),
    PublishedRow("GPT 70B, BF16, TP8 x PP2 x DP48, GBS 384", 768, 4096, 384, 419.7,
                 "Megatron-LM README, Megatron-Core r0.8.0", readme_gpt(84, 8192, 64, 8, 2, 384), metric="TFLOP/s/GPU"),
]
_TFLOPS = re.compile(r"iteration\s+(\d+)/\s*\d+ \|.*throughput per GPU \(TFLOP/s/GPU\): ([\d.]+)")


def run(row: PublishedRow, work: Path) -> dict:
    iterations, _, wall_s = run_pretrain_gpt(
        [*row.args, "--train-iters", str(row.iterations)], work, row.iterations, phantora_options=("--ranks", "auto", "--gpu", row.gpu),
        torchrun_options=("--nnodes", str(row.gpus // 8), "--nproc-per-node", "8"), timeout_s=4 * 3600)
    last_ms = iterations[row.iterations]
    output = (work / "output.txt").read_text()
    if row.metric == "TFLOP/s/GPU":
        predicted = dict((int(n), float(v)) for n, v in _TFLOPS.findall(output))[row.iterations]
    else:
        predicted = row.global_batch * row.seq / (last_ms / 1e3) / row.gpus
    # Peak memory from Megatron's own "[Rank N] ... max allocated: MB" lines (torch.cuda's peak on
    # the virtual GPU), not from the trace: at 64 GPUs it is 3.4 GB of JSON.
    peak_mb = max(float(mb) for mb in _MAX_ALLOCATED.findall(output))
    return {"row": row.name, "metric": row.metric, "published": row.published, "predicted": round(predicted, 1),
            "error": f"{predicted / row.published - 1:+.1%}", "iteration ms": last_ms,
            "peak GiB": round(peak_mb / 1024, 2), "wall s": round(wall_s)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="", help="run the rows whose name contains this text")
    args = ap.parse_args()
    for row in (r for r in ROWS if args.only in r.name):
        with tempfile.TemporaryDirectory() as work:
            print(run(row, Path(work)), flush=True)


if __name__ == "__main__":
    main()
