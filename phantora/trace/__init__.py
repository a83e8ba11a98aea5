"""Trace sinks: where the simulator writes what happened.

The engine talks to a sink through the small `TraceSink` protocol below; each output format
implements it (Chrome JSON in chrome.py, native Perfetto protobuf in perfetto.py). Times are
integer nanoseconds since simulation start.

Order in which the engine writes (a sink may rely on it): on each track (pid, tid), slices
arrive in order of their start time, except slices announced with `open_slice` when they
start and written with `slice` later (nvtx ranges, when they close; a collective's host call,
when the collective has run); instants and counters may arrive in any order.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol, Sequence


class TraceSink(Protocol):
    def process(self, pid: int, name: str, sort_index: int) -> None: ...

    def thread(self, pid: int, tid: int, name: str, sort_index: int) -> None: ...

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
    ) -> None: ...

    def open_slice(self, pid: int, tid: int, name: str, ts_ns: int, cat: str, end_ns: int | None = None) -> None:
        """A slice starting now that is written later, by `slice` with the same pid, tid, name and
        start (with its args and flows). `end_ns`: its end when already known (a collective's
        host call, whose link to its kernel is known only when the collective runs); without
        it the slice may enclose whatever comes until it is written (an nvtx range). Sinks that
        need begin events in time order (Perfetto protobuf) use this; others ignore it."""

    def instant(self, pid: int, tid: int, name: str, ts_ns: int, cat: str, args: dict[str, Any] | None = None) -> None: ...

    def counter(self, pid: int, name: str, ts_ns: int, values: dict[str, float]) -> None: ...

    def flow(self, flow_id: int, name: str, src: tuple[int, int, int], dst: tuple[int, int, int]) -> None:
        """An arrow from the slice enclosing src=(pid, tid, ts_ns) to the one enclosing dst, for
        slices that already carry another flow (collective participants)."""

    def flush(self) -> None:
        """Put what was written so far on disk (the simulator calls it about once a second), so
        that a run killed before `close` still leaves a readable prefix of its trace."""

    def close(self, metadata: dict[str, Any]) -> None: ...


class NullSink:
    """Discards everything (benchmarks of the simulator without trace I/O)."""

    def process(self, *a: Any, **k: Any) -> None: ...
    def thread(self, *a: Any, **k: Any) -> None: ...
    def slice(self, *a: Any, **k: Any) -> None: ...
    def open_slice(self, *a: Any, **k: Any) -> None: ...
    def instant(self, *a: Any, **k: Any) -> None: ...
    def counter(self, *a: Any, **k: Any) -> None: ...
    def flow(self, *a: Any, **k: Any) -> None: ...
    def flush(self) -> None: ...
    def close(self, metadata: dict[str, Any]) -> None: ...


class TeeSink:
    """Forwards every call to each of `sinks`, in order, so that one run writes several outputs
    (the main trace and an export). Sinks must not modify the args dicts they are given: all of
    them receive the same objects."""

    def __init__(self, sinks: Sequence[TraceSink]) -> None:
        self.sinks = list(sinks)

    def process(self, pid: int, name: str, sort_index: int) -> None:
        for s in self.sinks:
            s.process(pid, name, sort_index)

    def thread(self, pid: int, tid: int, name: str, sort_index: int) -> None:
        for s in self.sinks:
            s.thread(pid, tid, name, sort_index)

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
        for s in self.sinks:
            s.slice(pid, tid, name, ts_ns, dur_ns, cat, args, flow_out, flow_in)

    def open_slice(self, pid: int, tid: int, name: str, ts_ns: int, cat: str, end_ns: int | None = None) -> None:
        for s in self.sinks:
            s.open_slice(pid, tid, name, ts_ns, cat, end_ns)

    def instant(self, pid: int, tid: int, name: str, ts_ns: int, cat: str, args: dict[str, Any] | None = None) -> None:
        for s in self.sinks:
            s.instant(pid, tid, name, ts_ns, cat, args)

    def counter(self, pid: int, name: str, ts_ns: int, values: dict[str, float]) -> None:
        for s in self.sinks:
            s.counter(pid, name, ts_ns, values)

    def flow(self, flow_id: int, name: str, src: tuple[int, int, int], dst: tuple[int, int, int]) -> None:
        for s in self.sinks:
            s.flow(flow_id, name, src, dst)

    def flush(self) -> None:
        for s in self.sinks:
            s.flush()

    def close(self, metadata: dict[str, Any]) -> None:
        """Closes every sink, even when one fails (each must finish its file); then raises the
        first failure."""
        first: BaseException | None = None
        for s in self.sinks:
            try:
                s.close(metadata)
            except BaseException as e:  # noqa: BLE001 - re-raised below, after the other sinks closed
                first = first or e
        if first is not None:
            raise first


class UnsupportedTraceFormat(ValueError):
    pass


PERFETTO_PROTO_SUFFIXES = (".pftrace", ".perfetto-trace")


def open_sink(path: str | Path) -> TraceSink:
    """A sink for `path`, chosen by its extension: .json or .json.gz (Chrome JSON), .pftrace or
    .perfetto-trace (native Perfetto protobuf)."""
    p = str(path)
    if p.endswith(".json") or p.endswith(".json.gz"):
        from phantora.trace.chrome import ChromeJsonSink

        return ChromeJsonSink(Path(p))
    if p.endswith(PERFETTO_PROTO_SUFFIXES):
        from phantora.trace.perfetto import PerfettoProtoSink

        return PerfettoProtoSink(Path(p))
    raise UnsupportedTraceFormat(
        f"cannot write a trace to {p!r}: use a name ending in .json or .json.gz (Chrome JSON) or .pftrace "
        "(Perfetto protobuf, smaller); all open in ui.perfetto.dev"
    )
