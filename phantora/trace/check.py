"""Check that a Chrome JSON trace is one Perfetto imports without losing anything.

Perfetto moves partly overlapping slices of one thread to an overflow track (older versions,
e.g. trace processor v20.1, nest them under a slice they outlast) and ignores flow ends without
a partner (notes/perfetto.md), so a trace we write must have, per (pid, tid), slices that nest,
every flow id bound exactly once on each side, and each flow event inside a slice of its
thread. Perfetto also reads flow events in time order (a v1 flow that ends before it starts is
dropped) and numbers v1 flows (s/f) 0, 1, 2, ... in the id space of v2 bind_ids (a bind_id
below the number of v1 flows binds to the wrong slice). tests/tracing checks these claims
against a real trace processor.
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
    v1_ts: dict[object, dict[str, object]] = defaultdict(dict)
    v1_places: list[tuple[object, tuple[int, int], int]] = []
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
            key = ("v1", ev.get("id"), ev.get("cat"), ev.get("name"))
            (flow_out if ph == "s" else flow_in)[key] += 1
            v1_ts[key][ph] = ev.get("ts")
            if isinstance(ev.get("ts"), (int, float)):
                v1_places.append((key, (ev.get("pid"), ev.get("tid")), round(ev["ts"] * 1000)))
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
    for key, track, ts in v1_places:
        # "bp": "e" binds a flow event to the slice of its thread open at its time.
        if not any(start <= ts < end or start == ts == end for start, end, _ in by_track.get(track, ())):
            problem(f"flow {key}: no slice on track {track} at {ts} ns to bind to")
    v1_flows = sum(1 for fid in set(flow_out) | set(flow_in) if isinstance(fid, tuple))
    for fid in set(flow_out) | set(flow_in):
        perfetto_id = None if isinstance(fid, tuple) else _perfetto_flow_id(fid)
        if flow_out.get(fid, 0) != 1 or flow_in.get(fid, 0) != 1:
            problem(f"flow {fid}: {flow_out.get(fid, 0)} sources and {flow_in.get(fid, 0)} destinations")
        elif not isinstance(fid, tuple) and perfetto_id is None:
            problem(f"flow bind_id {fid!r} is neither an integer nor hex: Perfetto ignores it")
        elif isinstance(fid, tuple) and _before(v1_ts[fid].get("f"), v1_ts[fid].get("s")):
            problem(f"flow {fid} ends at {v1_ts[fid]['f']} us, before it starts at {v1_ts[fid]['s']} us: "
                    "Perfetto meets the end first and drops the arrow")
        elif perfetto_id is not None and perfetto_id < v1_flows:
            problem(f"flow bind_id {fid!r} collides with Perfetto's ids for the {v1_flows} v1 flows (0 to "
                    f"{v1_flows - 1}): start bind_ids at 2^32")
        else:
            result.flows += 1
    return result


def _before(a: object, b: object) -> bool:
    return isinstance(a, (int, float)) and isinstance(b, (int, float)) and a < b


def _perfetto_flow_id(bind_id: object) -> int | None:
    """The number Perfetto makes of a bind_id: an integer as it is, a string read as hex."""
    if isinstance(bind_id, int):
        return bind_id
    try:
        return int(str(bind_id), 16)
    except ValueError:
        return None
