"""Running the Megatron-Core stand-in training script (tests/frameworks/megatron/pretrain_gpt.py)
unmodified under `phantora trace`, launched with torchrun as on a GPU node, and reading back what
a user reads: its own per-iteration log lines, and the trace. Shared by
tests/frameworks/test_megatron.py and benchmarks/frameworks/megatron.py."""

from __future__ import annotations

import math
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).resolve().parent / "megatron" / "pretrain_gpt.py"


@dataclass(frozen=True)
class GPTConfig:
    """The script's model and schedule arguments (its defaults where not given)."""
    tp: int = 1
    pp: int = 1
    vp: int | None = None  # model chunks per pipeline rank (interleaved 1F1B)
    cp: int = 1  # context parallel size (the sequence split over ranks; TE's layer spec)
    layers: int = 2
    hidden: int = 256
    heads: int = 4
    seq: int = 256
    vocab: int = 32000
    micro_batch: int = 2
    microbatches: int = 4
    iters: int = 3
    bucket_size: int | None = None  # parameters per DDP gradient bucket (None: Megatron's default)
    experts: int | None = None  # MoE: routed experts per layer (SequentialMLP, alltoall dispatcher)
    topk: int = 2
    ep: int = 1  # expert model parallel size
    etp: int | None = None  # expert tensor parallel size (Megatron's default: tp)
    grouped_gemm: bool = False  # --moe-grouped-gemm: the experts as one grouped GEMM (TE's GroupedLinear)
    permute_fusion: bool = False  # --moe-permute-fusion: TE's fused token permutation (its Triton kernels)
    router_fusion: bool = False  # --moe-router-fusion: TE's fused top-k router and auxiliary loss kernels
    sequence_parallel: bool = False
    # Megatron-LM's default fused kernels (Apex's): fused scale-mask-softmax, weight gradients
    # accumulated into main_grad
    fused_kernels: bool = False
    # Megatron-LM's --transformer-impl: "local" (Megatron-Core's modules) or "transformer_engine"
    # (TE's; needs the `te` extra's environment, tests/conftest.py megatron_te_python)
    transformer_impl: str = "local"
    fp8_format: str | None = None  # "hybrid" or "e4m3": FP8 through Transformer Engine
    fp8_recipe: str = "delayed"  # Megatron-LM's --fp8-recipe: delayed, tensorwise (current scaling), ...
    # multi-latent attention (TE's layer spec): (q_lora_rank, kv_lora_rank, qk_head_dim,
    # qk_pos_emb_head_dim, v_head_dim); MLATransformerConfig's RMSNorm comes with it
    mla: tuple[int, int, int, int, int] | None = None
    # Megatron-LM's --tp-comm-overlap: TE's userbuffers overlap the TP collectives with the GEMMs
    tp_comm_overlap: bool = False
    # sliding-window attention (left, right) on all layers but every `window_skip_freq`-th, and the
    # softmax type (GPT-OSS: (127, 0), 2, "learnable")
    window: tuple[int, int] | None = None
    window_skip_freq: int | None = None
    softmax_type: str = "vanilla"

    def args(self) -> list[str]:
        a = ["--tp", str(self.tp), "--pp", str(self.pp), "--num-layers", str(self.layers),
             "--hidden-size", str(self.hidden), "--num-attention-heads", str(self.heads),
             "--seq-length", str(self.seq), "--vocab-size", str(self.vocab),
             "--micro-batch-size", str(self.micro_batch), "--num-microbatches", str(self.microbatches),
             "--train-iters", str(self.iters)]
        if self.vp is not None:
            a += ["--virtual-pipeline-model-parallel-size", str(self.vp)]
        if self.cp > 1:
            a += ["--context-parallel-size", str(self.cp)]
        if self.bucket_size is not None:
            a += ["--ddp-bucket-size", str(self.bucket_size)]
        if self.experts is not None:
            a += ["--num-experts", str(self.experts), "--moe-router-topk", str(self.topk),
                  "--expert-model-parallel-size", str(self.ep)]
            if self.etp is not None:
                a += ["--expert-tensor-parallel-size", str(self.etp)]
            if self.grouped_gemm:
                a += ["--moe-grouped-gemm"]
            if self.permute_fusion:
                a += ["--moe-permute-fusion"]
            if self.router_fusion:
                a += ["--moe-router-fusion"]
        if self.sequence_parallel:
            a += ["--sequence-parallel"]
        if self.fused_kernels:
            a += ["--masked-softmax-fusion", "--gradient-accumulation-fusion"]
        if self.transformer_impl != "local":
            a += ["--transformer-impl", self.transformer_impl]
        if self.fp8_format is not None:
            a += ["--fp8-format", self.fp8_format, "--fp8-recipe", self.fp8_recipe]
        if self.tp_comm_overlap:
            a += ["--tp-comm-overlap"]
        if self.window is not None:
            a += ["--window-size", f"{self.window[0]},{self.window[1]}"]
        if self.window_skip_freq is not None:
            a += ["--window-attn-skip-freq", str(self.window_skip_freq)]
        if self.softmax_type != "vanilla":
            a += ["--softmax-type", self.softmax_type]
        if self.mla is not None:
            q, kv, qk, pos, v = self.mla
            a += ["--multi-latent-attention", "--q-lora-rank", str(q), "--kv-lora-rank", str(kv), "--qk-head-dim",
                  str(qk), "--qk-pos-emb-head-dim", str(pos), "--v-head-dim", str(v)]
        return a


@dataclass(frozen=True)
class Iteration:
    """One of the script's per-iteration log lines."""
    n: int
    elapsed_ms: float       # time.time() around the iteration
    event_ms: float         # torch.cuda.Event elapsed_time over the iteration
    tflops_per_gpu: float   # model FLOPs per second per GPU, Megatron's count
    tokens_per_s_per_gpu: float
    loss: float
    grad_norm: float
    update_successful: bool
    skipped: int


_ITERATION = re.compile(
    r"iteration\s+(\d+)/\s*\d+ \| elapsed time per iteration \(ms\): ([\d.]+) \| cuda event time \(ms\): ([\d.]+) \| "
    r"throughput per GPU \(TFLOP/s/GPU\): ([\d.]+) \| tokens per second per GPU: ([\d.]+) \| "
    r"learning rate: \S+ \| lm loss: (\S+) \| grad norm: (\S+) \| "
    r"update successful: (True|False) \| number of skipped iterations:\s+(\d+)")
_PEAK = re.compile(r"peak memory allocated \(GiB\): ([\d.]+)")


def iterations(stdout: str) -> list[Iteration]:
    # not anchored at a line start: ranks share one pipe (only the last rank logs, but warnings
    # from the others can land between a print's text and its newline)
    return [Iteration(int(n), float(e), float(ev), float(tf), float(tps), float(loss), float(gn), ok == "True",
                      int(sk))
            for n, e, ev, tf, tps, loss, gn, ok, sk in _ITERATION.findall(stdout)]


def logged_peak_gib(stdout: str) -> float | None:
    m = _PEAK.search(stdout)
    return None if m is None else float(m.group(1))


def torchrun(python: str) -> list[str]:
    """The torchrun of the environment `python` belongs to (what a user types on a GPU node)."""
    exe = Path(python).with_name("torchrun")
    return [str(exe)] if exe.exists() else [python, "-m", "torch.distributed.run"]


@dataclass
class Run:
    proc: subprocess.CompletedProcess
    trace: Path
    iterations: list[Iteration]
    wall_s: float


def run_megatron(out_dir: Path, python: str, nproc: int, cfg: GPTConfig, *, name: str = "run.json",
                 options: tuple[str, ...] = (), timeout: float = 900) -> Run:
    """phantora trace -o OUT -- torchrun --nproc-per-node N pretrain_gpt.py ARGS"""
    out = out_dir / name
    cmd = [sys.executable, "-m", "phantora.cli", "trace", *options, "-o", str(out), "--", *torchrun(python),
           "--nproc-per-node", str(nproc), str(SCRIPT), *cfg.args()]
    t0 = time.monotonic()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    return Run(proc, out, iterations(proc.stdout), time.monotonic() - t0)


def gpt_params(cfg: GPTConfig, stage: int) -> int:
    """Parameters on one (tensor, pipeline) rank of GPTModel with the local layer spec, counted by
    hand: vocab-parallel word embedding and learned positions on the first stage; per layer two
    layer norms (weight, bias; replicated over TP), column-parallel QKV and FC1 (weights and biases
    split over TP), row-parallel projection and FC2 (weights split, biases replicated); final layer
    norm and an untied vocab-parallel output layer on the last stage."""
    h, tp = cfg.hidden, cfg.tp
    layer = 2 * 2 * h + (3 * h * h + 3 * h) // tp + h * h // tp + h + (4 * h * h + 4 * h) // tp + 4 * h * h // tp + h
    norm = 2 * h  # LayerNorm: weight and bias
    if cfg.mla is not None:
        # MLA (TE's spec, RMSNorm: weights only): the input norm; the down-projections of queries
        # (h -> q_lora) and of keys and values (h -> kv_lora + the RoPE part), whole on every TP
        # rank; the up-projections (q_lora -> heads x (qk + pos), kv_lora -> heads x (qk + v)) and
        # the output projection (heads x v -> h, replicated bias) split over TP; no biases on the
        # projections in between; then the MLP with its RMSNorm
        q, kv, qk, pos, v = cfg.mla
        a = cfg.heads
        norm = h
        layer = (h + q * h + (kv + pos) * h + a * (qk + pos) * q // tp + a * (qk + v) * kv // tp
                 + a * v * h // tp + h + h + (4 * h * h + 4 * h) // tp + 4 * h * h // tp + h)
    n = cfg.layers // cfg.pp * layer  # interleaved: the same layers per rank, in vp chunks
    if stage == 0:
        n += cfg.vocab * h // tp + cfg.seq * h
    if stage == cfg.pp - 1:
        n += norm + cfg.vocab * h // tp
    return n


def static_bytes(cfg: GPTConfig, stage: int, dp: int) -> int:
    """Memory that lives through the whole run, per rank: bf16 parameters and fp32 gradient
    buffer (grad_reduce_in_fp32) for the whole model chunk; the distributed optimizer's fp32 main
    parameters and Adam's two fp32 moments for this rank's 1/dp shard only."""
    p = gpt_params(cfg, stage)
    return 2 * p + 4 * p + 12 * math.ceil(p / dp)


def activation_bytes(cfg: GPTConfig, stage: int) -> int:
    """An upper estimate of one microbatch's saved activations on a stage: per layer the
    Korthikanti et al. count s*b*h*(34 + 5*a*s/h) bytes (it includes dropout masks, which this
    run has not), split over TP; on the last stage the logits and the cross-entropy's fp32
    copies of them (bf16 logits, fp32 logits, exp, gradient: 14 bytes, rounded to 16)."""
    s, b, h, a = cfg.seq, cfg.micro_batch, cfg.hidden, cfg.heads
    n = cfg.layers // cfg.pp * s * b * h * (34 + 5 * a * s // h) // cfg.tp
    if stage == cfg.pp - 1:
        n += 16 * b * s * cfg.vocab // cfg.tp
    return n
