"""HTA's view of a phantora run against phantora's own trace: the DDP example, two ranks.

    python benchmarks/bench_hta.py [EXAMPLE ARGS...]     # default: examples/ddp_train.py as is

Runs `phantora trace --nproc-per-node 2 --export-kineto` on examples/ddp_train.py, loads the
export with Holistic Trace Analysis (pip install holistictraceanalysis), and prints per rank
HTA's temporal breakdown and communication/computation overlap next to the same figures computed
from the main Chrome JSON trace (tests/tracing/test_kineto_hta.py: reference_figures), twice: with
HTA's default rounding of nanosecond timestamps to whole microseconds, and with
HTA_DISABLE_NS_ROUNDING=1.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "trace"))
from test_kineto_hta import reference_figures  # noqa: E402  (the figures the end-to-end test checks)

from phantora.trace.check import load_chrome_trace  # noqa: E402


def hta_figures(trace_dir: Path, rounding: bool) -> dict[int, dict[str, float]]:
    from hta.trace_analysis import TraceAnalysis

    if rounding:
        os.environ.pop("HTA_DISABLE_NS_ROUNDING", None)
    else:
        os.environ["HTA_DISABLE_NS_ROUNDING"] = "1"
    analysis = TraceAnalysis(trace_dir=str(trace_dir))
    temporal = analysis.get_temporal_breakdown(visualize=False).set_index("rank")
    overlap = analysis.get_comm_comp_overlap(visualize=False).set_index("rank")
    return {int(rank): {"kernel_time": row["kernel_time(us)"], "idle": row["idle_time(us)"],
                        "compute": row["compute_time(us)"], "non_compute": row["non_compute_time(us)"],
                        "overlap_pct": overlap.loc[rank, "comp_comm_overlap_pctg"]}
            for rank, row in temporal.iterrows()}


def main(example_args: list[str]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        cmd = [sys.executable, "-m", "phantora.cli", "trace", "--nproc-per-node", "2", "-o", str(out / "run.json"),
               "--export-kineto", str(out / "hta"), "--", sys.executable, "examples/ddp_train.py", *example_args]
        print("$", " ".join(cmd[2:]), flush=True)
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=1800)
        if proc.returncode != 0:
            raise SystemExit(proc.stderr[-3000:])
        trace = load_chrome_trace(out / "run.json")
        rounded, exact = hta_figures(out / "hta", True), hta_figures(out / "hta", False)
        keys = ("kernel_time", "idle", "compute", "non_compute", "overlap_pct")
        print(f"{'rank':>4} {'figure':>12} {'phantora trace':>15} {'HTA (ns)':>12} {'HTA (rounded)':>14}")
        for rank in sorted(exact):
            ours = reference_figures(trace, rank)
            for k in keys:
                unit = "%" if k == "overlap_pct" else "us"
                print(f"{rank:>4} {k:>12} {ours[k]:>12.3f} {unit:<2} {exact[rank][k]:>12.3f} {rounded[rank][k]:>14.3f}")


if __name__ == "__main__":
    main(sys.argv[1:])
