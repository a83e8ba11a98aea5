"""Writing hand-made Chrome JSON traces for the query tests."""

from __future__ import annotations

import gzip
from pathlib import Path
from typing import Any

import orjson


def write_trace(path: Path, events: list[dict[str, Any]], metadata: dict[str, Any] | None = None,
                gz: bool = False) -> Path:
    data = orjson.dumps({"traceEvents": events, "displayTimeUnit": "ns", "metadata": metadata or {}})
    path.write_bytes(gzip.compress(data) if gz else data)
    return path


def x(pid: int, tid: int, name: str, ts_us: float, dur_us: float, cat: str = "c", **extra: Any) -> dict[str, Any]:
    return {"ph": "X", "pid": pid, "tid": tid, "name": name, "cat": cat, "ts": ts_us, "dur": dur_us, **extra}


def names(pid: int, process: str, threads: dict[int, str]) -> list[dict[str, Any]]:
    out = [{"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": process}}]
    out += [{"ph": "M", "name": "thread_name", "pid": pid, "tid": t, "args": {"name": n}} for t, n in threads.items()]
    return out
