"""DeepSpeed 0.19.8 on 8 simulated H100s: ZeRO stage 1, 2 and 3 in bf16, launched with torchrun
and with DeepSpeed's own `deepspeed` launcher (`--num_gpus 8`), unmodified: the user program and ds_config files of the CI suite
(tests/frameworks/deepspeed/), with a larger model (~0.2B parameters, seq 1024).

Runs in the test environment (torch 2.13 CPU build with deepspeed installed, DS_BUILD_OPS=0).
Step time, MFU and peak memory come from phantora's trace (summary: steps 2..N, MFU of the
kernels' FLOPs against the GPU's dense bf16 peak); tokens/s/GPU is micro batch x sequence over
the step. Each case checks what the CI tests check (every step taken, no step skipped, FusedAdam's
kernels in every step of every rank) and fails otherwise.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

from benchmarks.frameworks import Case, Row
from phantora.query import load
from phantora.query.summary import summarize
from tests.frameworks.test_deepspeed import optimizer_steps, run_deepspeed

RANKS = 8
STEPS = 4
SEQ = 1024
MODEL = ("--vocab", "32000", "--dim", "1024", "--layers", "8", "--heads", "16", "--seq", str(SEQ))


def _run(config: str, launcher: str, tmp: Path, moe: tuple[str, ...] = ()) -> Row:
    run = run_deepspeed(tmp, config, RANKS, launcher, model=MODEL + moe, steps=STEPS, timeout=1800)
    if run.proc.returncode != 0:
        raise RuntimeError(f"exit {run.proc.returncode}: {run.proc.stderr.strip().splitlines()[-1:]}")
    for rank, r in run.ranks.items():
        if r.global_steps != STEPS or r.skipped_steps:
            raise RuntimeError(f"rank {rank}: {r.global_steps} steps, {r.skipped_steps} skipped")
    # one multi_tensor_adam per step (MoE: one per parameter group, expert and shared)
    if len(run.ranks) != RANKS or any(len(s) != STEPS or any(c != 1 if not moe else c < 1 for c, _, _ in s)
                                      for s in optimizer_steps(run.trace).values()):
        raise RuntimeError("FusedAdam's multi_tensor_adam missing from a step")
    summary = summarize(load(run.trace))
    step_ms = summary.steps.stats.mean_ns / 1e6
    tokens = run.config["train_micro_batch_size_per_gpu"] * run.config.get("gradient_accumulation_steps", 1) * SEQ
    peak = max(m.allocated_bytes for m in summary.memory) / 2**30
    sps = run.samples_per_sec.get(STEPS)
    note = f"DeepSpeed: {sps:,.0f} samples/s" if sps else ""
    name = f"{config.removesuffix('.json')} bf16, {launcher} launcher" if launcher == "deepspeed" \
        else f"{config.removesuffix('.json')} bf16, {launcher}"
    if moe:
        name += ", MoE " + " ".join(moe).replace("--", "")
    return Row("deepspeed", name, RANKS, step_ms,
               tokens / (step_ms / 1e3), summary.overall.mfu, peak, run.wall_s, note)


CASES: list[Case] = [
    Case("deepspeed", "ds_zero1 bf16, torchrun", RANKS, partial(_run, "ds_zero1.json", "torchrun")),
    Case("deepspeed", "ds_zero2 bf16, torchrun", RANKS, partial(_run, "ds_zero2.json", "torchrun")),
    Case("deepspeed", "ds_zero3 bf16, torchrun", RANKS, partial(_run, "ds_zero3.json", "torchrun")),
    Case("deepspeed", "ds_zero2 bf16, deepspeed launcher", RANKS, partial(_run, "ds_zero2.json", "deepspeed")),
    Case("deepspeed", "ds_zero3 bf16, deepspeed launcher", RANKS, partial(_run, "ds_zero3.json", "deepspeed")),
    # DeepSpeed's MoE layer: 8 experts, top-2 gating, expert parallel 8
    Case("deepspeed", "ds_zero2 bf16, torchrun, MoE 8 experts top-2 EP8", RANKS,
         partial(_run, "ds_zero2.json", "torchrun", moe=("--moe-experts", "8", "--ep-size", "8", "--top-k", "2"))),
]
