"""Where phantora caches what it builds or measures once per machine: the native shim
(interpose/device/shim_build.py), measured kernel times (phantora/cost/measured.py), the test
suite's CUDA-build environment. One rule for all of them, importable from both sides (no torch).
"""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """$PHANTORA_CACHE_DIR, else $XDG_CACHE_HOME/phantora, else ~/.cache/phantora."""
    base = os.environ.get("PHANTORA_CACHE_DIR")
    if base:
        return Path(base)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "phantora"
