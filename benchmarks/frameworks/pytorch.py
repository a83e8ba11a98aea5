"""Plain PyTorch: examples/moe_train.py (a Mixtral-style MoE model; Mixtral's eager expert loop or
grouped GEMMs; expert parallel over the ranks with all_to_all of uneven sizes) on 8 simulated
H100s under `phantora trace --nproc-per-node 8`. Step time from the trace (step markers, mean of
steps 2..N), tokens/s per GPU from it; MFU and peak memory from the trace's summary; the
example's own last step line in the note.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from functools import partial
from pathlib import Path

from benchmarks.frameworks import Case, Row

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "moe_train.py"
RANKS = 8
BATCH, SEQ = 4, 2048
MODEL = ("--layers", "8", "--dim", "2048", "--expert-hidden", "5632", "--experts", "16", "--top-k", "2",
         "--batch", str(BATCH), "--seq", str(SEQ), "--steps", "4", "--ep", str(RANKS))


def _run(config: str, extra: tuple[str, ...], options: tuple[str, ...], work: Path) -> Row:
    from phantora.query import load
    from phantora.query.summary import summarize

    out = work / "run.json"
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "phantora.cli", "trace", "--quiet", "--nproc-per-node", str(RANKS),
                           *options, "-o", str(out), "--", sys.executable, str(EXAMPLE), *MODEL, *extra],
                          cwd=ROOT, capture_output=True, text=True, timeout=3600)
    wall = time.monotonic() - start
    if proc.returncode != 0:
        raise RuntimeError(f"exit {proc.returncode}: {proc.stderr[-1500:]}")
    with load(out, engine="builtin") as db:
        s = summarize(db)
    step_ms = s.steps.stats.mean_ns / 1e6 if s.steps.stats else None
    last = re.findall(r"^step \d+: .*$", proc.stdout, re.M)[-1]
    imbalance = re.findall(r"max/mean ([\d.]+)", proc.stderr)
    note = f"example: {last.split(': ', 1)[1]}" + (f"; routing max/mean {max(map(float, imbalance)):.2f}"
                                                    if imbalance else "")
    return Row("pytorch", config, RANKS, step_ms, BATCH * SEQ / (step_ms / 1e3) if step_ms else None,
               s.overall.mfu if s.overall else None, max((m.allocated_bytes or 0) for m in s.memory) / 2**30, wall, note)


def _case(config: str, *extra: str, options: tuple[str, ...] = ()) -> Case:
    return Case("pytorch", config, RANKS, partial(_run, config, extra, options))


CASES: list[Case] = [
    _case("moe_train.py 16 experts top-2, EP8, eager loop"),
    _case("moe_train.py 16 experts top-2, EP8, grouped GEMM", "--grouped"),
    _case("moe_train.py 16 experts top-2, EP8, grouped GEMM, --routing zipf:1.2", "--grouped",
          options=("--routing", "zipf:1.2")),
]
