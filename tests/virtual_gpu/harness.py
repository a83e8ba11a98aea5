"""Running a small user script under `phantora trace` on either torch build, for the tests of the
virtual GPU (each cause in issue 14 has a minimal reproduction in tests/virtual_gpu/scripts/).

A script checks what a real GPU would do with plain asserts and prints `ok <name>` lines; a test
runs it on the CPU build (the test interpreter) and on the CUDA build of torch (the
`cuda_torch_python` fixture) and asserts exit 0 and the expected `ok` lines.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = Path(__file__).resolve().parent / "scripts"

# Parametrize a test over both torch builds of the user's process:
#   @BUILDS
#   def test_x(tmp_path, user_python): ...
BUILDS = pytest.mark.parametrize("user_python", ["cpu-build", "cuda-build"], indirect=True)


def run_traced(tmp_path: Path, python: str, script: str | Path, *args: str, options: tuple[str, ...] = (),
               name: str = "run.json", timeout: float = 600, env: dict | None = None,
               launcher: tuple[str, ...] = ()) -> tuple[subprocess.CompletedProcess, Path]:
    """`phantora trace [options] -o tmp_path/name -- [launcher] python script args`."""
    out = tmp_path / name
    script_path = Path(script) if Path(script).is_absolute() else SCRIPTS / script
    cmd = [sys.executable, "-m", "phantora.cli", "trace", *options, "-o", str(out), "--", *launcher, python,
           str(script_path), *args]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=env)
    return proc, out


def passed(stdout: str, name: str) -> bool:
    """Whether the script printed `ok NAME`. Found anywhere, not at a line start: ranks share one
    pipe, and with PYTHONUNBUFFERED (set in CI) print() writes its text and its newline apart,
    so two ranks' lines interleave ("ok aok a\n\n", "ok rank 1ok rank 0"): the name may be
    followed by another rank's "ok ", but not by more of a longer name."""
    return re.search(re.escape(f"ok {name}") + r"(?:(?![\w])|(?=ok ))", stdout) is not None


def assert_ran(proc: subprocess.CompletedProcess, *expected_ok: str) -> None:
    """Exit 0 and every `ok NAME` line the script prints when a check passed."""
    detail = f"\n--- stdout\n{proc.stdout[-4000:]}\n--- stderr\n{proc.stderr[-6000:]}"
    assert proc.returncode == 0, f"exit {proc.returncode}{detail}"
    missing = {name for name in expected_ok if not passed(proc.stdout, name)}
    assert not missing, f"checks that did not pass: {sorted(missing)}{detail}"
