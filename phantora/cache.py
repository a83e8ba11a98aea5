"""Where phantora caches what it builds or measures once per machine: the native shim
(interpose/device/shim_build.py), measured kernel times (phantora/cost/measured.py), the test
suite's CUDA-build environment. One rule for all of them, importable from both sides (no torch).
"""

from __future__ import annotations

import fcntl
import os
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
