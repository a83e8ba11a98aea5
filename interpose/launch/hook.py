"""Sets up a user process for simulation at `import torch`.

bootstrap/sitecustomize.py (on the child's PYTHONPATH) calls `install_import_hook()` at
interpreter start. The hook loads the native shim *before* torch's first import (torch._C
caches getCUDAHooks() at init) and installs everything else right after torch's import
finishes: FakeTensor fixes, torch.cuda, the virtual clock, thread and DataLoader-worker
handling, and finally the FakeTensorMode + op observer for the whole program.
"""

from __future__ import annotations

import atexit
import ctypes
import importlib.abc
import importlib.util
import os
import sys
import threading
from typing import Any

_installed = False


class InterpositionError(ImportError):
    pass


def sdpa_priority(capability_major: int) -> str:
    """The order in which torch tries fused attention backends on this GPU generation: cuDNN
    first on Hopper and newer (seen on a real H100 with torch 2.11), flash first before."""
    return "cudnn,flash,efficient" if capability_major >= 9 else "flash,efficient,cudnn"


def before_torch_import() -> None:
    from interpose.runtime import visible_devices
    from interpose.device.shim_build import find_torch, shim_path
    from phantora.hardware import DEFAULT_GPU, lookup_gpu

    gpu = lookup_gpu(os.environ.get("PHANTORA_GPU", DEFAULT_GPU))
    os.environ.setdefault("PHANTORA_SDPA_PRIORITY", sdpa_priority(gpu.capability[0]))
    ti = find_torch()
    shim = ctypes.CDLL(str(shim_path(ti)), mode=ctypes.RTLD_GLOBAL)
    # Set here rather than through the environment, which child processes inherit: a child
    # applies its own CUDA_VISIBLE_DEVICES to the node's GPUs, as the CUDA driver does.
    node_gpus = int(os.environ.get("PHANTORA_DEVICE_COUNT", "8"))
    shim.phantora_shim_set_device_count(len(visible_devices(os.environ.get("CUDA_VISIBLE_DEVICES"), node_gpus)))


def after_torch_import() -> None:
    global _installed
    import torch
    import torch._dynamo  # noqa: F401  (dynamo keys trace rules by identity: import before patching)

    from interpose import runtime as rt_mod
    from interpose.host.clock import VirtualClock, install_clock, restore_real_clock
    from interpose.device.cuda_api import install_cuda_api
    from interpose.device.cuda_extensions import install_cuda_extensions
    from interpose.device.cuda_dispatch import install_cuda_dispatch
    from interpose.distributed.data_parallel import install_data_parallel
    from interpose.device.fake import install_fake_fixes, make_fake_mode
    from interpose.ops.observer import OpObserver, install_metadata_only_regions
    from interpose.distributed.pickling import install_pickling
    from interpose.host.python_events import install_python_events
    from interpose.values.policy import install_value_hints

    rt = rt_mod.install_runtime(rt_mod.RankConfig.from_env())
    install_fake_fixes()
    install_pickling()
    install_value_hints()
    install_cuda_api()
    install_data_parallel()
    install_cuda_extensions()
    from interpose.device.flash_attn3 import install_flash_attn3
    from interpose.ops import observer as observer_mod

    install_flash_attn3(observer_mod._SPECIAL)  # FlashAttention 3's stand-in (flash_attn_interface)
    from interpose.device.apex_kernels import install_apex_kernels

    install_apex_kernels()  # Apex's extension modules (amp_C, scaled_masked_softmax_cuda, ...)
    clock = VirtualClock(rt.client, rt.host_thread)
    install_clock(clock)

    from interpose.device.fake import VirtualCudaFakeMode
    from interpose.ops.hops import install_hops

    install_hops(VirtualCudaFakeMode, OpObserver)
    fake_mode = make_fake_mode()
    observer = OpObserver(rt)
    install_metadata_only_regions()
    rt.observer = observer
    from interpose.compile.torch_compile import install_compile

    install_compile(OpObserver, rt, clock)
    install_python_events(rt)
    from interpose.ops.observer import install_storage_resize

    install_storage_resize(rt)
    from interpose.device.addresses import install_virtual_addresses

    install_virtual_addresses(rt)
    from interpose.distributed.process_group import install_distributed

    install_distributed(rt)
    fake_mode.__enter__()
    observer.__enter__()
    install_cuda_dispatch()  # after entering the modes: it captures them (cuda_dispatch.py)
    _install_thread_inheritance(fake_mode, observer)
    _install_worker_exit(rt, clock, restore_real_clock)

    def in_forked_child() -> None:
        # The child shares the parent's socket; it must never write to it. CUDA cannot be used
        # after fork on a real GPU either.
        rt.client.disable("CUDA cannot be used in a forked subprocess (use the 'spawn' start method)")
        rt.active = False
        clock.enabled = False

    os.register_at_fork(after_in_child=in_forked_child)
    atexit.register(rt.client.close)
    _installed = True


def _install_thread_inheritance(fake_mode: Any, observer: Any) -> None:
    """threading.Thread does not inherit the dispatch mode stack (it is thread-local). A thread
    started by a thread that is inside the simulation (a prefetcher, the pin-memory thread)
    gets both modes; threads started outside it (inside DataLoader workers, which left the
    simulation) do not."""
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

    original_start = threading.Thread.start
    original_run = threading.Thread.run

    def start(self: threading.Thread) -> None:
        self._phantora_simulated = observer in _get_current_dispatch_mode_stack()  # type: ignore[attr-defined]
        return original_start(self)

    def run(self: threading.Thread) -> None:
        if not getattr(self, "_phantora_simulated", False) or _get_current_dispatch_mode_stack():
            return original_run(self)
        with fake_mode, observer:
            return original_run(self)

    threading.Thread.start = start  # type: ignore[method-assign]
    threading.Thread.run = run  # type: ignore[method-assign]


def _install_worker_exit(rt: Any, clock: Any, restore_real_clock: Any) -> None:
    """DataLoader workers produce real CPU tensors: they leave the simulation entirely (no fake
    tensors, real clock, no connection to the simulator)."""
    import torch.utils.data._utils.worker as worker
    from torch.utils._python_dispatch import _disable_current_modes

    from interpose.host.data_loading import install_loader_timing, time_worker_batches

    install_loader_timing(rt)

    original = worker._worker_loop

    def _worker_loop(*args: Any, **kwargs: Any) -> Any:
        rt.active = False
        rt.client.disable("a DataLoader worker does not use the GPU")
        clock.enabled = False
        restore_real_clock()
        args, kwargs = time_worker_batches(args, kwargs)  # what each batch costs (data_loading.py)
        with _disable_current_modes():
            return original(*args, **kwargs)

    worker._worker_loop = _worker_loop


class _TorchImportHook(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != "torch":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec("torch")
        if spec is None or spec.loader is None:
            return None
        try:
            before_torch_import()
        except InterpositionError:
            raise
        except Exception as e:
            raise InterpositionError(f"phantora: could not prepare virtual GPUs before importing torch: {e}") from e
        loader = spec.loader
        original_exec = loader.exec_module

        def exec_module(module: Any) -> None:
            original_exec(module)
            try:
                after_torch_import()
            except Exception as e:
                raise InterpositionError(f"phantora: could not install virtual GPUs into torch: {type(e).__name__}: {e}") from e

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def install_import_hook() -> None:
    if "torch" in sys.modules:
        raise InterpositionError("phantora: torch was imported before the interposition hook could run")
    sys.meta_path.insert(0, _TorchImportHook())
    # Transformer Engine's package imports without torch (transformer_engine.common), so its finder
    # is installed now, not with torch's (interpose/device/transformer_engine)
    from interpose.device.transformer_engine import install_transformer_engine

    install_transformer_engine()
