"""The two ways loading or querying a trace fails; both carry a one-line message for users."""

from __future__ import annotations


class TraceFileError(Exception):
    """The trace cannot be read: missing file, not a trace, corrupt or unsupported format.
    The message names the file and what to do about it."""


class QueryError(Exception):
    """The SQL engine rejected a query. `message` is the engine's own words; `sql` the statement."""

    def __init__(self, message: str, sql: str) -> None:
        super().__init__(f"{message} (in query: {sql.strip()})")
        self.message = message
        self.sql = sql


class EngineUnavailable(Exception):
    """The query engine asked for cannot run here (no trace_processor binary, say)."""
