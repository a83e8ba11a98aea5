"""Running TorchTitan 0.3.0 unmodified under `phantora trace`, as its run_train.sh does
(`torchrun --nproc-per-node N -m torchtitan.train --module llama3 --config CONFIG [overrides]`),
and reading back what a user reads: TorchTitan's own step log lines and phantora's trace. Shared
by tests/frameworks/test_torchtitan.py and benchmarks/frameworks/torchtitan.py.

The working directory gets the stand-in tokenizer and dataset (assets.py): the wheel ships
neither, and llama3_debugmodel reads them from ./tests/assets as in a checkout of the repository.
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from tests.frameworks.torchtitan.assets import write_assets

ROOT = Path(__file__).resolve().parents[3]

GiB = 1024**3
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
# TorchTitan's MetricsProcessor.log line (components/metrics.py), colours stripped
_STEP = re.compile(r"step:\s*(\d+)\s+loss:\s*(-?[\d.]+)\s+grad_norm:\s*([\d.]+)\s+memory:\s*([\d.]+)GiB\([\d.]+%\)\s+"
                   r"tps:\s*([\d,]+)\s+tflops:\s*([\d,.]+)\s+mfu:\s*([\d.]+)%")


@dataclass(frozen=True)
class StepLine:
    step: int
    loss: float
    grad_norm: float
    memory_gib: float  # max reserved, as TorchTitan prints it
    tps: float  # tokens/s per device (divided by the non-data-parallel degree)
    tflops: float
    mfu: float  # percent


@dataclass(frozen=True)
class Run:
    proc: subprocess.CompletedProcess
    trace: Path
    workdir: Path
    wall_s: float

    @property
    def output(self) -> str:
        return _ANSI.sub("", self.proc.stdout + self.proc.stderr)

    def steps(self) -> list[StepLine]:
        return [StepLine(int(m[0]), float(m[1]), float(m[2]), float(m[3]), float(m[4].replace(",", "")),
                         float(m[5].replace(",", "")), float(m[6])) for m in _STEP.findall(self.output)]

    def detail(self) -> str:
        return f"\n--- output (last 6000 chars)\n{self.output[-6000:]}"


def cuda_python() -> str:
    """The CUDA build of torch 2.14 with torchtitan 0.3.0: $PHANTORA_CUDA_TORCH_PYTHON or the
    environment tests/conftest.py builds under phantora's cache dir."""
    env = os.environ.get("PHANTORA_CUDA_TORCH_PYTHON")
    if env:
        return env
    from phantora.cache import cache_dir

    python = str(cache_dir() / "test-venv-cuda-torch" / "bin" / "python")
    probe = subprocess.run([python, "-c", "import torchtitan"], capture_output=True, text=True)
    if probe.returncode != 0:
        raise RuntimeError(f"{python} has no torchtitan: run tests/frameworks/test_torchtitan.py once to build it, "
                           "or set PHANTORA_CUDA_TORCH_PYTHON")
    return python


def torchtitan(workdir: Path, python: str, nproc: int, *overrides: str, config: str = "llama3_debugmodel",
               phantora_options: tuple[str, ...] = (), timeout: float = 1800, nnodes: int = 1,
               module: str = "llama3") -> Run:
    """`phantora trace [options] -o workdir/run.json -- torchrun --nproc-per-node N -m torchtitan.train
    --module MODULE --config CONFIG OVERRIDES...` from workdir, with the stand-in assets in it."""
    workdir.mkdir(parents=True, exist_ok=True)
    write_assets(workdir)
    trace = workdir / "run.json"
    torchrun = str(Path(python).parent / "torchrun")
    cmd = [sys.executable, "-m", "phantora.cli", "trace", *phantora_options, "-o", str(trace), "--",
           torchrun, *(("--nnodes", str(nnodes)) if nnodes > 1 else ()), "--nproc-per-node", str(nproc), "-m",
           "torchtitan.train", "--module", module, "--config",
           config, *overrides]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    # nothing is fetched from the Hub; the datasets cache is this test process's, not the user's (one
    # directory for all its runs: the same environment, so a warm fork server serves them all)
    hf_home = Path(tempfile.gettempdir()) / f"phantora-tests-hf-{os.environ.get('PYTEST_XDIST_WORKER', 'main')}"
    env.update(HF_HOME=str(hf_home), HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1")
    start = time.monotonic()
    proc = subprocess.run(cmd, cwd=workdir, capture_output=True, text=True, timeout=timeout, env=env)
    return Run(proc, trace, workdir, time.monotonic() - start)


def optimizer_kernel_ends_us(trace: Path, rank: int) -> list[float]:
    """End times (us) of the fused AdamW kernels on one rank, in trace order: one per step and
    model part (an interleaved pipeline schedule holds two stages, each with its optimizer)."""
    from phantora.trace.check import load_chrome_trace

    events = load_chrome_trace(trace)["traceEvents"]
    return sorted(e["ts"] + e["dur"] for e in events if e.get("ph") == "X" and e.get("pid") == rank + 1
                  and e["name"].startswith("multi_tensor_apply_kernel<FusedAdam"))


def step_ends_us(trace: Path, rank: int, steps: int) -> list[float]:
    """When each optimizer step ended on one rank (us): the last fused AdamW kernel of each step."""
    ends = optimizer_kernel_ends_us(trace, rank)
    if not ends or len(ends) % steps:
        raise AssertionError(f"rank {rank}: {len(ends)} fused AdamW kernels for {steps} steps")
    per = len(ends) // steps
    return ends[per - 1::per]


def peak_memory(trace: Path) -> list[tuple[int, float, float]]:
    """(rank, peak allocated bytes, peak reserved bytes) per GPU from phantora's summary."""
    from phantora.query import load
    from phantora.query.summary import summarize

    s = summarize(load(trace))
    return [(m.rank, m.allocated_bytes, m.reserved_bytes) for m in s.memory]
