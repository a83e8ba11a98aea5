"""Hugging Face Trainer and Accelerate configurations too large for CI, run unmodified under
`phantora trace` with the stand-in scripts of tests/frameworks/huggingface/ (models from
`from_config`, synthetic token ids: nothing is downloaded). Needs transformers and accelerate
in the test environment (the `test` extras) and nothing else.

Step time is the mean of the trace's steps after the first (step markers at optimizer.step),
tokens/s/GPU = per-GPU batch x sequence / step time, MFU and peak allocated memory from
`phantora summary`; the note gives the figures Trainer itself printed (train_runtime,
train_samples_per_second) or the loop's own step line.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.frameworks import Case, Row

ROOT = Path(__file__).resolve().parents[2]
HF = ROOT / "tests" / "frameworks" / "huggingface"
BIN = Path(sys.executable).parent
STACK = "huggingface"


def _trace(cwd: Path, command: list[str], env: dict[str, str] | None = None
           ) -> tuple[subprocess.CompletedProcess, Path, float]:
    out = cwd / "run.json"
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=path, **(env or {}))
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "phantora.cli", "trace", "--quiet", "-o", str(out), "--", *command],
                          cwd=cwd, capture_output=True, text=True, timeout=3600, env=env)
    wall = time.monotonic() - start
    if proc.returncode != 0:
        raise RuntimeError(f"exit {proc.returncode}: {(proc.stderr or proc.stdout)[-1500:]}")
    return proc, out, wall


def _row(config: str, ranks: int, tokens_per_gpu_step: int, out: Path, wall: float, note: str) -> Row:
    from phantora.query import load
    from phantora.query.summary import summarize

    with load(out, engine="builtin") as db:
        s = summarize(db)
    step_ms = s.steps.stats.mean_ns / 1e6 if s.steps.stats else None
    peak = max((m.allocated_bytes or 0 for m in s.memory), default=0) / (1 << 30)
    return Row(STACK, config, ranks, step_ms, tokens_per_gpu_step / (step_ms / 1e3) if step_ms else None,
               s.overall.mfu if s.overall else None, peak, wall, note)


def _launcher(ranks: int) -> list[str]:
    return [] if ranks == 1 else [str(BIN / "torchrun"), "--nproc-per-node", str(ranks)]


def trainer(config: str, ranks: int, model: str, batch: int, seq: int, steps: int, *extra: str,
            data_parallel: bool = False) -> Case:
    """torchrun with `ranks` processes; one process on one GPU (CUDA_VISIBLE_DEVICES=0); or, with
    data_parallel, plain `python` seeing all `ranks` GPUs, where Trainer uses nn.DataParallel."""
    def run(cwd: Path) -> Row:
        python = [sys.executable] if ranks == 1 or data_parallel else []
        env = {"CUDA_VISIBLE_DEVICES": "0"} if ranks == 1 else None
        launcher = [] if data_parallel else _launcher(ranks)
        proc, out, wall = _trace(cwd, [*launcher, *python, str(HF / "train_trainer.py"), "--model", model,
                                       "--batch", str(batch), "--seq", str(seq), "--steps", str(steps), *extra], env)
        metrics = json.loads(re.search(r"train_result (\{[^{}]*\})", proc.stdout).group(1))
        note = (f"Trainer: train_runtime {metrics['train_runtime']:.4f} s, "
                f"{metrics['train_samples_per_second']:,.1f} samples/s")
        return _row(config, ranks, batch * seq, out, wall, note)  # batch: per GPU, as Trainer's is

    return Case(STACK, config, ranks, run)


def accelerate(config: str, ranks: int, batch: int, samples: int, *launch: str, model: tuple[str, ...] = ()) -> Case:
    def run(cwd: Path) -> Row:
        script = [str(HF / "train_accelerate.py"), "--batch", str(batch), "--samples", str(samples), *model]
        command = [sys.executable, *script] if ranks == 1 else [str(BIN / "accelerate"), "launch", *launch, *script]
        proc, out, wall = _trace(cwd, command)
        last = re.findall(r"rank 0 step \d+: .* time (\S+) ms (\S+) tokens/s", proc.stdout)[-1]
        return _row(config, ranks, batch * 512, out, wall, f"loop's last step: {last[0]} ms, {last[1]} tokens/s")

    return Case(STACK, config, ranks, run)


CASES: list[Case] = [
    # GPT-2 small (124M) as Hugging Face ships it, on one GPU: batch 8 x 1024
    trainer("Trainer GPT-2 124M, 1 GPU", 1, "gpt2", 8, 1024, 4, "--layers", "12"),
    # plain `python train.py` on an 8-GPU node: Trainer wraps the model in nn.DataParallel
    trainer("Trainer GPT-2 DataParallel, 8 GPUs", 8, "gpt2", 4, 512, 3, data_parallel=True),
    # FSDP1 (Trainer's fsdp_config version 1, deprecated but supported) is left out of CI for time
    trainer("Trainer Llama FSDP1, 2 GPUs", 2, "llama", 4, 512, 3, "--fsdp", "full_shard auto_wrap",
            "--fsdp-version", "1"),
    trainer("Trainer GPT-2 124M DDP, 8 GPUs", 8, "gpt2", 8, 1024, 3, "--layers", "12"),
    trainer("Trainer Llama 0.85B FSDP2 + GC, 8 GPUs", 8, "llama", 4, 2048, 3, "--layers", "16", "--hidden", "2048",
            "--gradient-checkpointing", "--fsdp", "full_shard auto_wrap", "--fsdp-version", "2"),
    # Mixture-of-Experts from config (train_trainer.py's mixtral and qwen3_moe shapes, 8 layers)
    trainer("Trainer Mixtral-style FSDP2, grouped_mm, 8 GPUs", 8, "mixtral", 4, 2048, 3, "--layers", "8",
            "--experts-implementation", "grouped_mm", "--fsdp", "full_shard auto_wrap", "--fsdp-version", "2"),
    trainer("Trainer Qwen3-MoE-style FSDP2, eager experts, 8 GPUs", 8, "qwen3_moe", 4, 2048, 3, "--layers", "8",
            "--experts-implementation", "eager", "--fsdp", "full_shard auto_wrap", "--fsdp-version", "2"),
    accelerate("Accelerator loop Llama, 1 GPU", 1, 4, 20),
    accelerate("accelerate launch FSDP2 Llama 0.85B, 8 GPUs", 8, 4, 96, "--config_file", str(HF / "fsdp2.yaml"),
               "--num_processes", "8", model=("--layers", "16", "--hidden", "2048")),
]
