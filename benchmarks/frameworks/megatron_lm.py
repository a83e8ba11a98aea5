"""Megatron-LM's own `pretrain_gpt.py`, unmodified, with `--mock-data`, on 8 simulated H100s
(one DGX node): `phantora trace -- torchrun --nproc-per-node 8 pretrain_gpt.py ...` from a
Megatron-LM checkout, with the Transformer Engine layer spec (Megatron's default; with context
parallelism too), FP8, MoE and the local spec on Apex's kernels.

Megatron-LM's training package and launch script are not on any package index, so this needs a
checkout and an environment you set up once (benchmarks/frameworks/setup_megatron_lm.sh, which
needs network access for the clone only):

    PHANTORA_MEGATRON_LM=DIR  a Megatron-LM checkout at core_v0.19.0 (the release of the
                              megatron-core wheel the test suite uses), its dataset helpers built
    PHANTORA_MEGATRON_LM_PYTHON=PY  Python 3.12 (Megatron-LM's requirement) with the CUDA build
                              of torch 2.14, Transformer Engine's Python layer as `pip install
                              "phantora[te]"` installs it, Apex's Python layer, tiktoken,
                              sentencepiece, transformers, einops

The model is a small GPT (8 layers, width 1024, 16 heads, sequence 1024, vocab 32,000 from
Megatron's NullTokenizer), micro-batch 2, global batch 16, 4 iterations, bf16. Iterations 1 and
2 hold torch.compile's compiles of Megatron's fused bias-GeLU / bias-dropout-add (Megatron's
`jit_fuser`); the figures are iterations 3..4: Megatron's own logged iteration time (and
tokens/s/GPU from it), the trace's step time; peak memory is the busiest GPU's, from the trace.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from functools import partial
from pathlib import Path

from benchmarks.frameworks import Case, Row
from phantora.query import load
from phantora.query.summary import summarize

RANKS = 8
SEQ, GLOBAL_BATCH, ITERS = 1024, 16, 4
STEADY_FROM = 3  # the first iteration after torch.compile's compiles
MODEL = ["--num-layers", "8", "--hidden-size", "1024", "--num-attention-heads", "16", "--seq-length", str(SEQ),
         "--max-position-embeddings", str(SEQ), "--micro-batch-size", "2", "--global-batch-size", str(GLOBAL_BATCH),
         "--train-iters", str(ITERS), "--lr", "1e-4", "--bf16", "--mock-data", "--tokenizer-type", "NullTokenizer",
         "--vocab-size", "32000", "--log-interval", "1", "--eval-iters", "0", "--eval-interval", "1000"]
DIST_OPT = ["--use-distributed-optimizer", "--overlap-grad-reduce", "--overlap-param-gather"]
_ITERATION = re.compile(r"iteration\s+(\d+)/\s*\d+ \|.*elapsed time per iteration \(ms\): ([\d.]+)")

# config name -> pretrain_gpt.py arguments on top of MODEL
CONFIGS: dict[str, list[str]] = {
    "TE spec, TP2 x PP2 x DP2, SP, dist. optimizer": [
        "--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2", "--sequence-parallel", *DIST_OPT],
    "TE spec, TP2 x CP2 x DP2, SP, dist. optimizer": [
        "--tensor-model-parallel-size", "2", "--context-parallel-size", "2", "--sequence-parallel", *DIST_OPT],
    "TE spec, PP4 x VP2 x DP2, dist. optimizer": [
        "--pipeline-model-parallel-size", "4", "--num-layers-per-virtual-pipeline-stage", "1", *DIST_OPT],
    "TE spec, FP8 hybrid (delayed), TP2 x DP4, SP": [
        "--tensor-model-parallel-size", "2", "--sequence-parallel", "--fp8-format", "hybrid", *DIST_OPT],
    "TE spec, MoE 8 experts top-2, EP4 x DP2, alltoall, grouped GEMM": [
        "--num-experts", "8", "--moe-router-topk", "2", "--expert-model-parallel-size", "4",
        "--moe-token-dispatcher-type", "alltoall", "--moe-grouped-gemm", "--disable-bias-linear", *DIST_OPT],
    "local spec + Apex, TP2 x PP2 x DP2, SP": [
        "--transformer-impl", "local", "--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2",
        "--sequence-parallel", *DIST_OPT],
}


def _environment() -> tuple[Path, str]:
    checkout, python = os.environ.get("PHANTORA_MEGATRON_LM"), os.environ.get("PHANTORA_MEGATRON_LM_PYTHON")
    if not checkout or not python:
        raise RuntimeError("set PHANTORA_MEGATRON_LM (a Megatron-LM checkout) and PHANTORA_MEGATRON_LM_PYTHON "
                           "(its Python 3.12): benchmarks/frameworks/setup_megatron_lm.sh prepares both")
    return Path(checkout), python


def run_pretrain_gpt(args: list[str], work: Path, iterations: int, *, phantora_options: tuple[str, ...] = (),
                     torchrun_options: tuple[str, ...] = ("--nproc-per-node", str(RANKS)),
                     timeout_s: float = 3600) -> tuple[dict[int, float], Path, float]:
    """`phantora trace -- torchrun pretrain_gpt.py args` in the checkout: Megatron's logged
    iteration times (iteration -> ms), the trace and the wall seconds (what it printed is left in
    `work`/output.txt); RuntimeError with the first error line unless it exits 0 having logged
    `iterations` iterations."""
    checkout, python = _environment()
    trace = work / "run.json"
    torchrun = str(Path(python).parent / "torchrun")
    cmd = [sys.executable, "-m", "phantora.cli", "trace", "--quiet", *phantora_options, "-o", str(trace), "--",
           torchrun, *torchrun_options, "pretrain_gpt.py", *args]
    start = time.monotonic()
    env = dict(os.environ, CUDA_DEVICE_MAX_CONNECTIONS="1")  # as Megatron-LM's example scripts export it
    proc = subprocess.run(cmd, cwd=checkout, env=env, capture_output=True, text=True, timeout=timeout_s)
    wall_s = time.monotonic() - start
    (work / "output.txt").write_text(proc.stdout + proc.stderr)  # what the run printed, for the callers' own lines
    logged = {int(n): float(ms) for n, ms in _ITERATION.findall(proc.stdout + proc.stderr)}
    if proc.returncode != 0 or len(logged) != iterations:
        errors = [line for line in (proc.stdout + proc.stderr).splitlines() if "Error: " in line]
        raise RuntimeError(f"exit {proc.returncode}, {len(logged)} iteration lines; first error: "
                           f"{errors[0] if errors else proc.stderr[-1500:]}")
    return logged, trace, wall_s


def _run(config: str, args: list[str], work: Path) -> Row:
    iterations, trace, wall_s = run_pretrain_gpt([*MODEL, *args], work, ITERS)
    summary = summarize(load(trace))
    steady = [iterations[n] for n in range(STEADY_FROM, ITERS + 1)]
    iteration_ms = sum(steady) / len(steady)
    durations = summary.steps.per_rank[0].durations_ns[STEADY_FROM - 1:]
    return Row(
        stack="megatron-lm", config=config, ranks=RANKS,
        step_ms=sum(durations) / len(durations) / 1e6 if durations else None,
        tokens_per_s_per_gpu=GLOBAL_BATCH * SEQ / (iteration_ms / 1e3) / RANKS,
        mfu=None,
        peak_gib=max(m.allocated_bytes or 0 for m in summary.memory) / 2**30,
        wall_s=wall_s,
        note=f"logged iterations {STEADY_FROM}..{ITERS}: {', '.join(f'{ms:.1f}' for ms in steady)} ms",
    )


CASES = [Case("megatron-lm", name, RANKS, partial(_run, name, args)) for name, args in CONFIGS.items()]
