"""Build (once) and locate the native virtual-CUDA shim for the installed torch.

Must not import torch: the shim has to be loaded *before* torch's first import. The built
library is cached under $PHANTORA_CACHE_DIR (default ~/.cache/phantora), keyed by the shim
source, the torch build and the compiler, so every later run (and every rank) reuses it. A file
lock makes concurrent first runs (8 ranks starting at once) compile only once.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from phantora.cache import build_once, cache_dir

SHIM_SOURCE = Path(__file__).with_name("shim") / "virtual_cuda.cpp"


class ShimBuildError(RuntimeError):
    pass


@dataclass(frozen=True)
class TorchInstall:
    root: Path  # .../site-packages/torch
    version: str  # "2.13.0+cpu"
    cuda: str | None  # CUDA version the build targets, None for CPU builds

    @property
    def include_dirs(self) -> list[Path]:
        inc = self.root / "include"
        return [inc, inc / "torch" / "csrc" / "api" / "include"]

    @property
    def lib_dir(self) -> Path:
        return self.root / "lib"


def find_torch() -> TorchInstall:
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        raise ShimBuildError("torch is not installed in this Python environment (pip install torch==2.13.0)")
    root = Path(list(spec.submodule_search_locations)[0])
    version, cuda = "unknown", None
    version_file = root / "version.py"
    if version_file.exists():
        scope: dict = {}
        # version.py is a handful of assignments; executing it does not import torch.
        exec(compile(version_file.read_text(), str(version_file), "exec"), scope)
        version = str(scope.get("__version__", "unknown"))
        cuda = scope.get("cuda")
    return TorchInstall(root, version, cuda)



def _compiler() -> str:
    cxx = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++") or shutil.which("clang++")
    if not cxx:
        raise ShimBuildError(
            "phantora needs a C++17 compiler (g++ or clang++) to build its virtual CUDA shim once; "
            "install one (e.g. apt install g++) or set CXX"
        )
    return cxx


def _compiler_id(cxx: str) -> str:
    try:
        return subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError) as e:
        raise ShimBuildError(f"cannot run the C++ compiler {cxx!r}: {e}") from e


def shim_path(torch_install: TorchInstall | None = None) -> Path:
    """Path of the shim for this torch, building it first if it is not cached yet."""
    ti = torch_install or find_torch()
    cxx = _compiler()
    key = hashlib.sha256(
        b"\0".join([
            SHIM_SOURCE.read_bytes(),
            ti.version.encode(),
            str(ti.root).encode(),
            _compiler_id(cxx).encode(),
            sys.implementation.cache_tag.encode(),
        ])
    ).hexdigest()[:16]
    target = cache_dir() / "shim" / f"virtual_cuda-{ti.version}-{key}.so"
    return build_once(target, lambda t: _compile(cxx, ti, t))


def link_libraries(ti: TorchInstall) -> list[str]:
    """torch libraries the shim depends on. On a CUDA build it also depends on torch's CUDA
    libraries, so that loading the shim loads them first: their static registrations (the real
    CUDA guard, hooks and SDPA chooser) then run before the shim's, which replace them."""
    libs = ["c10", "torch_cpu"]
    if ti.cuda is not None:
        libs += ["c10_cuda", "torch_cuda"]
    return libs


def _compile(cxx: str, ti: TorchInstall, target: Path) -> None:
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
    os.close(fd)
    cmd = [
        cxx, "-O2", "-shared", "-fPIC", "-std=c++20", "-w",
        *(f"-I{d}" for d in ti.include_dirs),
        str(SHIM_SOURCE), "-o", tmp,
        *(["-DPHANTORA_TORCH_CUDA_BUILD"] if ti.cuda is not None else []),
        f"-L{ti.lib_dir}", "-Wl,--no-as-needed", *(f"-l{lib}" for lib in link_libraries(ti)),
        f"-Wl,-rpath,{ti.lib_dir}",
    ]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    except subprocess.TimeoutExpired as e:
        os.unlink(tmp)
        raise ShimBuildError("compiling the virtual CUDA shim took over 10 minutes; giving up") from e
    if proc.returncode != 0:
        os.unlink(tmp)
        raise ShimBuildError(
            f"compiling phantora's virtual CUDA shim failed (torch {ti.version} at {ti.root}):\n"
            f"$ {' '.join(cmd)}\n{proc.stderr[-4000:]}"
        )
    os.replace(tmp, target)


if __name__ == "__main__":
    print(shim_path())
