"""Patch a module of torch when something first imports it, not before.

phantora adjusts a few torch modules that are expensive to import and that most programs never
touch (torch.utils.cpp_extension imports setuptools, ~0.25 s; Inductor's joint-graph passes
~2.5 s): importing them at start-up would cost every rank that time, so the patch waits on the
import instead.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
import types
from typing import Any, Callable


class _PatchOnImport(importlib.abc.MetaPathFinder):
    def __init__(self, fullname: str, patch: Callable[[types.ModuleType], None]) -> None:
        self.fullname = fullname
        self.patch = patch

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != self.fullname:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return None
        original_exec = spec.loader.exec_module

        def exec_module(module: types.ModuleType) -> None:
            original_exec(module)
            self.patch(module)

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def patch_when_imported(fullname: str, patch: Callable[[types.ModuleType], None]) -> None:
    """Call patch(module) now if `fullname` is imported already, else right after its import."""
    module = sys.modules.get(fullname)
    if module is not None:
        patch(module)
    elif not any(isinstance(f, _PatchOnImport) and f.fullname == fullname for f in sys.meta_path):
        sys.meta_path.insert(0, _PatchOnImport(fullname, patch))
