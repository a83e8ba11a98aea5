"""Per-process state of an interposed rank: its configuration, its connection to the simulator,
the memory of its virtual GPUs, and interned op signatures.

Configuration comes from environment variables that `phantora trace` sets for the command it
runs (and torchrun passes on to its workers):
  PHANTORA_SOCKET         path of the simulator's Unix socket (interposition is off without it)
  PHANTORA_GPU            GPU model key from phantora.hardware (default h100-sxm-80gb)
  PHANTORA_VRAM           memory per GPU in bytes, overriding the model's
  PHANTORA_DEVICE_COUNT   GPUs of the simulated node (default 8)
  PHANTORA_CALL_TIMEOUT   seconds to wait for any answer from the simulator (default 600)
and from the variables a GPU process reads on a real machine:
  CUDA_VISIBLE_DEVICES    which of the node's GPUs the process sees, parsed as CUDA does
  RANK, LOCAL_RANK, GROUP_RANK / NODE_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE: the rank's identity.

A rank's identity is what torch.distributed uses: RANK as torchrun sets it; otherwise (Lightning's
launcher sets LOCAL_RANK, NODE_RANK and WORLD_SIZE; mp.spawn children set nothing) a guess that is
read when the process first touches a GPU and corrected by the rank the process passes to
init_process_group (interpose/distributed/process_group.py).
"""

from __future__ import annotations

import os
import threading
import weakref
from dataclasses import dataclass, field
from typing import Any

from interpose.client import SimClient
from interpose.device.shim_calls import is_pinned_ptr
from interpose.host.clock import HostThread
from phantora.cost.host import DEFAULT_HOST_TIME
from interpose.host.host_time import ENV as HOST_TIME_ENV
from interpose.host.host_time import PythonTime, exclude_garbage_collection
from phantora import protocol as P
from phantora.engine.memory import CachingAllocator
from phantora.hardware import DEFAULT_GPU, GPUSpec, lookup_gpu

# Measured on an H100 80GB (tests/data/groundtruth/): CUDA context and library handles take
# ~684 MiB outside PyTorch's allocator; the first GEMM on a stream allocates cuBLAS's 32 MiB
# workspace through the allocator (torch's default on Hopper and newer).
NON_PYTORCH_BYTES = 684 << 20
CUBLAS_WORKSPACE_BYTES = 32 << 20


def _strtoul(entry: str) -> int:
    """The leading decimal number of `entry` as C's strtoul reads it (CUDA parses
    CUDA_VISIBLE_DEVICES so: "1gpu" is 1), or -1 when it has none or it is negative."""
    digits = ""
    for i, c in enumerate(entry):
        if c.isdigit() or (i == 0 and c in "+-"):
            digits += c
        else:
            break
    try:
        return int(digits)
    except ValueError:
        return -1


def visible_devices(value: str | None, node_gpus: int) -> tuple[int, ...]:
    """The node's GPUs a process sees, in the order it numbers them (cuda:0 is the first), as
    the CUDA driver reads CUDA_VISIBLE_DEVICES: unset, all of them; otherwise the list stops at
    the first entry that is not a GPU of the node (not a number, negative, too large); a
    repeated entry hides every GPU, as in torch.cuda._parse_visible_devices. Entries are ordinals
    or the UUIDs torch.cuda.get_device_properties reports (GPU-00000000-...-<index in hex>)."""
    if value is None:
        return tuple(range(node_gpus))
    seen: list[int] = []
    by_uuid = value.startswith("GPU-")  # then every entry must be one (torch reads it so too)
    for entry in value.split(","):
        entry = entry.strip()
        if by_uuid:
            index = _uuid_index(entry[4:], node_gpus) if entry.startswith("GPU-") else -1
        else:
            index = _strtoul(entry)
        if index < 0 or index >= node_gpus:
            break
        if index in seen:
            return ()
        seen.append(index)
    return tuple(seen)


def device_uuid(index: int) -> str:
    return f"00000000-0000-0000-0000-{index:012x}"


def _uuid_index(prefix: str, node_gpus: int) -> int:
    """The GPU whose UUID starts with `prefix` (CUDA accepts unique prefixes), else -1."""
    matches = [i for i in range(node_gpus) if prefix and device_uuid(i).startswith(prefix)]
    return matches[0] if len(matches) == 1 else -1


@dataclass
class RankIdentity:
    """Who this process is among the job's ranks. `certain` when torch will use exactly this rank
    (RANK set, or no launcher at all); otherwise a guess until init_process_group says."""

    rank: int = 0
    local_rank: int = 0
    node: int = 0
    world_size: int = 1
    certain: bool = True

    @staticmethod
    def from_env(env: os._Environ[str] | dict[str, str] = os.environ, spawned: bool = False) -> "RankIdentity":
        """torchrun: RANK, LOCAL_RANK, GROUP_RANK, WORLD_SIZE. Lightning's launcher: LOCAL_RANK,
        NODE_RANK, WORLD_SIZE (global rank NODE_RANK * LOCAL_WORLD_SIZE + LOCAL_RANK, where the
        local world size is LOCAL_WORLD_SIZE if set, else WORLD_SIZE on a single node). A child of
        multiprocessing (`spawned`, e.g. mp.spawn) without RANK learns its rank only from
        init_process_group."""
        local = int(env.get("LOCAL_RANK", "0") or 0)
        node = int(env.get("GROUP_RANK") or env.get("NODE_RANK") or 0)
        world = int(env.get("WORLD_SIZE", "1") or 1)
        if env.get("RANK"):
            return RankIdentity(int(env["RANK"]), local, node, world, certain=True)
        launched = "LOCAL_RANK" in env or "WORLD_SIZE" in env
        local_world = int(env.get("LOCAL_WORLD_SIZE") or 0) or (world if node == 0 else 0)
        rank = node * local_world + local if local_world else local
        return RankIdentity(rank, local, node, world, certain=not (launched or spawned))


@dataclass(frozen=True)
class RankConfig:
    socket_path: str
    gpu: GPUSpec
    total_memory: int
    node_gpus: int  # GPUs of the simulated node
    visible: tuple[int, ...]  # the node's GPUs this process sees: cuda:i is GPU visible[i]
    call_timeout_s: float

    @property
    def device_count(self) -> int:
        return len(self.visible)

    @staticmethod
    def from_env(env: os._Environ[str] | dict[str, str] = os.environ) -> "RankConfig":
        gpu = lookup_gpu(env.get("PHANTORA_GPU", DEFAULT_GPU))
        vram = env.get("PHANTORA_VRAM")
        node_gpus = int(env.get("PHANTORA_DEVICE_COUNT", "8"))
        return RankConfig(
            socket_path=env["PHANTORA_SOCKET"],
            gpu=gpu,
            total_memory=int(vram) if vram else gpu.total_memory,
            node_gpus=node_gpus,
            visible=visible_devices(env.get("CUDA_VISIBLE_DEVICES"), node_gpus),
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
        # Read when the process first touches a GPU, not at import: a launcher such as
        # Lightning's sets LOCAL_RANK / WORLD_SIZE in its own process after torch is imported.
        self.identity: RankIdentity | None = None
        self.client = SimClient(config.socket_path, self._hello, config.call_timeout_s)
        self.devices: dict[int, DeviceMemory] = {}
        self.sig_ids: dict[Any, int] = {}
        # id(FakeTensorMode dispatch-cache entry) -> (entry, op, sig_id, device): ops the cache
        # answers are not keyed again (interpose/ops/observer.py _report)
        self.sig_by_cache_entry: dict[int, tuple[Any, Any, int, int]] = {}
        self.hosted_store: Any = None  # the job's c10d store where this process hosts it (process_group.py)
        # Page-locked host storages, by StorageImpl address. Weak: an address is reused once its
        # storage is freed, and a stale entry would make a fresh pageable tensor look pinned
        # (torch preserves a storage's Python object, so the weakref dies with the storage).
        self._pinned: dict[int, weakref.ref] = {}
        self.lock = threading.RLock()
        self.host_thread = HostThread(self.lock)  # whose sleeps move the simulated host clock (clock.py)
        # the program's own CPU time between phantora's entries (host_time.py)
        self.python_time = PythonTime(self.host_thread, os.environ.get(HOST_TIME_ENV, DEFAULT_HOST_TIME))
        self.client.python_time = self.python_time
        exclude_garbage_collection(self.python_time)
        # a forked child's thread CPU clock starts again at 0: the parent's marks mean nothing there
        os.register_at_fork(after_in_child=self.python_time.forget)
        self.client.on_connect = self._measure_host
        self.dispatch_lock = threading.RLock()  # serialises ops through FakeTensorMode (observer.py)
        self._storage_refs: dict[int, weakref.ref] = {}
        self.next_event_id = 0
        self.active = True  # False in DataLoader workers and forked children
        self.in_optimizer = 0  # depth of Optimizer.step calls (python_events.py)
        # model work (a forward in a module, a backward, a CUDA graph replay) since the last
        # training-step mark: an optimizer step without any (DeepSpeed ZeRO steps its optimizer
        # once per parameter group) continues the same training step (python_events.py)
        self.model_work_since_step = True
        # the OpObserver, once launch/hook.py installs it: benchmarks read its op count, and
        # _measure_host has it measure the dispatch floor (the observer imports this module)
        self.observer: Any = None
        # (device, stream) -> allocator key of the CUDA-graph private pool its allocations go to
        # while it captures (interpose/device/cuda_graphs.py; phantora/engine/memory.py graph pools)
        self.pool_routes: dict[tuple[int, int], int] = {}
        self.capturing: dict[tuple[int, int], Any] = {}  # (device, stream) -> the CUDA graph capture on it

    def _measure_host(self) -> None:
        """This machine's Python speed now, and what entering phantora's dispatch costs this
        process per op (host_time.py), once it is a rank and before its first op is sent."""
        if not self.python_time.enabled:
            return
        if not self.python_time.counted:  # counted work is on the reference host already
            self.client.record([P.R_HOST_SPEED, self.python_time.measure_speed()])
        if self.observer is None or not self.config.device_count:
            return
        self.python_time.dispatch_floor_ns = self.observer.measure_dispatch_floor(0)

    # --- identity --------------------------------------------------------------------------
    def _hello(self) -> dict[str, Any]:
        import multiprocessing

        if self.identity is None:
            self.identity = RankIdentity.from_env(os.environ, spawned=multiprocessing.parent_process() is not None)
        ident = self.identity
        return {"rank": ident.rank, "local_rank": ident.local_rank, "node": ident.node,
                "world_size": ident.world_size, "certain": ident.certain, "devices": list(self.config.visible)}

    @property
    def rank(self) -> int:
        return self.identity.rank if self.identity is not None else 0

    @property
    def world_size(self) -> int:
        if self.identity is None:
            return int(os.environ.get("WORLD_SIZE", "1") or 1)
        return self.identity.world_size

    def identify(self, rank: int, world_size: int) -> None:
        """init_process_group made this process `rank` of `world_size`: what torch uses from now
        on. A process that already talks to the simulator under a guessed identity has it
        corrected there (its trace keeps everything recorded so far)."""
        if "LOCAL_RANK" in os.environ:
            local = int(os.environ["LOCAL_RANK"] or 0)
            node = int(os.environ.get("GROUP_RANK") or os.environ.get("NODE_RANK") or 0)
        else:  # mp.spawn and the like: ranks fill the nodes in order
            node, local = divmod(rank, self.config.node_gpus)
        new = RankIdentity(rank, local, node, world_size, certain=True)
        with self.lock:
            if self.identity == new:
                return
            self.identity = new
            if self.client.connected:
                self.client.call(P.C_IDENTIFY, {"rank": rank, "local_rank": local, "node": node,
                                                "world_size": world_size})

    # --- memory ----------------------------------------------------------------------------
    def check_device(self, index: int) -> int:
        n = self.config.device_count
        if n == 0:
            raise RuntimeError(
                "No CUDA GPUs are available\nphantora: CUDA_VISIBLE_DEVICES="
                f"{os.environ.get('CUDA_VISIBLE_DEVICES')!r} hides every GPU of the simulated node from this "
                "process (torch.cuda.is_available() is False); unset it or name the GPUs to use"
            )
        if not 0 <= index < n:
            import torch

            error = getattr(torch, "AcceleratorError", RuntimeError)
            raise error(
                f"CUDA error: invalid device ordinal\nphantora: cuda:{index} does not exist; this process sees {n} "
                f"GPU(s) (cuda:0 to cuda:{n - 1}{_visible_note(self.config)}); change the device index, "
                "CUDA_VISIBLE_DEVICES or --gpus-per-node"
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
        # runs wherever the program drops its last reference: phantora's work, not the program's
        with self.python_time.own_work:
            self._storage_freed_locked(key, device)

    def _storage_freed_locked(self, key: int, device: int) -> None:
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

    def storage_address(self, storage: Any, device: int) -> int:
        """The simulated allocator's address of a device storage's block (0: none, e.g. 0 bytes)."""
        dm = self.devices.get(device)
        return 0 if dm is None else dm.blocks.get(storage._cdata, 0)

    def storage_is_pinned(self, storage: Any) -> bool:
        ref = self._pinned.get(storage._cdata)
        if ref is not None and ref() is storage:
            return True
        # Real host memory that C++ allocated pinned (torch.empty(pin_memory=True), DDP's reducer)
        # comes from the shim's pinned allocator, which knows it.
        if storage.device.type != "cpu":
            return False
        return is_pinned_ptr(storage.data_ptr())

    def new_event_id(self) -> int:
        with self.lock:
            self.next_event_id += 1
            return self.next_event_id


def _visible_note(config: RankConfig) -> str:
    if config.device_count == config.node_gpus:
        return ""
    return f" of the node's {config.node_gpus}, CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r}"


_runtime: Runtime | None = None


def get() -> Runtime:
    assert _runtime is not None, "phantora interposition is not installed in this process"
    return _runtime


def current() -> Runtime | None:
    """The runtime, or None in a process phantora has not set up (unit tests of interpose's parts)."""
    return _runtime


def rank_label() -> str:
    """This process's rank as messages name it: "?" where phantora has not set up the process."""
    return "?" if _runtime is None else str(_runtime.rank)


def install_runtime(config: RankConfig) -> Runtime:
    global _runtime
    _runtime = Runtime(config)
    return _runtime
