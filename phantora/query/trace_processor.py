"""Perfetto's own trace processor as the query engine, when a trace_processor_shell binary is
on this machine.

Where the binary comes from, first match wins:
1. the environment variable PHANTORA_TRACE_PROCESSOR (a path to trace_processor_shell);
2. the binary the `perfetto` PyPI package caches after its first download
   (~/.local/share/perfetto/prebuilts/trace_processor_shell-<sha256 prefix>).
Nothing is ever downloaded: without a binary the built-in engine answers instead.
"""

from __future__ import annotations

import os
import platform
import sys
from pathlib import Path
from typing import Any

from phantora.query.errors import EngineUnavailable, QueryError, TraceFileError
from phantora.query.readonly import check_statement, single_statement

ENV_VAR = "PHANTORA_TRACE_PROCESSOR"


def cached_binary() -> Path | None:
    """Where the perfetto package keeps the trace_processor_shell it downloaded, if it did.
    Mirrors perfetto.prebuilts.perfetto_prebuilts.download_or_get_cached without its
    download step."""
    try:
        from perfetto.prebuilts.manifests.trace_processor_shell import TRACE_PROCESSOR_SHELL_MANIFEST
    except ImportError:
        return None
    plat, machine = sys.platform.lower(), platform.machine().lower()
    for entry in TRACE_PROCESSOR_SHELL_MANIFEST:
        if entry.get("platform") == plat and machine in entry.get("machine", []) and entry.get("sha256"):
            root, ext = os.path.splitext(entry["file_name"])
            path = Path.home() / ".local" / "share" / "perfetto" / "prebuilts" / f"{root}-{entry['sha256'][:16]}{ext}"
            return path if path.is_file() else None
    return None


def find_binary() -> Path | None:
    """The trace_processor_shell to use, or None. EngineUnavailable when the environment
    variable names something that is not an executable file."""
    named = os.environ.get(ENV_VAR)
    if named:
        path = Path(named).expanduser()
        if not path.is_file() or not os.access(path, os.X_OK):
            raise EngineUnavailable(f"{ENV_VAR}={named} is not an executable file; point it at a "
                                    "trace_processor_shell binary or unset it to use the built-in engine")
        return path
    return cached_binary()


class TraceProcessorDB:
    """A trace loaded into a trace_processor_shell subprocess (perfetto's Python API)."""

    engine = "trace_processor"

    def __init__(self, trace_path: Path, binary: Path) -> None:
        try:
            from perfetto.trace_processor import TraceProcessor, TraceProcessorConfig
        except ImportError:
            raise EngineUnavailable("the trace processor engine needs the perfetto package: "
                                    "pip install perfetto") from None
        self.binary = binary
        self.import_stats: dict[str, int] = {}
        try:
            self._tp = TraceProcessor(trace=str(trace_path), config=TraceProcessorConfig(bin_path=str(binary)))
        except Exception as e:  # perfetto raises bare Exception / PerfettoException
            raise TraceFileError(f"{trace_path}: trace_processor ({binary}) could not load it: {e}") from None

    def execute(self, sql: str) -> tuple[list[str], list[tuple[Any, ...]]]:
        from phantora.query.sqlite_engine import split_statements

        statement = single_statement(split_statements(sql), sql)
        check_statement(statement)  # trace_processor has no authorizer hook: screen it here
        try:
            result = self._tp.query(statement)
        except Exception as e:
            raise QueryError(str(e).strip(), sql) from None
        columns = list(result.column_names)
        cells = [c.item() if hasattr(c, "item") else c for c in result.cells]
        width = len(columns)
        rows = [tuple(cells[i:i + width]) for i in range(0, len(cells), width)] if width else []
        return columns, rows

    def close(self) -> None:
        self._tp.close()
