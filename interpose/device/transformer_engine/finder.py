"""`import transformer_engine` under phantora: TE's package, seen from a folder that holds
phantora's extension beside it.

TE finds its PyTorch extension as a file: the first `transformer_engine_torch*.so` in the folder
that holds the imported `transformer_engine` package (an in-place build), in that package, or in
its `wheel_lib/` (transformer_engine/common/__init__.py _get_shared_object_file). The finder
answers `import transformer_engine` with the installed package through a folder under phantora's
cache dir (the "overlay": a symlink to the installed package, and phantora's extension built for
this interpreter), so TE's own search finds phantora's extension and TE's files run unchanged.

Importing the package also runs transformer_engine.common's checks of a PyPI install (a core
package transformer-engine-cu12/cu13 must be installed) and its ctypes loads of cuDNN, NVRTC,
cuRAND and libtransformer_engine.so, none of which a CPU machine has. TE skips all of them while
it builds itself (NVTE_PROJECT_BUILDING); the finder sets that variable while the package's
__init__ runs and restores the environment afterwards.

Must not import torch: installed at interpreter start, before torch's import.
"""

from __future__ import annotations

import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
from pathlib import Path
from typing import Any

from phantora.cache import build_once, cache_dir, compile_python_extension

PACKAGE = "transformer_engine"
EXTENSION = "transformer_engine_torch"
SOURCE = Path(__file__).with_name("native") / "extension.c"
SKIP_NATIVE_LOADS = "NVTE_PROJECT_BUILDING"  # read by transformer_engine/common/__init__.py at import


class TransformerEngineSetupError(ImportError):
    pass


def _compile(target: Path) -> None:
    compile_python_extension(SOURCE, target, "its stand-in for Transformer Engine's extension (transformer_engine_torch)",
                             TransformerEngineSetupError)


def overlay_for(package_dir: Path) -> Path:
    """The folder that shows the installed TE package at `package_dir` beside phantora's extension,
    made (once; concurrent ranks make it once) under phantora's cache dir."""
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    key = hashlib.sha256(b"\0".join([SOURCE.read_bytes(), str(package_dir.resolve()).encode(),
                                     sys.version.encode(), suffix.encode()])).hexdigest()[:16]
    overlay = cache_dir() / "transformer_engine" / key
    build_once(overlay / f"{EXTENSION}{suffix}", _compile)
    link = overlay / PACKAGE
    if not link.is_symlink():
        tmp = overlay / f".{PACKAGE}.{os.getpid()}"
        tmp.unlink(missing_ok=True)
        tmp.symlink_to(package_dir.resolve(), target_is_directory=True)
        os.replace(tmp, link)  # atomic: ranks racing here all leave the same link
    return overlay


class _Loader(importlib.abc.Loader):
    """TE's own source loader for its __init__, run with TE's native loads skipped."""

    def __init__(self, inner: importlib.abc.Loader) -> None:
        self.inner = inner

    def create_module(self, spec: Any) -> Any:
        return self.inner.create_module(spec)

    def exec_module(self, module: Any) -> None:
        before = os.environ.get(SKIP_NATIVE_LOADS)
        os.environ[SKIP_NATIVE_LOADS] = "1"
        try:
            self.inner.exec_module(module)
        finally:
            if before is None:
                os.environ.pop(SKIP_NATIVE_LOADS, None)
            else:
                os.environ[SKIP_NATIVE_LOADS] = before

    def __getattr__(self, name: str) -> Any:  # get_source, get_code, ... for tracebacks and inspect
        return getattr(self.inner, name)


class TransformerEngineFinder(importlib.abc.MetaPathFinder):
    """Answers `import transformer_engine` with the installed package, seen from its overlay."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != PACKAGE:
            return None
        real = importlib.machinery.PathFinder.find_spec(fullname)
        if real is None or real.origin is None or not real.submodule_search_locations:
            return None  # not installed: Python's own ModuleNotFoundError
        package_dir = Path(real.origin).parent
        init = overlay_for(package_dir) / PACKAGE / Path(real.origin).name
        spec = importlib.util.spec_from_file_location(fullname, init,
                                                      submodule_search_locations=[str(init.parent)])
        if spec is None or spec.loader is None:
            return None
        spec.loader = _Loader(spec.loader)
        return spec


def install_transformer_engine() -> None:
    if PACKAGE in sys.modules:
        raise TransformerEngineSetupError(
            "phantora: transformer_engine was imported before phantora's interposition was installed")
    if not any(isinstance(f, TransformerEngineFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, TransformerEngineFinder())
