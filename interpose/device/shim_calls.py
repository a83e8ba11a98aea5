"""The native shim's C functions that Python calls (shim/virtual_cuda.cpp), through ctypes.

launch/hook.py loads the shim with RTLD_GLOBAL before torch's first import, so its symbols are
in the process's global namespace. This module imports neither torch nor the rest of interpose:
the runtime asks it whether host memory is pinned, and cuda_dispatch.py (which imports the
runtime) installs the shim's CUDA-key kernel through it.
"""

from __future__ import annotations

import ctypes
import functools


@functools.cache
def shim() -> ctypes.PyDLL:
    # PyDLL keeps the GIL held during the calls: installing copies the Python mode objects' handles.
    lib = ctypes.PyDLL(None)
    lib.phantora_install_cuda_dispatch.restype = ctypes.c_int
    lib.phantora_install_cuda_dispatch.argtypes = []
    lib.phantora_is_pinned_ptr.restype = ctypes.c_int
    lib.phantora_is_pinned_ptr.argtypes = [ctypes.c_void_p]
    return lib


def is_pinned_ptr(address: int) -> bool:
    """Whether host memory at `address` came from the pinned allocator (C++ `pin_memory=True`
    allocations, e.g. DDP's reducer, and real CPU tensors' .pin_memory())."""
    return address != 0 and bool(shim().phantora_is_pinned_ptr(address))
