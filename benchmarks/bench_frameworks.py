"""The framework conformance configurations too large for CI (8 ranks, Llama 3 8B), run
unmodified under phantora, as one table.

    python benchmarks/bench_frameworks.py [--stack torchtitan,megatron,...] [--config SUBSTRING]

Each stack's cases live in benchmarks/frameworks/<stack>.py (see its docstring for the
environment it needs: TorchTitan and Megatron-Core run on the CUDA build of torch 2.14, built
by the test suite under phantora's cache dir). Columns: stack, config, ranks, simulated step
time, tokens/s per GPU, MFU, peak allocated memory on the busiest GPU, and the wall time of the
whole simulated run on this machine.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import tempfile
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.frameworks import Case, Row  # noqa: E402

STACKS = ("torchtitan", "megatron", "megatron_lm", "deepspeed", "huggingface", "lightning", "pytorch")


def _cases(stacks: list[str]) -> list[Case]:
    cases: list[Case] = []
    for stack in stacks:
        try:
            module = importlib.import_module(f"benchmarks.frameworks.{stack}")
        except ModuleNotFoundError as e:
            if e.name == f"benchmarks.frameworks.{stack}":
                continue  # no cases for this stack yet
            raise
        cases.extend(module.CASES)
    return cases


def _fmt(x: float | None, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--stack", default=",".join(STACKS), help="comma-separated stacks to run")
    ap.add_argument("--config", default="", help="only configs whose name contains this")
    args = ap.parse_args()
    cases = [c for c in _cases(args.stack.split(",")) if args.config in c.config]
    if not cases:
        print("no cases selected", file=sys.stderr)
        return 2
    from rich.console import Console
    from rich.table import Table
    table = Table("stack", "config", "ranks", "step ms", "tokens/s/GPU", "MFU", "peak GiB", "wall s", "note")
    failed = 0
    for case in cases:
        print(f"running {case.stack} / {case.config} on {case.ranks} rank(s) ...", file=sys.stderr, flush=True)
        with tempfile.TemporaryDirectory(prefix=f"bench-{case.stack}-") as tmp:
            try:
                row: Row = case.run(Path(tmp))
            except Exception as e:  # one failing config must not hide the others' figures
                failed += 1
                traceback.print_exc()
                table.add_row(case.stack, case.config, str(case.ranks), "FAILED", "", "", "", "", str(e)[:80])
                continue
        table.add_row(row.stack, row.config, str(row.ranks), _fmt(row.step_ms, ".1f"),
                      _fmt(row.tokens_per_s_per_gpu, ",.0f"), _fmt(None if row.mfu is None else 100 * row.mfu, ".1f"),
                      _fmt(row.peak_gib, ".2f"), f"{row.wall_s:.0f}", row.note)
    # a pipe or a file gets the whole table, not one squeezed to 80 columns
    Console(width=None if sys.stdout.isatty() else 240).print(table)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
