"""Importing a GPU-only extension module under phantora: a module made by phantora answers.

Extension modules whose CUDA code cannot run on tensors that hold no data (FlashAttention 3's
`flash_attn_interface`, Apex's `amp_C`, ...) are answered, whether they are installed or not,
by stand-ins whose functions issue ops phantora observes and times (flash_attn3.py,
apex_kernels.py).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types
from collections.abc import Callable, Collection
from typing import Any


class _StandInLoader(importlib.abc.Loader):
    def __init__(self, make: Callable[[str], types.ModuleType]) -> None:
        self.make = make

    def create_module(self, spec: Any) -> types.ModuleType:
        return self.make(spec.name)

    def exec_module(self, module: types.ModuleType) -> None:
        return None


class StandInFinder(importlib.abc.MetaPathFinder):
    """Answers `import name`, for each of `names`, with `make(name)`."""

    def __init__(self, names: Collection[str], make: Callable[[str], types.ModuleType]) -> None:
        self.names = names
        self.make = make

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname not in self.names:
            return None
        return importlib.machinery.ModuleSpec(fullname, _StandInLoader(self.make), origin="phantora")


def install_stand_ins(names: Collection[str], make: Callable[[str], types.ModuleType]) -> None:
    """Answer these imports with stand-ins from now on, ahead of any installed module (once)."""
    if not any(isinstance(f, StandInFinder) and f.make is make for f in sys.meta_path):
        sys.meta_path.insert(0, StandInFinder(names, make))
