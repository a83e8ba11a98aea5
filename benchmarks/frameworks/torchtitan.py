"""TorchTitan 0.3.0 configurations, each run unmodified under phantora as run_train.sh runs it:

    torchrun --nproc-per-node N -m torchtitan.train --module llama3 --config CONFIG [overrides]

Needs the CUDA build of torch 2.14 with torchtitan 0.3.0: $PHANTORA_CUDA_TORCH_PYTHON, or the
environment the test suite builds under phantora's cache dir (tests/conftest.py,
frameworks_cuda_python). The tokenizer and c4_test data are generated stand-ins
(tests/frameworks/torchtitan/assets.py). Figures: step time from the trace (distance between
the last fused AdamW kernels of consecutive steps, mean over steps 2..N on rank 0), tokens/s/GPU and
MFU from TorchTitan's own last log line, peak allocated memory from the trace.

Llama 3 8B is TorchTitan's published benchmark configuration (benchmarks/
llama3_h100_202412_torchtitan.md, Table 1: FSDP on 8 GPUs, local batch 2, seq 8192, selective AC,
no torch.compile: 5,762 tokens/s/GPU, 82.4 GiB) on the H100 96 GB at 500 W it was measured on
(`--gpu h100-96gb`). 0.3.0's llama3 uses FlexAttention with per-document causal masks (sdpa is
no longer accepted for language models); the benchmark of Dec 2024 ran SDPA causal.
"""

from __future__ import annotations

import statistics
from functools import partial
from pathlib import Path

from benchmarks.frameworks import Case, Row
from tests.frameworks.torchtitan.run import GiB, cuda_python, peak_memory, step_ends_us, torchtitan

STEPS = 5
# TorchTitan's own flag for eager execution: pipeline parallelism requires it; the other eager rows
# predate phantora replaying collectives captured in CUDA graphs, and keep the figures comparable
EAGER = "--training.disable_cuda_graphs"


def _run(workdir: Path, *, name: str, config: str, ranks: int, overrides: tuple[str, ...], gpu: str | None = None,
         note: str = "", nnodes: int = 1, module: str = "llama3", options: tuple[str, ...] = ()) -> Row:
    options = ("--quiet",) + (("--gpu", gpu) if gpu else ()) + (("--ranks", "auto") if nnodes > 1 else ()) + options
    run = torchtitan(workdir, cuda_python(), ranks // nnodes, "--training.steps", str(STEPS), "--metrics.log_freq", "1",
                     *overrides, config=config, phantora_options=options, timeout=3600, nnodes=nnodes, module=module)
    if run.proc.returncode != 0:
        raise RuntimeError(f"exit {run.proc.returncode}: {run.output[-1500:]}")
    lines = run.steps()
    last = max(lines, key=lambda s: s.step)
    ends = step_ends_us(run.trace, 0, STEPS)
    step_ms = statistics.mean(b - a for a, b in zip(ends, ends[1:])) / 1e3 if len(ends) > 1 else None
    peaks = peak_memory(run.trace)
    peak = max((a for _, a, _ in peaks if a is not None), default=None)
    reserved = max((r for _, _, r in peaks if r is not None), default=None)
    if reserved is not None:
        note = f"{note}; reserved {reserved / GiB:.1f} GiB" if note else f"reserved {reserved / GiB:.2f} GiB"
    return Row("torchtitan", name, ranks, step_ms, last.tps, last.mfu / 100,
               None if peak is None else peak / GiB, run.wall_s, note)


def _case(name: str, ranks: int, *overrides: str, config: str = "llama3_debugmodel", gpu: str | None = None,
          note: str = "", nnodes: int = 1, module: str = "llama3", options: tuple[str, ...] = ()) -> Case:
    return Case("torchtitan", name, ranks, partial(_run, name=name, config=config, ranks=ranks, overrides=overrides, gpu=gpu,
                                                   note=note, nnodes=nnodes, module=module, options=options))


LLAMA_8B = ("--training.local_batch_size", "2", "--training.seq_len", "8192", "--hf_assets_path",
            "./tests/assets/tokenizer", "--dataloader.dataset", "c4_test")


CASES: list[Case] = [
    _case("debugmodel, default (SAC, CUDA graphs)", 1),
    _case("debugmodel, full AC (CUDA graphs)", 1, "activation-checkpoint:full"),
    _case("debugmodel, no AC, eager", 1, EAGER, "activation-checkpoint:none"),
    _case("debugmodel FSDP", 2, EAGER),
    _case("debugmodel FSDP, CUDA graphs (default)", 2),
    _case("debugmodel FSDP 2 x TP 2", 4, EAGER, "--parallelism.tensor_parallel_degree", "2"),
    _case("debugmodel PP 1F1B", 2, EAGER, "--parallelism.pipeline_parallel_degree", "2",
          "--parallelism.pipeline_parallel_schedule", "1F1B"),
    _case("debugmodel PP Interleaved1F1B", 2, EAGER, "--parallelism.pipeline_parallel_degree", "2"),
    _case("debugmodel FSDP", 8, EAGER),
    # --ranks auto: eight rank processes of ~2.8 GB each were OOM-killed on a 23 GB machine shared
    # with other jobs; FSDP's ranks are mirrors of each other, so representative ranks stand for them
    _case("Llama 3 8B FSDP, bs 2, seq 8192, SAC (h100-96gb)", 8, EAGER, *LLAMA_8B, config="llama3_8b",
          gpu="h100-96gb", note="published: 5,762 tokens/s/GPU, 82.4 GiB", options=("--ranks", "auto")),
    # the same with TorchTitan's torch.compile (model and loss; published Table 1: FSDP + compile)
    _case("Llama 3 8B FSDP, compiled (h100-96gb)", 8, EAGER, "--compile.enable", *LLAMA_8B, config="llama3_8b",
          gpu="h100-96gb", note="published: 6,667 tokens/s/GPU, 77.0 GiB", options=("--ranks", "auto")),
    # 16 nodes through TorchTitan's own torchrun line, with representative ranks (docs/scale.md)
    _case("Llama 3 8B FSDP, 16 nodes, --ranks auto (h100-96gb)", 128, EAGER, *LLAMA_8B, config="llama3_8b",
          gpu="h100-96gb", nnodes=16, note="published: 5,605 tokens/s/GPU, 67.0 GiB"),
    _case("Llama 3 8B FSDP, compiled, 16 nodes, --ranks auto (h100-96gb)", 128, EAGER, "--compile.enable", *LLAMA_8B,
          config="llama3_8b", gpu="h100-96gb", nnodes=16, note="published: 6,514 tokens/s/GPU, 62.0 GiB"),
    # Mixture-of-Experts (docs/moe.md): the all-to-all token dispatcher reads split sizes on the host,
    # which TorchTitan's CUDA graphs refuse, so these run eagerly as TorchTitan's error asks
    _case("DeepSeek-V3 debug, EP 8 x FSDP 8", 8, EAGER, "--parallelism.expert_parallel_degree", "8",
          module="deepseek_v3", config="deepseek_v3_debugmodel"),
    _case("DeepSeek-V3 debug, EP 8 x FSDP 8, --routing zipf:1.2", 8, EAGER, "--parallelism.expert_parallel_degree", "8",
          module="deepseek_v3", config="deepseek_v3_debugmodel", options=("--routing", "zipf:1.2")),
    _case("Qwen3-MoE debug, EP 4 x FSDP 8", 8, EAGER, "--parallelism.expert_parallel_degree", "4",
          module="qwen3", config="qwen3_moe_debug"),
]
