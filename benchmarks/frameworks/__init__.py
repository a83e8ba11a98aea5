"""The framework configurations `benchmarks/bench_frameworks.py` runs: one module per stack
(torchtitan.py, megatron.py, deepspeed.py, huggingface.py, lightning.py), each defining

    CASES: list[Case]

A case runs the stack unmodified under `phantora trace` and reads the figures back from the
framework's own log lines and phantora's trace."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable


@dataclass(frozen=True)
class Row:
    """One line of the benchmark table. A figure the stack does not report is None."""
    stack: str
    config: str
    ranks: int
    step_ms: float | None          # simulated step time (mean over steps 2..N, from the trace)
    tokens_per_s_per_gpu: float | None
    mfu: float | None              # fraction, 0..1
    peak_gib: float | None         # peak allocated memory on the busiest GPU
    wall_s: float                  # wall time of the whole simulated run on this machine
    note: str = ""                 # e.g. "published: 5,762 tokens/s/GPU, 82.4 GiB"


@dataclass(frozen=True)
class Case:
    stack: str
    config: str
    ranks: int
    run: Callable[[Path], Row]     # called with a fresh working directory
