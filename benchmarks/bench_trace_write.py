"""Cost of writing the trace: each sink fed the events of a recorded run, timed.

    phantora trace -o /tmp/gpt.json -- python examples/gpt_train.py
    python benchmarks/bench_trace_write.py /tmp/gpt.json [--repeat 3]

The recorded trace (.json, .json.gz or .pftrace) is turned back into the sink calls the engine
made (process/thread names, slices with their flows, instants, counters, collective flows) and
replayed into NullSink, the Chrome JSON sink (.json and .json.gz) and the Perfetto protobuf sink
(.pftrace), each writing a fresh file in a temporary directory. For each: the best time over
`--repeat` rounds (one replay of each sink per round), calls per second, the file size, and the
time as a share of the recorded run's `wall_seconds` (the simulation's whole wall time, trace
writing included): what writing that format costs a run. Also the size of the .pftrace gzipped
and the time `read_pftrace` takes to decode it.

nvtx ranges and collective host calls are replayed as plain slices (the JSON does not record
when they were announced), so the protobuf sink counts those as late slices.
"""

from __future__ import annotations

import argparse
import gzip
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from phantora.trace import NullSink, TraceSink
from phantora.trace.check import load_chrome_trace
from phantora.trace.chrome import BIND_ID_BASE, ChromeJsonSink
from phantora.trace.perfetto import PerfettoProtoSink, load_pftrace, read_pftrace

Call = tuple[str, tuple[Any, ...], dict[str, Any]]


def _ns(us: float) -> int:
    return round(us * 1000)


def sink_calls(events: list[dict[str, Any]]) -> list[Call]:
    """The sink calls that wrote `events` (Chrome JSON event dicts, in file order)."""
    calls: list[Call] = []
    names: dict[tuple[str, int, int], str] = {}
    flow_starts: dict[str, dict[str, Any]] = {}
    for ev in events:
        ph = ev["ph"]
        if ph == "M":
            kind = ev["name"]
            if kind in ("process_name", "thread_name"):
                names[(kind, ev["pid"], ev["tid"])] = ev["args"]["name"]
            elif kind == "process_sort_index":
                name = names[("process_name", ev["pid"], 0)]
                calls.append(("process", (ev["pid"], name, ev["args"]["sort_index"]), {}))
            elif kind == "thread_sort_index":
                calls.append(("thread", (ev["pid"], ev["tid"], names[("thread_name", ev["pid"], ev["tid"])],
                                         ev["args"]["sort_index"]), {}))
        elif ph == "X":
            flows = {}
            if "bind_id" in ev:  # the JSON's bind_ids are the engine's flow ids + BIND_ID_BASE
                flows["flow_out" if ev.get("flow_out") else "flow_in"] = ev["bind_id"] - BIND_ID_BASE
            calls.append(("slice", (ev["pid"], ev["tid"], ev["name"], _ns(ev["ts"]), _ns(ev["dur"]), ev["cat"],
                                    ev.get("args")), flows))
        elif ph == "i":
            calls.append(("instant", (ev["pid"], ev["tid"], ev["name"], _ns(ev["ts"]), ev["cat"], ev.get("args")), {}))
        elif ph == "C":
            calls.append(("counter", (ev["pid"], ev["name"], _ns(ev["ts"]), ev["args"]), {}))
        elif ph == "s":
            flow_starts[ev["id"]] = ev
        elif ph == "f":
            s = flow_starts.pop(ev["id"])
            calls.append(("flow", (int(str(ev["id"]).lstrip("c")), ev["name"], (s["pid"], s["tid"], _ns(s["ts"])),
                                   (ev["pid"], ev["tid"], _ns(ev["ts"]))), {}))
    return calls


def replay(calls: list[Call], sink: TraceSink, metadata: dict[str, Any]) -> float:
    bound = {name: getattr(sink, name) for name in ("process", "thread", "slice", "instant", "counter", "flow")}
    t0 = time.perf_counter()
    for name, args, kwargs in calls:
        bound[name](*args, **kwargs)
    sink.close(metadata)
    return time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trace", type=Path, help="recorded trace: .json, .json.gz or .pftrace")
    ap.add_argument("--repeat", type=int, default=3, help="replays per sink; the best is reported")
    opts = ap.parse_args()
    data = load_pftrace(opts.trace) if opts.trace.name.endswith(".pftrace") else load_chrome_trace(opts.trace)
    metadata = data.get("metadata") or {}
    calls = sink_calls(data["traceEvents"])
    wall = metadata.get("wall_seconds")
    print(f"{opts.trace}: {len(data['traceEvents']):,} events, {len(calls):,} sink calls; recorded run: "
          f"{wall} s wall, command {' '.join(metadata.get('command', []))}")
    with tempfile.TemporaryDirectory() as tmp:
        sinks: list[tuple[str, Callable[[], TraceSink], Path | None]] = [
            ("NullSink", NullSink, None),
            ("ChromeJsonSink .json", lambda: ChromeJsonSink(Path(tmp) / "t.json"), Path(tmp) / "t.json"),
            ("ChromeJsonSink .json.gz", lambda: ChromeJsonSink(Path(tmp) / "t.json.gz"), Path(tmp) / "t.json.gz"),
            ("PerfettoProtoSink .pftrace", lambda: PerfettoProtoSink(Path(tmp) / "t.pftrace"), Path(tmp) / "t.pftrace"),
        ]
        # Rounds of one replay per sink, so that a busy machine slows every sink alike.
        times: dict[str, list[float]] = {label: [] for label, _, _ in sinks}
        for _ in range(opts.repeat):
            for label, make, _ in sinks:
                times[label].append(replay(calls, make(), metadata))
        print(f"\n| sink | best of {opts.repeat} s | calls/s | file bytes | share of run wall |")
        print("|---|---:|---:|---:|---:|")
        for label, _, out in sinks:
            best = min(times[label])
            size = f"{out.stat().st_size:,}" if out else "-"
            share = f"{100 * best / wall:.1f}%" if wall else "-"
            print(f"| {label} | {best:.3f} | {len(calls) / best:,.0f} | {size} | {share} |")
        pf = Path(tmp) / "t.pftrace"
        print(f"\n.pftrace compressed with gzip -6 (for comparison; phantora writes it uncompressed): "
              f"{len(gzip.compress(pf.read_bytes(), 6)):,} bytes")
        t0 = time.perf_counter()
        n = len(read_pftrace(pf).events)
        print(f"\nread_pftrace: {n:,} events decoded in {time.perf_counter() - t0:.3f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
