"""Check that a Chrome JSON trace is one Perfetto imports without losing anything.

Perfetto moves partly overlapping slices of one thread to an overflow track (or drops them in
older versions) and ignores flow ends without a partner (notes/perfetto.md), so a trace we
write must have, per (pid, tid), slices that nest, and every flow id bound exactly once on
each side.
"""

from __future__ import annotations

import gzip
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import orjson


@dataclass
class TraceCheck:
    events: int = 0
    slices: int = 0
    flows: int = 0
    counters: int = 0
    tracks: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def load_chrome_trace(path: str | Path) -> dict:
    raw = Path(path).read_bytes()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    data = orjson.loads(raw)
    if isinstance(data, list):
        data = {"traceEvents": data}
    return data


def check_chrome_trace(path: str | Path, max_problems: int = 20) -> TraceCheck:
    data = load_chrome_trace(path)
    events = data.get("traceEvents")
    result = TraceCheck()
    if not isinstance(events, list):
        result.problems.append("no traceEvents list")
        return result
    result.events = len(events)

    def problem(msg: str) -> None:
        if len(result.problems) < max_problems:
            result.problems.append(msg)

    by_track: dict[tuple[int, int], list[tuple[int, int, str]]] = defaultdict(list)
    flow_out: dict[object, int] = defaultdict(int)
    flow_in: dict[object, int] = defaultdict(int)
    for ev in events:
        ph = ev.get("ph")
        if ph == "X":
            ts, dur = ev.get("ts"), ev.get("dur")
            if not isinstance(ts, (int, float)) or not isinstance(dur, (int, float)) or ts < 0 or dur < 0:
                problem(f"slice with bad ts/dur: {ev}")
                continue
            start = round(ts * 1000)
            by_track[(ev.get("pid"), ev.get("tid"))].append((start, start + round(dur * 1000), ev.get("name", "")))
            result.slices += 1
            if "bind_id" in ev:
                (flow_out if ev.get("flow_out") else flow_in)[ev["bind_id"]] += 1
        elif ph in ("s", "f"):
            (flow_out if ph == "s" else flow_in)[("v1", ev.get("id"))] += 1
        elif ph == "C":
            result.counters += 1
            if not all(isinstance(v, (int, float)) for v in (ev.get("args") or {}).values()):
                problem(f"counter with non-numeric values: {ev}")
    result.tracks = len(by_track)
    for track, slices in by_track.items():
        slices.sort(key=lambda s: (s[0], -s[1]))
        stack: list[tuple[int, int, str]] = []
        for s in slices:
            while stack and stack[-1][1] <= s[0]:
                stack.pop()
            if stack and s[1] > stack[-1][1]:
                problem(f"track {track}: slice {s[2]!r} [{s[0]}, {s[1]}] ns partly overlaps "
                        f"{stack[-1][2]!r} [{stack[-1][0]}, {stack[-1][1]}] ns")
            stack.append(s)
    for fid in set(flow_out) | set(flow_in):
        if flow_out.get(fid, 0) != 1 or flow_in.get(fid, 0) != 1:
            problem(f"flow {fid}: {flow_out.get(fid, 0)} sources and {flow_in.get(fid, 0)} destinations")
        else:
            result.flows += 1
    return result
