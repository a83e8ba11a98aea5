"""Per-process state of an interposed rank: its configuration, its connection to the simulator,
the memory of its virtual GPUs, and interned op signatures.

Configuration comes from environment variables that `phantora trace` sets for the command it
runs (and torchrun passes on to its workers):
  PHANTORA_SOCKET         path of the simulator's Unix socket (interposition is off without it)
  PHANTORA_GPU            GPU model key from phantora.hardware (default h100-sxm-80gb)
  PHANTORA_VRAM           memory per GPU in bytes, overriding the model's
  PHANTORA_DEVICE_COUNT   GPUs visible to the process (the node's GPU count)
  PHANTORA_CALL_TIMEOUT   seconds to wait for any answer from the simulator (default 600)
  RANK, LOCAL_RANK, GROUP_RANK, WORLD_SIZE   as torchrun sets them (default: a single rank 0)
"""

from __future__ import annotations

import os
import threading
import weakref
from dataclasses import dataclass, field
from typing import Any

from interpose.client import SimClient
from interpose.clock import HostThread
from phantora import protocol as P
from phantora.engine.memory import CachingAllocator
from phantora.hardware import DEFAULT_GPU, GPUSpec, lookup_gpu

# Measured on an H100 80GB (tests/data/groundtruth/): CUDA context and library handles take
# ~684 MiB outside PyTorch's allocator; the first GEMM on a stream allocates cuBLAS's 32 MiB
# workspace through the allocator (torch's default on Hopper and newer).
NON_PYTORCH_BYTES = 684 << 20
CUBLAS_WORKSPACE_BYTES = 32 << 20


@dataclass(frozen=True)
class RankConfig:
    socket_path: str
    gpu: GPUSpec
    total_memory: int
    device_count: int
    rank: int
    local_rank: int
    node: int
    world_size: int
    call_timeout_s: float

    @staticmethod
    def from_env(env: os._Environ[str] | dict[str, str] = os.environ) -> "RankConfig":
        gpu = lookup_gpu(env.get("PHANTORA_GPU", DEFAULT_GPU))
        vram = env.get("PHANTORA_VRAM")
        return RankConfig(
            socket_path=env["PHANTORA_SOCKET"],
            gpu=gpu,
            total_memory=int(vram) if vram else gpu.total_memory,
            device_count=int(env.get("PHANTORA_DEVICE_COUNT", "8")),
            rank=int(env.get("RANK", "0")),
            local_rank=int(env.get("LOCAL_RANK", "0")),
            node=int(env.get("GROUP_RANK", "0")),
            world_size=int(env.get("WORLD_SIZE", "1")),
            call_timeout_s=float(env.get("PHANTORA_CALL_TIMEOUT", "600")),
        )


@dataclass
class DeviceMemory:
    """One virtual GPU's allocator plus the live storages that hold its blocks."""

    allocator: CachingAllocator
    blocks: dict[int, int] = field(default_factory=dict)  # storage cdata -> allocator handle
    nbytes: dict[int, int] = field(default_factory=dict)  # storage cdata -> bytes accounted
    workspace_streams: set[int] = field(default_factory=set)


class Runtime:
    """Everything one interposed process knows; there is one instance per process."""

    def __init__(self, config: RankConfig) -> None:
        self.config = config
        self.client = SimClient(
            config.socket_path,
            {"rank": config.rank, "local_rank": config.local_rank, "node": config.node,
             "world_size": config.world_size},
            config.call_timeout_s,
        )
        self.devices: dict[int, DeviceMemory] = {}
        self.sig_ids: dict[Any, int] = {}
        # Page-locked host storages, by StorageImpl address. Weak: an address is reused once its
        # storage is freed, and a stale entry would make a fresh pageable tensor look pinned
        # (torch preserves a storage's Python object, so the weakref dies with the storage).
        self._pinned: dict[int, weakref.ref] = {}
        self.lock = threading.RLock()
        self.host_thread = HostThread(self.lock)  # whose sleeps move the simulated host clock (clock.py)
        self.dispatch_lock = threading.RLock()  # serialises ops through FakeTensorMode (observer.py)
        self._storage_refs: dict[int, weakref.ref] = {}
        self.next_event_id = 0
        self.active = True  # False in DataLoader workers and forked children
        self.in_optimizer = 0  # depth of Optimizer.step calls (python_events.py)
        self.observer: Any = None  # the OpObserver, once installed (benchmarks read its op count)
        # (device, stream) -> allocator key of the CUDA-graph private pool its allocations go to
        # while it captures (interpose/cuda_graphs.py; phantora/engine/memory.py graph pools)
        self.pool_routes: dict[tuple[int, int], int] = {}
        self.capturing: dict[tuple[int, int], Any] = {}  # (device, stream) -> the CUDA graph capture on it

    # --- memory ----------------------------------------------------------------------------
    def check_device(self, index: int) -> int:
        n = self.config.device_count
        if not 0 <= index < n:
            import torch

            error = getattr(torch, "AcceleratorError", RuntimeError)
            raise error(
                f"CUDA error: invalid device ordinal\nphantora: cuda:{index} does not exist; the simulated "
                f"node has {n} GPUs (cuda:0 to cuda:{n - 1}); change the device index or --gpus-per-node"
            )
        return index

    def device_memory(self, device: int) -> DeviceMemory:
        dm = self.devices.get(device)
        if dm is None:
            self.check_device(device)
            alloc = CachingAllocator(self.config.total_memory, NON_PYTORCH_BYTES, device)
            dm = self.devices[device] = DeviceMemory(alloc)
        return dm

    def track_storage(self, storage: Any, device: int, stream: int) -> None:
        """Account a device storage at its current size: a new one, or one an op resized (an
        `out=` tensor grown from 0 elements); raises the allocator's OutOfMemory if it does
        not fit. As in resize_bytes_cuda, a new size is allocated before the old block is freed."""
        key = storage._cdata
        dm = self.device_memory(device)
        nbytes = storage.nbytes()
        old = dm.blocks.get(key)
        if old is not None and dm.nbytes[key] == nbytes:
            return
        pool = self.pool_routes.get((device, stream), stream) if self.pool_routes else stream
        handle = dm.allocator.malloc(nbytes, pool)  # a capturing stream allocates from its graph's pool
        if old is None:
            self._storage_refs[key] = weakref.ref(
                storage, lambda _r, key=key, device=device: self._storage_freed(key, device))
        else:
            dm.allocator.free(old)
        dm.blocks[key] = handle
        dm.nbytes[key] = nbytes
        self._report_memory(device, dm)

    def resize_storage(self, storage: Any, stream_of: Any) -> None:
        """Account `UntypedStorage.resize_`, which is no aten op: FSDP2 frees its unsharded
        parameters with resize_(0) and brings them back with resize_(n) while the storage
        object lives on. Storages no op has made on a device (host ones) are left alone."""
        key = storage._cdata
        with self.lock:
            device = next((d for d, dm in self.devices.items() if key in dm.blocks), None)
            if device is not None:
                self.track_storage(storage, device, stream_of(device))

    def _storage_freed(self, key: int, device: int) -> None:
        with self.lock:
            self._storage_refs.pop(key, None)
            dm = self.devices.get(device)
            if dm is None or not self.active:
                return
            handle = dm.blocks.pop(key, None)
            dm.nbytes.pop(key, None)
            if handle is None:
                return
            dm.allocator.free(handle)
            self._report_memory(device, dm)

    def cublas_workspace(self, device: int, stream: int) -> None:
        """cuBLAS allocates its workspace through the caching allocator at the first GEMM on a
        stream and keeps it (torch.cuda.memory_allocated includes it)."""
        dm = self.device_memory(device)
        if stream in dm.workspace_streams:
            return
        dm.workspace_streams.add(stream)
        dm.allocator.malloc(CUBLAS_WORKSPACE_BYTES, stream)
        self._report_memory(device, dm)

    def _report_memory(self, device: int, dm: DeviceMemory) -> None:
        a = dm.allocator
        self.client.record([P.R_MEM, device, a.memory_allocated(), a.memory_reserved()])

    def mark_pinned(self, storage: Any) -> None:
        key = storage._cdata

        def forget(ref: weakref.ref, key: int = key) -> None:
            if self._pinned.get(key) is ref:
                del self._pinned[key]

        self._pinned[key] = weakref.ref(storage, forget)

    def storage_is_pinned(self, storage: Any) -> bool:
        ref = self._pinned.get(storage._cdata)
        if ref is not None and ref() is storage:
            return True
        # Real host memory that C++ allocated pinned (torch.empty(pin_memory=True), DDP's reducer)
        # comes from the shim's pinned allocator, which knows it.
        if storage.device.type != "cpu":
            return False
        from interpose.cuda_dispatch import is_pinned_ptr

        return is_pinned_ptr(storage.data_ptr())

    def new_event_id(self) -> int:
        with self.lock:
            self.next_event_id += 1
            return self.next_event_id


_runtime: Runtime | None = None


def get() -> Runtime:
    assert _runtime is not None, "phantora interposition is not installed in this process"
    return _runtime


def install_runtime(config: RankConfig) -> Runtime:
    global _runtime
    _runtime = Runtime(config)
    return _runtime
