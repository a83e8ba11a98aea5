"""Megatron-Core 0.19.2 on 8 simulated H100s (one DGX node): the stand-in pretrain_gpt.py
(tests/frameworks/megatron/pretrain_gpt.py; megatron.core public APIs only, local layer spec,
bf16, Megatron DDP + distributed optimizer with overlapped gradient reduce-scatter and parameter
all-gather) under `phantora trace -- torchrun --nproc-per-node 8`, with DP, TP, PP and TP x PP x DP.

Needs the CUDA build of torch 2.14 with megatron-core installed (pip install
--ignore-requires-python megatron-core==0.19.2): $PHANTORA_CUDA_TORCH_PYTHON, else the environment
the test suite builds under phantora's cache dir.

The model is a 1.0B-parameter GPT (16 layers, width 2048, 16 heads, sequence 2048, vocab 50304,
untied output layer), micro-batch 1, 8 microbatches per data-parallel rank per iteration.
Tokens/s/GPU and MFU are from the script's own log line (Megatron's FLOP count, against the
H100's dense bf16 peak); the step time is the trace's mean over steps 2..N; peak memory is the
busiest GPU's, from the trace.
"""

from __future__ import annotations

import os
from functools import partial
from pathlib import Path

from benchmarks.frameworks import Case, Row
from interpose.device.shim_build import cache_dir
from phantora.query import load
from phantora.query.summary import summarize
from tests.frameworks.megatron_run import GPTConfig, run_megatron

MODEL = dict(layers=16, hidden=2048, heads=16, seq=2048, vocab=50304, micro_batch=1, microbatches=8, iters=3)
RANKS = 8


def _python() -> str:
    python = os.environ.get("PHANTORA_CUDA_TORCH_PYTHON")
    if python:
        return python
    python = str(cache_dir() / "test-venv-cuda-torch" / "bin" / "python")
    if not Path(python).exists():
        raise RuntimeError(f"{python} is missing: run tests/frameworks/test_megatron.py once (it builds it) "
                           "or set PHANTORA_CUDA_TORCH_PYTHON")
    return python


def _run(config: str, cfg: GPTConfig, work: Path) -> Row:
    run = run_megatron(work, _python(), RANKS, cfg, timeout=1800)
    if run.proc.returncode != 0 or len(run.iterations) != cfg.iters:
        raise RuntimeError(f"exit {run.proc.returncode}, {len(run.iterations)} iteration lines: "
                           f"{run.proc.stderr[-1500:]}")
    skipped = [i.n for i in run.iterations if not i.update_successful]
    if skipped:
        raise RuntimeError(f"optimizer step skipped in iterations {skipped}")
    summary = summarize(load(run.trace))
    steady = run.iterations[1:]
    tflops = sum(i.tflops_per_gpu for i in steady) / len(steady)
    return Row(
        stack="megatron", config=config, ranks=RANKS,
        step_ms=summary.steps.stats.mean_ns / 1e6 if summary.steps.stats else None,
        tokens_per_s_per_gpu=sum(i.tokens_per_s_per_gpu for i in steady) / len(steady),
        mfu=tflops * 1e12 / summary.peak_flops if summary.peak_flops else None,  # dense bf16 peak of the simulated GPU
        peak_gib=max(m.allocated_bytes or 0 for m in summary.memory) / 2**30,
        wall_s=run.wall_s,
        note=f"logged step {sum(i.elapsed_ms for i in steady) / len(steady):.1f} ms, {tflops:.0f} TFLOP/s/GPU",
    )


def _case(config: str, **parallel: int) -> Case:
    cfg = GPTConfig(**MODEL, **parallel)
    return Case("megatron", config, RANKS, partial(_run, config, cfg))


CASES: list[Case] = [
    _case("GPT 1.0B, DP8 (distributed optimizer)"),
    _case("GPT 1.0B, TP8", tp=8),
    _case("GPT 1.0B, PP8 (1F1B)", pp=8),
    _case("GPT 1.0B, TP2 x PP2 x DP2", tp=2, pp=2),
    # Mixture-of-Experts: 8 experts top-2 per layer (SequentialMLP, alltoall token dispatcher)
    _case("MoE 16 x 8 experts top-2, EP8", experts=8, topk=2, ep=8),
    # MoE with TP needs sequence parallelism, which the local spec's torch norms refuse (Apex or
    # Transformer Engine norms needed): expert parallel over data parallel instead
    _case("MoE 16 x 8 experts top-2, EP4 (expert DP 2)", experts=8, topk=2, ep=4),
]
