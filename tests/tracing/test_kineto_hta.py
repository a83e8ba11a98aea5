"""`phantora trace --export-kineto` end to end: a 2-rank DDP run, its Kineto export loaded by
Holistic Trace Analysis, and HTA's figures checked against the same figures computed here from
the main Chrome JSON trace of the same run.

Both files hold the same microsecond values (three decimals), so HTA's numbers must match ours up
to float summation: the tolerance is 0.01 us absolute (plus 1e-9 relative). HTA rounds such
nanosecond-precision times to whole microseconds unless HTA_DISABLE_NS_ROUNDING=1, so the test
sets it, as docs/trace.md (moved from the README) tells users to.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from phantora.trace.check import load_chrome_trace

pytest.importorskip("hta", reason="holistictraceanalysis (the test extra) is not installed")
# HTA 0.5's own pandas calls (inplace=...) warn under pandas 3; nothing in them is ours.
pytestmark = pytest.mark.filterwarnings("ignore:The inplace keyword")

ROOT = Path(__file__).resolve().parents[2]
# Large enough per kernel that DDP's 1 MiB gradient buckets overlap the backward pass's kernels,
# small enough in ops (2 layers, 3 steps) to simulate in ~15 s.
DDP = ["--layers", "2", "--embd", "512", "--heads", "8", "--seq", "512", "--batch", "16", "--steps", "3",
       "--bucket-mb", "1"]
STEPS = 3


def approx(value: float):
    return pytest.approx(value, rel=1e-9, abs=0.01)


def union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[list[float]] = []
    for b, e in sorted(intervals):
        if merged and b <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], e)
        else:
            merged.append([b, e])
    return [(b, e) for b, e in merged]


def length(intervals: list[tuple[float, float]]) -> float:
    return sum(e - b for b, e in intervals)


def intersection_length(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> float:
    return sum(max(0.0, min(e1, e2) - max(b1, b2)) for b1, e1 in a for b2, e2 in b)


def reference_figures(trace: dict, rank: int) -> dict[str, float]:
    """What HTA should find for `rank`, from the main trace: the GPU work launched before the last
    optimizer step began (HTA leaves out the last, possibly incomplete, step), split into
    copies, communication (NCCL kernels: they carry a collective id) and computation (the rest)."""
    events = [e for e in trace["traceEvents"] if e.get("pid") == rank + 1 and e.get("ph") == "X"]
    last_step = max(e["ts"] for e in events if e["name"].startswith("ProfilerStep#"))
    launched_at = {e["args"]["correlation"]: e["ts"] for e in events
                   if e["cat"] == "cpu_op" and "correlation" in e.get("args", {})}
    gpu = [e for e in events if e["cat"] in ("kernel", "gpu_memcpy")]
    assert all(e["args"]["correlation"] in launched_at for e in gpu), "a kernel without its launch"
    gpu = [e for e in gpu if launched_at[e["args"]["correlation"]] < last_step]

    def kind(e: dict) -> str:
        # The main trace files device-to-device copies ("Memcpy DtoD ...") with kernels.
        if e["cat"] == "gpu_memcpy" or e["name"].startswith("Memcpy"):
            return "copy"
        return "comm" if "collective" in e["args"] else "comp"

    copies, comm, comp = ([e for e in gpu if kind(e) == k] for k in ("copy", "comm", "comp"))

    def spans(es: list[dict]) -> list[tuple[float, float]]:
        return union([(e["ts"], e["ts"] + e["dur"]) for e in es])

    busy, comp_u, comm_u = spans(gpu), spans(comp), spans(comm)
    kernel_time = busy[-1][1] - busy[0][0]
    idle = kernel_time - length(busy)
    return {
        "kernels": len(gpu),
        "kernel_time": kernel_time,
        "idle": idle,
        "compute": length(comp_u),
        "non_compute": kernel_time - length(comp_u) - idle,
        "overlap_pct": 100 * intersection_length(comp_u, comm_u) / length(comm_u),
        "comp_sum": sum(e["dur"] for e in comp),
        "comm_sum": sum(e["dur"] for e in comm),
        "copy_sum": sum(e["dur"] for e in copies),
    }


@pytest.fixture(scope="module")
def ddp_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("kineto")
    proc = subprocess.run([sys.executable, "-m", "phantora.cli", "trace", "--nproc-per-node", "2",
                           "-o", str(out / "run.json"), "--export-kineto", str(out / "hta"), "--",
                           sys.executable, "examples/ddp_train.py", *DDP],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    from hta.trace_analysis import TraceAnalysis

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HTA_DISABLE_NS_ROUNDING", "1")
        analysis = TraceAnalysis(trace_dir=str(out / "hta"))
    return proc, load_chrome_trace(out / "run.json"), analysis, out


@pytest.mark.slow
def test_hta_temporal_breakdown_and_overlap_match_the_main_trace(ddp_run):
    proc, trace, analysis, out = ddp_run
    assert f"kineto traces (for HTA): 2 file(s) in {out / 'hta'}/" in proc.stderr
    assert analysis.t.get_ranks() == [0, 1]
    assert analysis.get_profiler_steps() == list(range(STEPS - 1))  # the last step is left out
    temporal = analysis.get_temporal_breakdown(visualize=False).set_index("rank")
    overlap = analysis.get_comm_comp_overlap(visualize=False).set_index("rank")
    for rank in (0, 1):
        ours = reference_figures(trace, rank)
        hta_kernels = analysis.t.get_trace(rank)
        assert int(hta_kernels["stream"].gt(0).sum()) == ours["kernels"]  # every kernel linked to its launch
        row = temporal.loc[rank]
        assert row["kernel_time(us)"] == approx(ours["kernel_time"])
        assert row["idle_time(us)"] == approx(ours["idle"])
        assert row["compute_time(us)"] == approx(ours["compute"])
        assert row["non_compute_time(us)"] == approx(ours["non_compute"])
        # DDP's buckets overlap the backward pass: the export must not hide that
        assert ours["overlap_pct"] > 1
        assert overlap.loc[rank, "comp_comm_overlap_pctg"] == pytest.approx(ours["overlap_pct"], abs=0.01)


@pytest.mark.slow
def test_hta_kernel_breakdown_matches_the_main_trace(ddp_run):
    _, trace, analysis, _ = ddp_run
    _, per_kernel = analysis.get_gpu_kernel_breakdown(visualize=False, include_memory_kernels=True)
    totals = per_kernel.groupby(["rank", "kernel_type"])["sum (us)"].sum()
    for rank in (0, 1):
        ours = reference_figures(trace, rank)
        assert totals[(rank, "COMPUTATION")] == approx(ours["comp_sum"])
        assert totals[(rank, "COMMUNICATION")] == approx(ours["comm_sum"])
        assert totals[(rank, "MEMORY")] == approx(ours["copy_sum"])
