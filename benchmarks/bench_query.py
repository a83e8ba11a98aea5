"""How fast the built-in query engine loads and queries a large trace.

    python benchmarks/bench_query.py                 # 1,000,000 slices
    python benchmarks/bench_query.py --slices 200000 --keep /tmp/big.json

Synthesizes a Chrome JSON trace shaped like phantora's (per rank: a host track of aten op
slices with args and a flow to their kernel, a stream track of kernel slices with phantora's
kernel args, nested nvtx ranges over groups of ops, a memory counter every fourth op, step
markers), writes it, then times `phantora.query.load` and a few queries, including the first
reads of the flow and args tables (which fill them) and `phantora summary`'s analysis. Wall
and CPU seconds: on a shared machine the CPU time is the steadier figure.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson

OPS_PER_STEP = 2_000


def synthesize(n_slices: int, ranks: int = 2) -> dict[str, Any]:
    """A trace with about n_slices slices: per op one host slice and one kernel slice, plus
    an nvtx range per 100 ops and a step marker per OPS_PER_STEP ops."""
    events: list[dict[str, Any]] = []
    per_rank = n_slices // ranks
    ops = per_rank * 100 // 201  # 2 slices per op + 1 nvtx range per 100 ops
    corr = 0
    for r in range(ranks):
        pid = r + 1
        events += [
            {"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": f"rank {r} · node 0 · GPU {r} · H100"}},
            {"ph": "M", "name": "thread_name", "pid": pid, "tid": 1, "args": {"name": "host (aten op launches)"}},
            {"ph": "M", "name": "thread_name", "pid": pid, "tid": 2, "args": {"name": "steps (optimizer.step)"}},
            {"ph": "M", "name": "thread_name", "pid": pid, "tid": 10, "args": {"name": f"cuda:{r} default stream"}},
        ]
        t = 0
        step_start = 0
        nvtx_start = 0
        for i in range(ops):
            corr += 1
            launch = 4_000 + (i % 7) * 500
            kernel = 9_000 + (i % 13) * 700
            events.append({"ph": "X", "pid": pid, "tid": 1, "name": "aten::mm", "cat": "cpu_op", "ts": t / 1000,
                           "dur": launch / 1000, "args": {"Input Dims": [[4096, 768], [768, 3072]],
                                                          "correlation": corr, "python_overhead_ns": 0},
                           "bind_id": corr, "flow_out": True})
            events.append({"ph": "X", "pid": pid, "tid": 10, "name": "sm90_xmma_gemm_bf16bf16_bf16f32", "cat": "kernel",
                           "ts": (t + 2_500) / 1000, "dur": kernel / 1000,
                           "args": {"op": "aten::mm.default", "shapes": [[4096, 768], [768, 3072]],
                                    "dtypes": ["bfloat16", "bfloat16"], "flops": 19327352832.0, "bytes": 36700160.0,
                                    "kernels": 1, "estimator": "analytical", "device": r, "stream": 0,
                                    "correlation": corr},
                           "bind_id": corr, "flow_in": True})
            if i % 4 == 0:
                events.append({"ph": "C", "pid": pid, "tid": 0, "name": f"cuda:{r} memory", "ts": t / 1000,
                               "args": {"allocated": 1 << 30 | i, "reserved": 2 << 30}})
            t += max(launch, kernel)
            if i % 100 == 99:
                events.append({"ph": "X", "pid": pid, "tid": 1, "name": "block", "cat": "nvtx",
                               "ts": nvtx_start / 1000, "dur": (t - nvtx_start) / 1000})
                nvtx_start = t
            if i % OPS_PER_STEP == OPS_PER_STEP - 1:
                step = i // OPS_PER_STEP
                events.append({"ph": "X", "pid": pid, "tid": 2, "name": f"ProfilerStep#{step}", "cat": "user_annotation",
                               "ts": step_start / 1000, "dur": (t - step_start) / 1000, "args": {"step": step}})
                step_start = t
    return {"traceEvents": events, "displayTimeUnit": "ns",
            "metadata": {"gpu": "h100-sxm-80gb", "cluster": "dgx-h100", "simulated_ns": t}}


QUERIES = {
    "count slices": "select count(*) from slice",
    "top 10 names by total dur": "select name, count(*), sum(dur) from slice group by name order by 3 desc limit 10",
    "slices on one thread": ("select count(*), sum(dur) from slice join thread_track tt on slice.track_id = tt.id "
                             "join thread using (utid) where thread.name = 'cuda:0 default stream'"),
    "sum EXTRACT_ARG flops": "select sum(extract_arg(arg_set_id, 'args.flops')) from slice where category = 'kernel'",
    "children of nvtx ranges": ("select p.name, count(*) from slice c join slice p on c.parent_id = p.id "
                                "group by p.name"),
    "flows host->kernel": "select count(*) from flow join slice s on s.id = flow.slice_in",
    "args table (first read fills it)": "select count(*) from args where key = 'args.correlation'",
    "args table again": "select count(*) from args where key = 'args.op'",
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--slices", type=int, default=1_000_000)
    ap.add_argument("--keep", type=Path, default=None, help="write the synthesized trace here and keep it "
                                                            "(an existing file there is reused)")
    args = ap.parse_args()

    from phantora.query import load
    from phantora.query.summary import summarize

    path = args.keep or Path(tempfile.mkdtemp()) / "bench.json"
    if not path.exists():
        t0 = time.perf_counter()
        path.write_bytes(orjson.dumps(synthesize(args.slices)))
        print(f"synthesized {path} ({path.stat().st_size / 1e6:.0f} MB) in {time.perf_counter() - t0:.1f} s")

    t0, c0 = time.perf_counter(), time.process_time()
    db = load(path, engine="builtin")
    load_s, load_cpu = time.perf_counter() - t0, time.process_time() - c0
    n = db.query("select count(*) from slice").scalar()
    print(f"load: {load_s:.2f} s wall, {load_cpu:.2f} s CPU, for {n:,} slices "
          f"({db.query('select count(*) from flow').scalar():,} flows, "
          f"{db.query('select count(*) from counter').scalar():,} counter values)")
    print("   wall s  CPU s  query")
    for label, sql in QUERIES.items():
        t0, c0 = time.perf_counter(), time.process_time()
        rows = db.query(sql).rows
        print(f"  {time.perf_counter() - t0:7.2f} {time.process_time() - c0:6.2f}  {label}: {rows[:2]}")
    t0, c0 = time.perf_counter(), time.process_time()
    summary = summarize(db)
    print(f"  {time.perf_counter() - t0:7.2f} {time.process_time() - c0:6.2f}  phantora summary's analysis "
          f"({summary.steps.source}, {len(summary.steps.overall_ns)} steps)")
    db.close()
    if args.keep is None:
        path.unlink()


if __name__ == "__main__":
    main()
