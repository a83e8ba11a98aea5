"""torch.cuda as a real GPU of the simulated model would answer it.

Two layers, each the smallest that works:
  * the torch._C._cuda_* bindings that torch.cuda's own Python code calls for memory and
    device state (so torch.cuda.memory_stats / memory_allocated / memory_summary / device
    context managers run as shipped), and
  * replacements for torch.cuda functions whose CPU-build versions are dummies or refuse
    (is_available, Stream, Event, synchronize, device properties, nvtx, ...).
The RNG (torch.cuda.default_generators, which torch.cuda's own RNG functions use) is
interpose/device/cuda_rng.py's.
Stream and Event subclass torch.Stream / torch.Event (FSDP calls stream.wait_event with them)
and report to the simulator; the current device and stream live in the native shim, so
autograd's stream switching in backward is seen too.
"""

from __future__ import annotations

import types
from typing import Any

import torch

from interpose.device import cuda_graphs
from interpose import runtime as rt_mod
from interpose.device.cuda_rng import install_cuda_rng
from phantora import protocol as P

_CUDA_TYPE = 1  # c10::DeviceType::CUDA

# Properties of real cards that the GPU table does not need for cost modelling; defaults are
# an H100 SXM's, as read from a real one (tests/data/groundtruth/device.json).
_PROPERTY_DEFAULTS = dict(
    is_integrated=0, is_multi_gpu_board=0, max_threads_per_block=1024,
    shared_memory_per_block=49152, shared_memory_per_block_optin=232448,
    shared_memory_per_multiprocessor=233472, clock_rate=1980000, memory_clock_rate=2619000,
    memory_bus_width=5120, pci_domain_id=0, pci_device_id=0,
)



def _host_sync(rec: list[Any]) -> None:
    """A synchronisation: with several ranks the process also stops until the simulator has
    applied it, as a real one stops until the GPU is done; a collective another rank never
    joins, or joins differently, then fails here instead of somewhere later."""
    rt = _rt()
    rt.client.record(rec)
    if rt.world_size > 1:
        rt.client.call(P.C_NOW)

class VirtualDeviceProperties:
    """What torch.cuda.get_device_properties returns (fields of torch._C._CudaDeviceProperties)."""

    def __init__(self, index: int, gpu: Any, total_memory: int) -> None:
        self.name = gpu.device_name
        self.gcnArchName = gpu.device_name
        self.major, self.minor = gpu.capability
        self.total_memory = total_memory
        self.multi_processor_count = gpu.sm_count
        self.L2_cache_size = gpu.l2_cache_bytes
        self.max_threads_per_multi_processor = gpu.max_threads_per_sm
        self.regs_per_multiprocessor = gpu.regs_per_sm
        self.warp_size = gpu.warp_size
        physical = rt_mod.get().config.visible[index]  # the node's GPU behind cuda:index
        self.uuid = rt_mod.device_uuid(physical)
        self.pci_bus_id = physical
        for k, v in _PROPERTY_DEFAULTS.items():
            setattr(self, k, v)

    def __repr__(self) -> str:
        return (
            f"_CudaDeviceProperties(name='{self.name}', major={self.major}, minor={self.minor}, "
            f"total_memory={self.total_memory // (1024 * 1024)}MB, multi_processor_count="
            f"{self.multi_processor_count}, uuid={self.uuid}, pci_bus_id={self.pci_bus_id}, "
            f"pci_device_id={self.pci_device_id}, pci_domain_id={self.pci_domain_id}, "
            f"L2_cache_size={self.L2_cache_size // (1024 * 1024)}MB)"
        )


def _rt() -> rt_mod.Runtime:
    return rt_mod.get()


def _device_index(device: Any = None, optional: bool = True) -> int:
    if device is None:
        return torch._C._accelerator_getDeviceIndex()
    if isinstance(device, int):
        return device
    if isinstance(device, str):
        device = torch.device(device)
    if isinstance(device, torch.device):
        if device.type != "cuda":
            raise ValueError(f"Expected a cuda device, but got: {device}")
        return device.index if device.index is not None else torch._C._accelerator_getDeviceIndex()
    index = getattr(device, "device_index", None)
    if index is not None:
        return int(index)
    raise ValueError(f"Expected a cuda device, but got: {device!r}")


def _check_device(index: int) -> int:
    return _rt().check_device(index)


# --- streams and events --------------------------------------------------------------------
class Stream(torch.Stream):
    """A CUDA stream of a virtual GPU."""

    def __new__(cls, device: Any = None, priority: int = 0, **kwargs: Any) -> "Stream":
        if "stream_id" in kwargs:  # wrapping an existing stream (current_stream & co)
            return super().__new__(cls, stream_id=kwargs["stream_id"], device_index=kwargs["device_index"],
                                   device_type=kwargs.get("device_type", _CUDA_TYPE))
        index = _check_device(_device_index(device))
        s = super().__new__(cls, device=torch.device("cuda", index), priority=priority)
        _rt().client.record([P.R_STREAM, index, s.stream_id, priority])
        return s

    def __init__(self, device: Any = None, priority: int = 0, **kwargs: Any) -> None:
        pass

    @property
    def cuda_stream(self) -> int:
        return self.stream_id

    def wait_event(self, event: "Event") -> None:
        event.wait(self)

    def wait_stream(self, stream: torch.Stream) -> None:
        self.wait_event(_as_stream(stream).record_event())

    def record_event(self, event: "Event | None" = None) -> "Event":
        event = event if event is not None else Event()
        event.record(self)
        return event

    def query(self) -> bool:
        return bool(_rt().client.call(P.C_QUERY_STREAM, self.device_index, self.stream_id))

    def synchronize(self) -> None:
        cuda_graphs.check_sync_allowed("stream.synchronize()", self.device_index, self.stream_id)
        _host_sync([P.R_SYNC_STREAM, self.device_index, self.stream_id])

    def __repr__(self) -> str:
        return f"<torch.cuda.Stream device=cuda:{self.device_index} cuda_stream={self.stream_id:#x}>"


class ExternalStream(Stream):
    def __new__(cls, stream_ptr: int, device: Any = None, **kwargs: Any) -> "ExternalStream":
        return super().__new__(cls, stream_id=int(stream_ptr), device_index=_device_index(device))


def _as_stream(s: Any) -> Stream:
    if isinstance(s, Stream):
        return s
    return Stream(stream_id=s.stream_id, device_index=s.device_index, device_type=_CUDA_TYPE)


class Event(torch.Event):
    """A CUDA event; its timestamps are simulated GPU time."""

    def __new__(cls, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False,
                external: bool = False) -> "Event":
        return super().__new__(cls, device="cuda", enable_timing=enable_timing, blocking=blocking,
                               interprocess=interprocess)

    def __init__(self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False,
                 external: bool = False) -> None:
        self.phantora_id = _rt().new_event_id()
        self.enable_timing = enable_timing
        self.recorded = False

    def record(self, stream: Any = None) -> None:
        s = _as_stream(stream) if stream is not None else current_stream()
        self.recorded = True
        self._device = s.device_index
        self._phantora_capture = cuda_graphs.capture_of(s.device_index, s.stream_id)  # joins waiters to it
        _rt().client.record([P.R_EVENT_RECORD, self.phantora_id, s.device_index, s.stream_id])

    def wait(self, stream: Any = None) -> None:
        s = _as_stream(stream) if stream is not None else current_stream()
        if getattr(self, "_phantora_capture", None) is not None:
            cuda_graphs.join_capture(self._phantora_capture, s.device_index, s.stream_id)
        _rt().client.record([P.R_EVENT_WAIT, self.phantora_id, s.device_index, s.stream_id])

    def query(self) -> bool:
        if not self.recorded:
            return True
        return bool(_rt().client.call(P.C_QUERY_EVENT, self.phantora_id))

    def synchronize(self) -> None:
        if self.recorded:
            _host_sync([P.R_SYNC_EVENT, self.phantora_id])

    def elapsed_time(self, end_event: "Event") -> float:
        if not (self.enable_timing and end_event.enable_timing):
            raise ValueError("Both events must be created with argument 'enable_timing=True'.")
        if not (self.recorded and end_event.recorded):
            raise ValueError("Both events must be recorded before calculating elapsed time.")
        return float(_rt().client.call(P.C_ELAPSED, self.phantora_id, end_event.phantora_id))

    @property
    def cuda_event(self) -> int:
        return self.phantora_id

    def __repr__(self) -> str:
        return f"<torch.cuda.Event {self.phantora_id:#x}>" if self.recorded else "<torch.cuda.Event uninitialized>"


def current_stream(device: Any = None) -> Stream:
    index = _device_index(device)
    s = torch._C._accelerator_getStream(index)
    return Stream(stream_id=s.stream_id, device_index=index, device_type=_CUDA_TYPE)


def default_stream(device: Any = None) -> Stream:
    return Stream(stream_id=0, device_index=_device_index(device), device_type=_CUDA_TYPE)


def set_stream(stream: torch.Stream | None) -> None:
    if stream is None:
        return
    torch._C._accelerator_setStream(stream)


class StreamContext:
    """torch.cuda.stream(s): make s current on its device (and that device current) inside."""

    def __init__(self, stream: torch.Stream | None) -> None:
        self.stream = stream
        self._saved: list[Any] = []

    def __enter__(self) -> None:
        if self.stream is None:
            return
        prev_device = torch._C._accelerator_getDeviceIndex()
        target = self.stream.device_index
        prev_on_target = torch._C._accelerator_getStream(target)
        prev_on_current = torch._C._accelerator_getStream(prev_device) if prev_device != target else None
        self._saved.append((prev_device, prev_on_target, prev_on_current))
        torch._C._accelerator_setStream(self.stream)
        torch._C._accelerator_setDeviceIndex(prev_device)

    def __exit__(self, *exc: Any) -> None:
        if self.stream is None:
            return
        prev_device, prev_on_target, prev_on_current = self._saved.pop()
        torch._C._accelerator_setStream(prev_on_target)
        if prev_on_current is not None:
            torch._C._accelerator_setStream(prev_on_current)
        torch._C._accelerator_setDeviceIndex(prev_device)


def stream(stream: torch.Stream | None) -> StreamContext:
    return StreamContext(stream)


def synchronize(device: Any = None) -> None:
    cuda_graphs.check_sync_allowed("torch.cuda.synchronize()", _device_index(device))
    _host_sync([P.R_SYNC_DEVICE, _check_device(_device_index(device))])


# --- devices -------------------------------------------------------------------------------
def is_available() -> bool:
    # CUDA_VISIBLE_DEVICES="" hides every GPU: torch then runs on the CPU, as on a GPU machine
    return _rt().config.device_count > 0


def device_count() -> int:
    """The GPUs this process sees: the node's, narrowed by CUDA_VISIBLE_DEVICES (runtime.py)."""
    return _rt().config.device_count


def current_device() -> int:
    return torch._C._accelerator_getDeviceIndex()


def set_device(device: Any) -> None:
    index = _device_index(device)
    if index >= 0:
        torch._C._accelerator_setDeviceIndex(_check_device(index))


def get_device_properties(device: Any = None) -> VirtualDeviceProperties:
    index = _check_device(_device_index(device))
    cfg = _rt().config
    return VirtualDeviceProperties(index, cfg.gpu, cfg.total_memory)


def get_device_name(device: Any = None) -> str:
    return get_device_properties(device).name


def get_device_capability(device: Any = None) -> tuple[int, int]:
    p = get_device_properties(device)
    return (p.major, p.minor)


def get_arch_list() -> list[str]:
    return ["sm_80", "sm_86", "sm_90", "sm_100", "sm_120"]


def is_bf16_supported(including_emulation: bool = True) -> bool:
    return get_device_capability()[0] >= 8


def is_tf32_supported() -> bool:
    return get_device_capability()[0] >= 8


def mem_get_info(device: Any = None) -> tuple[int, int]:
    return _rt().device_memory(_check_device(_device_index(device))).allocator.mem_get_info()


def _exchange_device(device: int) -> int:
    if device < 0:
        return -1
    return torch._C._accelerator_exchangeDevice(_check_device(device))


def _maybe_exchange_device(device: int) -> int:
    if device < 0:
        return -1
    return torch._C._accelerator_maybeExchangeDevice(_check_device(device))


def _lazy_init() -> None:
    return None


def _unsupported(feature: str, advice: str) -> Any:
    def fail(*args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(f"phantora does not simulate {feature}; {advice}")

    return fail


# --- memory: the torch._C bindings torch.cuda.memory calls ---------------------------------
def _nested(flat: dict[str, int]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in flat.items():
        parts = key.split(".")
        d = out
        for p in parts[:-1]:
            d = d.setdefault(p, {})
        d[parts[-1]] = value
    return out


def _cuda_memoryStats(device: int) -> dict[str, Any]:
    return _nested(_rt().device_memory(device).allocator.memory_stats())


def _cuda_resetPeakMemoryStats(device: int) -> None:
    _rt().device_memory(device).allocator.reset_peak_stats()


def _cuda_resetAccumulatedMemoryStats(device: int) -> None:
    _rt().device_memory(device).allocator.reset_accumulated_stats()


def _cuda_emptyCache() -> None:
    rt = _rt()
    for index, dm in rt.devices.items():
        dm.allocator.empty_cache()
        rt._report_memory(index, dm)


def _cuda_setMemoryFraction(fraction: float, device: int) -> None:
    _rt().device_memory(device).allocator.set_memory_fraction(fraction)


def _cuda_memorySnapshot(*args: Any, **kwargs: Any) -> dict[str, Any]:
    return {"segments": [], "device_traces": [], "allocator_settings": {}}


_C_BINDINGS = {
    "_cuda_memoryStats": _cuda_memoryStats,
    "_cuda_resetPeakMemoryStats": _cuda_resetPeakMemoryStats,
    "_cuda_resetAccumulatedMemoryStats": _cuda_resetAccumulatedMemoryStats,
    "_cuda_emptyCache": _cuda_emptyCache,
    "_cuda_setMemoryFraction": _cuda_setMemoryFraction,
    "_cuda_memorySnapshot": _cuda_memorySnapshot,
    "_cuda_getDevice": lambda: torch._C._accelerator_getDeviceIndex(),
    "_cuda_setDevice": lambda d: set_device(d),
    "_cuda_exchangeDevice": lambda d: torch._C._accelerator_exchangeDevice(d),
    "_cuda_maybeExchangeDevice": lambda d: torch._C._accelerator_maybeExchangeDevice(d),
    "_cuda_synchronize": lambda: synchronize(),
    "_cuda_init": lambda: None,
    "_cuda_getArchFlags": lambda: " ".join(get_arch_list()),
    "_cuda_get_sync_debug_mode": lambda: 0,
    "_cuda_set_sync_debug_mode": lambda mode: None,
    "_cuda_getAllocatorBackend": lambda: "native",
}


# --- nvtx ----------------------------------------------------------------------------------
def _range_push(msg: str) -> int:
    _rt().client.record([P.R_NVTX_PUSH, str(msg)])
    return 0


def _range_pop() -> int:
    _rt().client.record([P.R_NVTX_POP])
    return 0


def _tensor_on_current_device(original: Any) -> Any:
    """torch.tensor(data, device="cuda") resolves "cuda" in C++ to cuda:0 on the virtual GPUs
    rather than to the current device (torch.cuda.set_device); resolve it here, as CUDA does."""
    def tensor(data: Any, *args: Any, device: Any = None, **kwargs: Any) -> torch.Tensor:
        if device == "cuda" or (isinstance(device, torch.device) and device.type == "cuda" and device.index is None):
            device = torch.device("cuda", torch._C._accelerator_getDeviceIndex())
        return original(data, *args, device=device, **kwargs)

    tensor.__doc__ = original.__doc__
    return tensor


def install_cuda_api() -> None:
    import torch.cuda.memory as cmem
    import torch.cuda.nvtx as nvtx

    for name, fn in _C_BINDINGS.items():
        setattr(torch._C, name, fn)

    cuda = torch.cuda
    replacements: dict[str, Any] = dict(
        Stream=Stream, Event=Event, ExternalStream=ExternalStream, StreamContext=StreamContext,
        current_stream=current_stream, default_stream=default_stream, set_stream=set_stream,
        stream=stream, synchronize=synchronize, is_available=is_available, device_count=device_count,
        current_device=current_device, set_device=set_device, get_device_properties=get_device_properties,
        get_device_name=get_device_name, get_device_capability=get_device_capability,
        get_arch_list=get_arch_list, is_bf16_supported=is_bf16_supported, is_tf32_supported=is_tf32_supported,
        mem_get_info=mem_get_info, _lazy_init=_lazy_init, init=_lazy_init,
        is_initialized=lambda: True,
        utilization=_unsupported("GPU utilization queries", "read utilization from the trace instead"),
        temperature=_unsupported("GPU temperature queries", "remove the call"),
        power_draw=_unsupported("GPU power queries", "remove the call"),
        clock_rate=lambda device=None: get_device_properties(device).clock_rate // 1000,
        ipc_collect=lambda: None, empty_cache=_cuda_emptyCache,
        _exchange_device=_exchange_device, _maybe_exchange_device=_maybe_exchange_device,
    )
    cuda._initialized = True
    cuda._tls.is_initializing = False
    for name, value in replacements.items():
        setattr(cuda, name, value)
    for name in ("mem_get_info", "empty_cache"):
        setattr(cmem, name, replacements[name])
    cfg = _rt().config
    install_cuda_rng(cfg.device_count, current_device, device_count, cfg.gpu.sm_count, cfg.gpu.max_threads_per_sm)
    cuda.streams.Stream = Stream  # type: ignore[attr-defined]
    cuda.streams.Event = Event  # type: ignore[attr-defined]
    nvtx.range_push = _range_push
    nvtx.range_pop = _range_pop
    nvtx.mark = lambda msg: 0
    nvtx._nvtx = types.SimpleNamespace(rangePushA=_range_push, rangePop=_range_pop, markA=lambda m: 0,
                                       rangeStartA=lambda m: 0, rangeEnd=lambda r: None)

    # CUDA graphs: torch's own torch/cuda/graphs.py over a simulated torch._C._CUDAGraph
    cuda_graphs.install_cuda_graphs()

    torch.tensor = _tensor_on_current_device(torch.tensor)
    torch.version.cuda = "13.0"  # type: ignore[misc]
    torch.backends.cudnn.is_available = lambda: True  # type: ignore[assignment]
    torch.backends.cudnn.version = lambda: 91900  # type: ignore[assignment]

    # torch.accelerator hands out plain torch.Stream objects; give ours so that their
    # wait_event/record_event/synchronize reach the simulator.
    # Each gets its own function object: Dynamo keys its handlers by identity and registers
    # torch.accelerator.current_stream and torch.cuda.current_stream both ("Handler already
    # registered" when they are one object).
    acc = torch.accelerator
    acc.current_stream = _own_object(current_stream)  # type: ignore[assignment]
    acc.synchronize = _own_object(synchronize)  # type: ignore[assignment]
    acc.device_count = _own_object(device_count)  # type: ignore[assignment]
    acc.is_available = _own_object(is_available)  # type: ignore[assignment]


def _own_object(fn: Any) -> Any:
    """A new function object with `fn`'s code and globals (same behavior, another identity)."""
    copy = types.FunctionType(fn.__code__, fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)
    copy.__doc__ = fn.__doc__
    copy.__qualname__ = fn.__qualname__
    return copy
