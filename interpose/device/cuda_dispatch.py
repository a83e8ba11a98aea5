"""Ops that reach the CUDA dispatch key outside phantora's dispatch modes (issue 14, cause 1;
pinned memory allocated in C++, cause 9, is the shim's to tell: shim_calls.is_pinned_ptr).

Framework code sometimes steps around Python dispatch: `no_dispatch()` (FSDP1's record_stream),
C++ that excludes the Python key (`torch.tensor([0-dim CUDA tensors])` reads each element with
item()), or code that runs with the mode stack empty (`_disable_current_modes()`, a tensor
subclass's `__torch_dispatch__` such as DTensor's, where the RNG tracker copies the CUDA RNG
state to the GPU). Such ops land on the CUDA dispatch key. The native shim's kernel for that key
hands them back to the simulation's dispatch modes, so they are reported and computed like every
other op (interpose/device/shim/virtual_cuda.cpp, section "ops that reach the CUDA dispatch key").
"""

from __future__ import annotations

from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

from interpose import runtime as rt_mod
from interpose.device.shim_calls import shim


class CudaDispatchError(RuntimeError):
    pass


def install_cuda_dispatch() -> int:
    """Capture the current thread's dispatch modes (FakeTensorMode + the op observer, entered just
    before) as the simulation's, install the CUDA-key kernel, and route value reads made with the
    mode stack empty to the observer. Returns the number of ops (and fallbacks) given the kernel."""
    _route_value_reads_outside_modes()
    n = shim().phantora_install_cuda_dispatch()
    if n < 0:
        raise CudaDispatchError("phantora: the virtual CUDA dispatch kernel could not be installed (see stderr)")
    return n


# --- value reads with the mode stack empty ---------------------------------------------------
# A tensor subclass's __torch_dispatch__ (DTensor's) runs with the simulation's modes stashed, and
# _disable_current_modes() removes them: ops on virtual tensors there go to
# FakeTensor.__torch_dispatch__, which enters FakeTensorMode alone. That computes shapes, but a
# value read (DTensor's RNG tracker compares the ranks' states with `all(a == b)`) raises
# DataDependentOutputException. Reads go through the op observer instead, which reports them and
# answers them as everywhere else (interpose/values/policy.py). A copy from a virtual GPU to the host is
# a value read too (DTensor's tracker moves the RNG state back to the CPU before handing it to the
# generator, which needs its bytes). Other ops keep FakeTensor's own path: the observer already
# reported the subclass op they implement.
_VALUE_READS = {torch.ops.aten._local_scalar_dense.default, torch.ops.aten.is_nonzero.default,
                torch.ops.aten.equal.default}


def _is_value_read(func: Any, args: tuple, kwargs: dict) -> bool:
    if func in _VALUE_READS:
        return True
    if func is torch.ops.aten._to_copy.default and args and isinstance(args[0], FakeTensor):
        target = kwargs.get("device")
        return args[0].device.type == "cuda" and target is not None and torch.device(target).type == "cpu"
    return False


def _route_value_reads_outside_modes() -> None:
    stock = FakeTensor.__dict__["__torch_dispatch__"].__func__
    if getattr(stock, "_phantora_routes_reads", False):
        return

    def __torch_dispatch__(cls: type, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        if _is_value_read(func, args, kwargs or {}) and not _get_current_dispatch_mode_stack():
            observer = rt_mod.get().observer
            fake_mode = next((a.fake_mode for a in args if isinstance(a, FakeTensor)), None)
            if observer is not None and fake_mode is not None:
                with fake_mode, observer:
                    return func(*args, **(kwargs or {}))
        return stock(cls, func, types, args, kwargs)

    __torch_dispatch__._phantora_routes_reads = True  # type: ignore[attr-defined]
    FakeTensor.__torch_dispatch__ = classmethod(__torch_dispatch__)  # type: ignore[assignment]
