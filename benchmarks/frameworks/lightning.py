"""Lightning 2.6 configurations too large for CI, run unmodified under phantora: a 0.95B-parameter
Llama-style LightningModule (tests/frameworks/lightning/train_llama.py, dim 2048, 16 layers, vocab
32000, batch 4 x 2048 tokens) with `Trainer(accelerator="gpu", precision="bf16-mixed")` on 1 GPU
and on 8: DDP started with plain `python` (Lightning's own launcher starts ranks 1-7), DDP under
torchrun, FSDPStrategy, and ModelParallelStrategy with fully_shard (FSDP2).

Needs the test environment (lightning from the test extras, CPU build of torch). tokens/s per GPU
and MFU are Lightning's own ThroughputMonitor figures (rank 0's CSVLogger file, last step); the
step time is the trace's median over steps 2..N; peak memory the trace's busiest GPU.
"""

from __future__ import annotations

import csv
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.frameworks import Case, Row

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests" / "frameworks" / "lightning" / "train_llama.py"
SIZES = ("--dim", "2048", "--layers", "16", "--heads", "16", "--vocab", "32000", "--seq", "2048", "--batch", "4",
         "--steps", "5")


def _run(config: str, ranks: int, args: tuple[str, ...], torchrun: bool = False) -> Case:
    def run(work: Path) -> Row:
        from phantora.query import load
        from phantora.query.summary import summarize

        trace, logs = work / "run.json", work / "logs"
        launcher = ((str(Path(sys.executable).with_name("torchrun")), "--nproc-per-node", str(ranks)) if torchrun
                    else (sys.executable,))
        cmd = [sys.executable, "-m", "phantora.cli", "trace", "-o", str(trace), "--", *launcher, str(SCRIPT),
               "--devices", str(ranks), "--root", str(logs), *SIZES, *args]
        started = time.monotonic()
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=3600)
        wall = time.monotonic() - started
        if proc.returncode != 0:
            raise RuntimeError(f"exit {proc.returncode}: {proc.stderr[-2000:]}")
        with load(trace) as db:
            summary = summarize(db)
        (metrics,) = logs.glob("llama/version_*/metrics.csv")
        with metrics.open() as f:
            last = [r for r in csv.DictReader(f) if r.get("train/device/items_per_sec")][-1]
        stats = summary.steps.stats
        return Row(
            stack="lightning", config=config, ranks=ranks,
            # the median: step 2's marker interval is short by the extra host time of step 1
            # (optimizer state init), so the GPU's tail after step 1 is shorter than later ones
            step_ms=None if stats is None else stats.median_ns / 1e6,
            tokens_per_s_per_gpu=float(last["train/device/items_per_sec"]),
            mfu=float(last["train/device/mfu"]),
            peak_gib=max(m.allocated_bytes or 0 for m in summary.memory) / 2**30,
            wall_s=wall,
            note="step: median of steps 2-N; tokens/s, MFU: Lightning's ThroughputMonitor",
        )

    return Case("lightning", config, ranks, run)


CASES: list[Case] = [
    _run("0.95B, 1 GPU", 1, ()),
    _run("0.95B, DDP (Lightning launcher)", 8, ()),
    _run("0.95B, DDP (torchrun)", 8, (), torchrun=True),
    _run("0.95B, FSDPStrategy", 8, ("--strategy", "fsdp")),
    _run("0.95B, ModelParallelStrategy (FSDP2)", 8, ("--strategy", "model_parallel")),
]
