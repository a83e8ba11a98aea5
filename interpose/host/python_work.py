"""The counted Python clock: the program's Python work, counted, at the reference host's cost.

`--host-time counted` (the default) charges the program's own Python by what it executes, not by
how long this machine took: a C trace function (native/python_work.c) counts the bytecode
instructions each thread runs and the Python frames it enters, and weighs them by the cost of an
instruction and of a call on the reference host (phantora/cost/host.py PythonWork). The reading
is the same whatever this machine's load, however many rank processes share its cores, and from
run to run. phantora's own code never counts: the brackets of host_time.py pause the clock, and
code from phantora's own files (and the FakeTensor machinery that stands for the GPU) is skipped
wherever it runs.

The extension is built once per interpreter with the system's C compiler and cached under
phantora's cache dir (phantora/cache.py), like the CUDA shim; a file lock makes concurrent first
runs build it once. It does not import torch.
"""

from __future__ import annotations

import dis
import hashlib
import importlib.machinery
import importlib.util
import json
import os
import sys
import sysconfig
from pathlib import Path
from types import ModuleType

from phantora.cache import build_once, cache_dir, compile_python_extension
from phantora.cost.host import PYTHON_WORK, PythonWork

SOURCE = Path(__file__).with_name("native") / "python_work.c"
MODULE = "_phantora_python_work"
PROFILE_ENV = "PHANTORA_PROFILE_PYTHON_WORK"
# Opcodes that call something, across 3.10-3.13 (3.11's PRECALL only prepares its CALL)
CALL_OPCODES = frozenset({"CALL", "CALL_FUNCTION", "CALL_FUNCTION_KW", "CALL_FUNCTION_EX", "CALL_METHOD", "CALL_KW"})


class CounterBuildError(RuntimeError):
    pass


def own_source_dirs() -> tuple[str, ...]:
    """interpose/ and phantora/ (each ending in a separator) as imported and as resolved: an
    installed phantora's traced command imports them through the links of launch.import_dir, and
    code objects keep that path; the resolved one is the checkout or site-packages."""
    roots = dict.fromkeys([Path(os.path.abspath(__file__)).parents[2], Path(__file__).resolve().parents[2]])
    return tuple(str(root / name) + os.sep for root in roots for name in ("interpose", "phantora"))


def excluded_prefixes() -> tuple[str, ...]:
    """Source files whose code is phantora's work, not the program's: phantora itself and what it
    runs in place of a GPU (FakeTensorMode, its fake kernels, the dispatch-mode plumbing).
    benchmarks/host/count_probe.py compares what is counted with and without phantora."""
    prefixes = list(own_source_dirs())
    spec = importlib.util.find_spec("torch")
    if spec is not None and spec.submodule_search_locations:
        torch_dir = Path(list(spec.submodule_search_locations)[0])
        # FakeTensorMode and its fake kernels; the rule look-up the C++ dispatcher runs before
        # entering a dispatch mode (for phantora's own mode on every op)
        prefixes += [str(torch_dir / "_subclasses") + os.sep, str(torch_dir / "_library" / "simple_registry.py")]
    return tuple(prefixes)


def extension_path() -> Path:
    """The counter built for this interpreter, building it first if it is not cached yet."""
    include = sysconfig.get_paths()["include"]
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    key = hashlib.sha256(b"\0".join([SOURCE.read_bytes(), sys.version.encode(), include.encode(),
                                     suffix.encode()])).hexdigest()[:16]
    return build_once(cache_dir() / "python_work" / f"{MODULE}-{key}{suffix}", _compile)


def _compile(target: Path) -> None:
    compile_python_extension(SOURCE, target, "its Python work counter", CounterBuildError,
                             fallback=", or run with --host-time modelled")


def load(costs: PythonWork = PYTHON_WORK) -> ModuleType:
    """The counter module, with the reference host's costs and phantora's files excluded."""
    path = extension_path()
    spec = importlib.util.spec_from_file_location(MODULE, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.set_costs(costs.instruction_ps, costs.call_site_ps, costs.call_ps)
    module.set_call_opcodes(bytes(op for name, op in dis.opmap.items() if name in CALL_OPCODES))
    module.exclude(excluded_prefixes())
    profile = os.environ.get(PROFILE_ENV)
    if profile and not getattr(module, "_profiling", False):
        _profile_to(module, Path(profile))
    return module


def _profile_to(module: ModuleType, path: Path) -> None:
    """PHANTORA_PROFILE_PYTHON_WORK=FILE: where the counted instructions went, by function and
    caller, written as JSON lines (largest first) when the process exits: to find what a program's
    host time is made of, or what of phantora's own still counts as the program's."""
    import atexit

    counts: dict = {}
    module.profile_by_code(counts)
    module._profiling = True

    def dump() -> None:
        module.profile_by_code(None)
        merged: dict[tuple, int] = {}
        for (file, name, _line, caller_file, caller), n in counts.items():
            key = (file, name, caller_file, caller)
            merged[key] = merged.get(key, 0) + n
        with open(f"{path}.{os.getpid()}", "w") as f:
            for (file, name, caller_file, caller), n in sorted(merged.items(), key=lambda kv: -kv[1]):
                f.write(json.dumps({"instructions": n, "file": file, "function": name, "caller_file": caller_file,
                                    "caller": caller}) + "\n")

    atexit.register(dump)
