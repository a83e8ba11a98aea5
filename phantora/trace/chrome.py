"""Chrome JSON trace writer (the format ui.perfetto.dev and chrome://tracing import).

Events are streamed to disk in chunks so memory stays flat on long runs, and flushed about once
a second (`flush`), so that `<path>.partial` always holds the run so far. The file is written
to `<path>.partial` and renamed on close; `close` runs on every exit path of the simulator
(normal end, script failure, Ctrl-C), so a finished file is always complete JSON.

Timestamps: Chrome JSON uses microseconds; we write ns / 1000 with three decimals, which keeps
nanosecond precision because times are relative to simulation start (notes/perfetto.md).
No "displayTimeUnit": the format makes it a display preference only and current Perfetto
ignores it, but Perfetto from 2020 to early 2022 (e.g. trace processor v20.1) read "ns" as
"ts and dur are in nanoseconds" and showed every time 1000x too short.
"""

from __future__ import annotations

import gzip
import os
from pathlib import Path
from typing import IO, Any

import orjson

from phantora.protocol import kept_json

_CHUNK_EVENTS = 4096

# Perfetto keeps flow v2 bind_ids and flow v1 ids in one id space: it numbers v1 flows (s/f,
# keyed by id+cat+name) 0, 1, 2, ... as it meets them, so a bind_id below the count of v1 flows
# collides with one and the arrow is drawn from the wrong slice (stat flow_duplicate_id; seen in
# trace processor v20.1, and current sources still share the id space). Its v1 counter is 32-bit:
# bind_ids from 2^32 on can never collide.
BIND_ID_BASE = 1 << 32


def _us(ns: int) -> float:
    return round(ns / 1000.0, 3)


# The event dicts of this format, one function per sink call. The Perfetto protobuf reader
# (perfetto.py) builds its output with the same functions, so a decoded .pftrace has
# exactly the shape of the JSON this sink writes.

COLLECTIVE_FLOW_CATEGORY = "collective"


def process_events(pid: int, name: str, sort_index: int) -> list[dict[str, Any]]:
    return [{"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": name}},
            {"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "args": {"sort_index": sort_index}}]


def thread_events(pid: int, tid: int, name: str, sort_index: int) -> list[dict[str, Any]]:
    return [{"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": name}},
            {"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid, "args": {"sort_index": sort_index}}]


def slice_event(pid: int, tid: int, name: str, ts_ns: int, dur_ns: int, cat: str, args: dict[str, Any] | None = None,
                flow_out: int | None = None, flow_in: int | None = None) -> dict[str, Any]:
    ev: dict[str, Any] = {"ph": "X", "pid": pid, "tid": tid, "name": name, "cat": cat,
                          "ts": _us(ts_ns), "dur": _us(dur_ns)}
    if args:
        ev["args"] = args
    # Flow v2: the arrow is bound to this slice (a slice carries at most one bind_id).
    if flow_out is not None:
        ev["bind_id"] = BIND_ID_BASE + flow_out
        ev["flow_out"] = True
    elif flow_in is not None:
        ev["bind_id"] = BIND_ID_BASE + flow_in
        ev["flow_in"] = True
    return ev


def instant_event(pid: int, tid: int, name: str, ts_ns: int, cat: str,
                  args: dict[str, Any] | None = None) -> dict[str, Any]:
    ev: dict[str, Any] = {"ph": "i", "s": "t", "pid": pid, "tid": tid, "name": name, "cat": cat, "ts": _us(ts_ns)}
    if args:
        ev["args"] = args
    return ev


def counter_event(pid: int, name: str, ts_ns: int, values: dict[str, float]) -> dict[str, Any]:
    return {"ph": "C", "pid": pid, "tid": 0, "name": name, "ts": _us(ts_ns), "args": values}


def flow_events(flow_id: int, name: str, src: tuple[int, int, int], dst: tuple[int, int, int]) -> list[dict[str, Any]]:
    # Flow v1 events bound to the enclosing slices ("bp": "e"); see BIND_ID_BASE for why their
    # ids cannot collide with bind_ids.
    fid = f"c{flow_id}"
    return [{"ph": "s", "id": fid, "pid": src[0], "tid": src[1], "ts": _us(src[2]), "name": name,
             "cat": COLLECTIVE_FLOW_CATEGORY, "bp": "e"},
            {"ph": "f", "id": fid, "pid": dst[0], "tid": dst[1], "ts": _us(dst[2]), "name": name,
             "cat": COLLECTIVE_FLOW_CATEGORY, "bp": "e"}]


class ChromeJsonSink:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._partial = path.with_name(path.name + ".partial")
        path.parent.mkdir(parents=True, exist_ok=True)
        raw: IO[bytes] = open(self._partial, "wb")
        self._file: IO[bytes] = gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) if path.name.endswith(".gz") else raw
        self._raw = raw
        self._file.write(b'{"traceEvents":[\n')
        self._pending: list[bytes] = []
        self._first = True
        self.events_written = 0
        self.closed = False

    def _emit(self, event: dict[str, Any]) -> None:
        self._pending.append(kept_json(event))
        if len(self._pending) >= _CHUNK_EVENTS:
            self._flush()

    def _flush(self) -> None:
        if not self._pending:
            return
        body = b",\n".join(self._pending)
        self._file.write(body if self._first else b",\n" + body)
        self._first = False
        self.events_written += len(self._pending)
        self._pending.clear()

    def process(self, pid: int, name: str, sort_index: int) -> None:
        for ev in process_events(pid, name, sort_index):
            self._emit(ev)

    def thread(self, pid: int, tid: int, name: str, sort_index: int) -> None:
        for ev in thread_events(pid, tid, name, sort_index):
            self._emit(ev)

    def slice(
        self,
        pid: int,
        tid: int,
        name: str,
        ts_ns: int,
        dur_ns: int,
        cat: str,
        args: dict[str, Any] | None = None,
        flow_out: int | None = None,
        flow_in: int | None = None,
    ) -> None:
        self._emit(slice_event(pid, tid, name, ts_ns, dur_ns, cat, args, flow_out, flow_in))

    def open_slice(self, pid: int, tid: int, name: str, ts_ns: int, cat: str, end_ns: int | None = None) -> None:
        pass  # complete ("X") events are written once the slice ends

    def instant(self, pid: int, tid: int, name: str, ts_ns: int, cat: str, args: dict[str, Any] | None = None) -> None:
        self._emit(instant_event(pid, tid, name, ts_ns, cat, args))

    def counter(self, pid: int, name: str, ts_ns: int, values: dict[str, float]) -> None:
        self._emit(counter_event(pid, name, ts_ns, values))

    def flow(self, flow_id: int, name: str, src: tuple[int, int, int], dst: tuple[int, int, int]) -> None:
        for ev in flow_events(flow_id, name, src, dst):
            self._emit(ev)

    def flush(self) -> None:
        """Events so far to disk, one per line: a reader of a file cut here (a killed run's
        .partial) reads every event up to its last complete line."""
        if self.closed:
            return
        self._flush()
        self._file.flush()  # GzipFile: a sync flush, so the compressed prefix decompresses
        if self._raw is not self._file:
            self._raw.flush()

    def close(self, metadata: dict[str, Any]) -> None:
        if self.closed:
            return
        self.closed = True
        self._flush()
        self._file.write(b'\n],"metadata":' + orjson.dumps(metadata) + b"}\n")
        self._file.close()
        if self._raw is not self._file:
            self._raw.close()
        os.replace(self._partial, self.path)
