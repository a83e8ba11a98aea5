"""Trace sinks: where the simulator writes what happened.

The engine talks to a sink through the small `TraceSink` protocol below; each output format
implements it (Chrome JSON today). Times are integer nanoseconds since simulation start.
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

    def instant(self, pid: int, tid: int, name: str, ts_ns: int, cat: str, args: dict[str, Any] | None = None) -> None: ...

    def counter(self, pid: int, name: str, ts_ns: int, values: dict[str, float]) -> None: ...

    def flow(self, flow_id: int, name: str, src: tuple[int, int, int], dst: tuple[int, int, int]) -> None:
        """An arrow from the slice enclosing src=(pid, tid, ts_ns) to the one enclosing dst, for
        slices that already carry another flow (collective participants)."""

    def close(self, metadata: dict[str, Any]) -> None: ...


class NullSink:
    """Discards everything (benchmarks of the simulator without trace I/O)."""

    def process(self, *a: Any, **k: Any) -> None: ...
    def thread(self, *a: Any, **k: Any) -> None: ...
    def slice(self, *a: Any, **k: Any) -> None: ...
    def instant(self, *a: Any, **k: Any) -> None: ...
    def counter(self, *a: Any, **k: Any) -> None: ...
    def flow(self, *a: Any, **k: Any) -> None: ...
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

    def instant(self, pid: int, tid: int, name: str, ts_ns: int, cat: str, args: dict[str, Any] | None = None) -> None:
        for s in self.sinks:
            s.instant(pid, tid, name, ts_ns, cat, args)

    def counter(self, pid: int, name: str, ts_ns: int, values: dict[str, float]) -> None:
        for s in self.sinks:
            s.counter(pid, name, ts_ns, values)

    def flow(self, flow_id: int, name: str, src: tuple[int, int, int], dst: tuple[int, int, int]) -> None:
        for s in self.sinks:
            s.flow(flow_id, name, src, dst)

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


def open_sink(path: str | Path) -> TraceSink:
    """A sink for `path`, chosen by its extension (.json or .json.gz)."""
    p = str(path)
    if p.endswith(".json") or p.endswith(".json.gz"):
        from phantora.trace.chrome import ChromeJsonSink

        return ChromeJsonSink(Path(p))
    raise UnsupportedTraceFormat(
        f"cannot write a trace to {p!r}: use a name ending in .json or .json.gz (Chrome JSON, "
        "opens in ui.perfetto.dev)"
    )
