"""Regenerate the sample traces in this folder: one per example, small enough to open at once.

    python sample_traces/regenerate.py            # all of them
    python sample_traces/regenerate.py ddp pp     # some of them

Each runs `phantora trace` on a bundled example with reduced sizes (a few steps of a small
model), so the files stay under a few MB. What each shows: sample_traces/README.md.
"""

from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
MODEL = ["--layers", "4", "--embd", "512", "--heads", "8", "--seq", "512"]


@dataclass(frozen=True)
class Sample:
    name: str
    script: str
    args: tuple[str, ...]
    nproc: int = 1
    options: tuple[str, ...] = ()  # phantora trace options


SAMPLES = [
    Sample("gpt_1gpu", "examples/gpt_train.py", (*MODEL, "--batch", "4", "--steps", "3")),
    Sample("ddp_2gpu", "examples/ddp_train.py", (*MODEL, "--batch", "4", "--steps", "3", "--accum", "2"), 2),
    Sample("fsdp2_4gpu", "examples/fsdp_train.py", (*MODEL, "--batch", "4", "--steps", "3"), 4),
    Sample("tp_fsdp2_4gpu", "examples/tp_fsdp_train.py", (*MODEL, "--tp", "2", "--batch", "4", "--steps", "3"), 4),
    Sample("pp_1f1b_2gpu", "examples/pp_train.py",
           (*MODEL, "--schedule", "1f1b", "--batch", "8", "--microbatches", "4", "--steps", "3"), 2),
    Sample("moe_ep_4gpu", "examples/moe_train.py",
           ("--layers", "4", "--dim", "512", "--expert-hidden", "1024", "--seq", "512", "--batch", "4", "--steps", "3",
            "--grouped", "--ep", "4"), 4, ("--routing", "zipf:1.2")),
]


def regenerate(sample: Sample) -> Path:
    out = HERE / f"{sample.name}.json.gz"
    cmd = [sys.executable, "-m", "phantora.cli", "trace", "--nproc-per-node", str(sample.nproc), *sample.options,
           "-o", str(out), "--", sys.executable, sample.script, *sample.args]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        raise SystemExit(f"{sample.name}: phantora trace failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    print(f"{sample.name}: {out.stat().st_size / 1e6:.2f} MB in {time.perf_counter() - t0:.1f} s", flush=True)
    return out


def main(names: list[str]) -> None:
    unknown = set(names) - {s.name.split("_")[0] for s in SAMPLES} - {s.name for s in SAMPLES}
    if unknown:
        raise SystemExit(f"unknown sample(s) {sorted(unknown)}; choose from {[s.name for s in SAMPLES]}")
    for s in SAMPLES:
        if not names or s.name in names or s.name.split("_")[0] in names:
            regenerate(s)


if __name__ == "__main__":
    main(sys.argv[1:])
