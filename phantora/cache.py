"""Where phantora caches what it builds or measures once per machine: the native shim
(interpose/device/shim_build.py) and C extension modules, measured kernel times (phantora/cost/measured.py), the test
suite's CUDA-build environment. One rule for all of them, importable from both sides (no torch).
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sysconfig
import tempfile
from pathlib import Path
from typing import Callable


def cache_dir() -> Path:
    """$PHANTORA_CACHE_DIR, else $XDG_CACHE_HOME/phantora, else ~/.cache/phantora."""
    base = os.environ.get("PHANTORA_CACHE_DIR")
    if base:
        return Path(base)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "phantora"


def build_once(target: Path, build: Callable[[Path], None]) -> Path:
    """`target`, built first by `build(target)` if it is not there yet. A file lock in its folder
    makes concurrent first runs (8 ranks starting at once) build it once."""
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / ".build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not target.exists():  # another process may have built it while we waited
            build(target)
    return target


def compile_python_extension(source: Path, target: Path, what: str, error: type[Exception], fallback: str = "") -> None:
    """Build the C source of a Python extension module into `target` with the system C compiler
    and this interpreter's headers (for build_once). `what` names it in errors ("its Python work
    counter"); `fallback` says how to do without it, if one can."""
    cc = os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc") or shutil.which("clang")
    if not cc:
        raise error(f"phantora needs a C compiler (gcc or clang) to build {what} once; install one "
                    f"(e.g. apt install gcc), set CC{fallback}")
    include = sysconfig.get_paths()["include"]
    if not (Path(include) / "Python.h").exists():
        raise error(f"Python's headers are missing ({include}/Python.h); phantora needs them to build {what}: "
                    f"install them (e.g. apt install python3-dev){fallback}")
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
    os.close(fd)
    cmd = [cc, "-O2", "-shared", "-fPIC", "-w", f"-I{include}", str(source), "-o", tmp]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        os.unlink(tmp)
        raise error(f"compiling {what} failed:\n$ {' '.join(cmd)}\n{proc.stderr[-4000:]}")
    os.replace(tmp, target)  # atomic: a rank never loads half a file
