"""TraceDB: one loaded trace and SQL on it, whichever engine answers."""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from phantora.query.errors import EngineUnavailable, QueryError

ENGINES = ("auto", "builtin", "trace_processor")


@dataclass
class QueryResult:
    columns: list[str]
    rows: list[tuple[Any, ...]] = field(default_factory=list)

    def dicts(self) -> list[dict[str, Any]]:
        return [dict(zip(self.columns, row)) for row in self.rows]

    def scalar(self) -> Any:
        """The first column of the first row (None when there is no row)."""
        return self.rows[0][0] if self.rows else None


class _Engine(Protocol):
    engine: str
    import_stats: dict[str, int]

    def execute(self, sql: str) -> tuple[list[str], list[tuple[Any, ...]]]: ...

    def close(self) -> None: ...


class TraceDB:
    """A trace loaded for SQL queries. Use `phantora.query.load(path)`.

    `metadata` is the trace's top-level metadata (gpu, cluster, simulated_ns, ...);
    `engine` says who answers: "trace_processor" or "builtin"; `import_stats` counts what the
    built-in importer dropped (empty when nothing was).
    """

    def __init__(self, engine: _Engine, path: Path, metadata: dict[str, Any]) -> None:
        self._engine = engine
        self.path = path
        self.metadata = metadata

    @property
    def engine(self) -> str:
        return self._engine.engine

    @property
    def import_stats(self) -> dict[str, int]:
        return self._engine.import_stats

    @property
    def truncated(self) -> bool:
        """The file ends mid-event (its writer was killed): only a prefix of the run is here."""
        return bool(self._engine.import_stats.get("json_truncated_file"))

    def truncation_warning(self) -> str | None:
        """One line for users of a truncated trace, or None."""
        if not self.truncated:
            return None
        return (f"warning: {self.path} is truncated (the run that wrote it was stopped before closing it); "
                "the figures cover only the part that was written")

    def query(self, sql: str) -> QueryResult:
        """Run `sql`, one statement that only reads (phantora/query/readonly.py).
        QueryError with the engine's message when it fails or is refused."""
        try:
            columns, rows = self._engine.execute(sql)
        except (sqlite3.Error, sqlite3.Warning) as e:
            raise QueryError(str(e), getattr(e, "statement", sql)) from None
        return QueryResult(columns, rows)

    def close(self) -> None:
        self._engine.close()

    def __enter__(self) -> TraceDB:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def load(path: str | Path, engine: str = "auto") -> TraceDB:
    """Load a trace (.json, .json.gz, .pftrace) for queries.

    engine: "auto" uses Perfetto's trace_processor_shell when one is on this machine
    (PHANTORA_TRACE_PROCESSOR, or the perfetto package's cached download) and the built-in
    SQLite engine otherwise; "builtin" / "trace_processor" force one.
    Raises TraceFileError for unreadable traces, EngineUnavailable when a forced engine
    cannot run.
    """
    from phantora.query import source
    from phantora.query.trace_processor import find_binary

    if engine not in ENGINES:
        raise ValueError(f"unknown engine {engine!r}; choose one of {', '.join(ENGINES)}")
    p = Path(path)
    binary = find_binary() if engine != "builtin" else None
    if engine == "trace_processor" and binary is None:
        raise EngineUnavailable("no trace_processor_shell found: set PHANTORA_TRACE_PROCESSOR to its path "
                                "(it cannot be downloaded from here), or use the built-in engine")
    if binary is not None:
        from phantora.query.trace_processor import TraceProcessorDB

        metadata = source.read_metadata(p)  # Perfetto does not import Chrome JSON's metadata
        return TraceDB(TraceProcessorDB(p, binary), p, metadata)

    from phantora.query.importer import import_events
    from phantora.query.sqlite_engine import SqliteTraceDB

    trace = source.read_trace(p)
    with source.gc_paused():
        imported = import_events(trace.events)
        if trace.truncated:
            imported.stats["json_truncated_file"] = 1
        db = SqliteTraceDB(imported, trace.metadata, "proto" if trace.format == "pftrace" else "json",
                           trace.size_bytes)
    return TraceDB(db, p, dict(trace.metadata))
