"""The measured kernel-time estimator: each distinct op signature run once on a local device.

    est = MeasuredEstimator(gpu, fallback)            # device: $PHANTORA_MEASURE_DEVICE or cuda
    est.estimate(sig)     # KernelEstimate timed on the device (or from the disk cache), else
                          # the fallback's estimate with "(not measured: <why>)" in .estimator

This runs in the simulator process, never in the user's rank processes: those keep running on
virtual GPUs however many there are. For a signature it has not seen, it

  1. rebuilds the call: every tensor argument as random data of the same shape, dtype and
     strides (torch.empty_strided-like storage + as_strided, filled uniform in [0, 1); integer
     tensors stay inside the range an index argument of that op may take), every other argument
     from the op's schema (float placeholders become 0.5);
  2. runs it once and checks the outputs have the shapes the script's call had;
  3. times it after warm-up: on a GPU with CUDA events around back-to-back calls queued behind a
     short sleep kernel (so the host's launch cost is not timed, unlike the calibration files'
     one-event-pair-per-launch method), on the CPU with time.perf_counter_ns; the median of a
     few repeats;
  4. stores the time in a sqlite cache keyed by device name, torch version, method and
     signature ($PHANTORA_CACHE_DIR, else $XDG_CACHE_HOME/phantora or ~/.cache/phantora), which
     concurrent simulators may share.

Ops it does not run fall back to the next estimator: ops without GPU work (views,
allocations: nothing to time), collectives (the network model times them), data-dependent ops
(nonzero, item: their output depends on values), assertions on data, ops spanning several
GPUs, ops whose arguments it cannot rebuild, that fail, or that do not fit in local memory.

torch is imported here lazily (phantora/cost imports torch nowhere else); the device is a
parameter so that CI runs exactly this code on CPU tensors ($PHANTORA_MEASURE_DEVICE=cpu).
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import os
import platform
import sqlite3
import statistics
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import orjson

from phantora.cache import cache_dir
from phantora.cost.estimate import NO_GPU_WORK, Estimator, KernelEstimate
from phantora.hardware import GPUSpec
from phantora.ops import FLOAT_PLACEHOLDER, OpSignature, TensorMeta

ESTIMATOR_NAME = "measured"
MEASURE_DEVICE_ENV = "PHANTORA_MEASURE_DEVICE"
# Bump when the timing method changes: cached times of another method are not reused.
METHOD_VERSION = 1
FLOAT_VALUE = 0.5  # stands in for float arguments (learning rates, eps, dropout p, ...)
# ... except where the value picks the kernel: attention with dropout runs other kernels, and
# most training calls (and all of the calibration tables) use none.
FLOAT_VALUE_BY_ARGUMENT = {"dropout_p": 0.0}

_COLLECTIVE_NAMESPACES = frozenset({"c10d", "_c10d_functional", "c10d_functional", "_dtensor", "symm_mem"})
# Ops that assert on tensor values: random data would trip them (on a GPU, a device-side assert
# ends the CUDA context of the whole simulator).
_ASSERTIONS = frozenset({"_assert_async", "_assert_scalar", "_functional_assert_async",
                         "_functional_assert_scalar", "_assert_tensor_metadata", "_print"})
_DATA_DEPENDENT_TAGS = frozenset({"dynamic_output_shape", "data_dependent_output"})


class Unmeasurable(Exception):
    """This signature cannot be timed here; the message says why (shown in args.estimator)."""


class LocalDeviceError(RuntimeError):
    """The local GPU reported an error: nothing more can be run on it in this process."""


@dataclass(frozen=True)
class TimingConfig:
    warmup_calls: int
    repeats: int  # timed samples; their median is the result
    target_ns: int  # each sample runs enough back-to-back calls to last about this long
    max_calls: int  # per sample
    max_bytes: int  # tensors larger than this in all are not run

    @staticmethod
    def for_device(device: str) -> "TimingConfig":
        if device.startswith("cuda"):
            return TimingConfig(warmup_calls=3, repeats=5, target_ns=1_000_000, max_calls=100, max_bytes=0)
        # CPU: CI exercises the code path, small tensors, quick
        return TimingConfig(warmup_calls=1, repeats=3, target_ns=200_000, max_calls=20, max_bytes=1 << 30)



def visible_cuda_device() -> str | None:
    """Name of the first CUDA GPU this process can use, or None. Imports torch only where a GPU
    device node exists, so that the check costs nothing on machines without one."""
    if os.environ.get("CUDA_VISIBLE_DEVICES", None) in ("", "-1"):
        return None
    if not any(Path("/dev").glob("nvidia[0-9]*")) and not Path("/dev/dxg").exists():
        return None
    try:
        import torch
    except ImportError:
        return None
    try:
        return torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    except RuntimeError:
        return None


def measure_device_from_env() -> str | None:
    """$PHANTORA_MEASURE_DEVICE ("cpu", "cuda", "cuda:1"), or None when unset."""
    value = os.environ.get(MEASURE_DEVICE_ENV, "").strip()
    return value or None


def local_device_name(device: str) -> str:
    """The device's name as cache keys and summaries use it."""
    import torch

    if device.startswith("cuda"):
        return torch.cuda.get_device_name(torch.device(device))
    return f"cpu ({platform.machine()}, 1 thread)"  # see _CpuClock


def local_device_info(device: str) -> dict[str, Any]:
    """What a calibration table's device row says about the device: name, torch, CUDA, SMs."""
    import torch

    info: dict[str, Any] = {"name": local_device_name(device), "torch": str(torch.__version__)}
    if device.startswith("cuda"):
        props = torch.cuda.get_device_properties(torch.device(device))
        info.update(sms=props.multi_processor_count, cuda=torch.version.cuda)
    return info


def tiny_launch_host_us(device: str, launches: int = 10_000) -> float:
    """Host time per call of a 1-element in-place add on `device`, `launches` in a row after
    warm-up: what dispatch plus one kernel launch costs this host (the calibration format's
    tiny_launch_host_us row). The device is synchronised before, not inside, the timed loop."""
    import torch

    dev = torch.device(device)
    x = torch.zeros(1, device=dev)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda *a: None)
    for _ in range(200):
        x.add_(1)
    sync(dev)
    samples = []
    for _ in range(3):
        start = time.perf_counter_ns()
        for _ in range(launches):
            x.add_(1)
        samples.append((time.perf_counter_ns() - start) / launches / 1e3)
        sync(dev)
    return statistics.median(samples)


# --- the disk cache ----------------------------------------------------------------------------

class KernelTimeCache:
    """Measured times in one sqlite file; safe for concurrent simulators (sqlite's file locks)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._db: sqlite3.Connection | None = None

    def _connect(self) -> sqlite3.Connection:
        if self._db is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            db = sqlite3.connect(self.path, timeout=60.0, isolation_level=None)
            db.execute("""CREATE TABLE IF NOT EXISTS kernel_times (
                device TEXT NOT NULL, torch TEXT NOT NULL, method INTEGER NOT NULL, signature TEXT NOT NULL,
                op TEXT NOT NULL, ns REAL NOT NULL, measured_at REAL NOT NULL,
                PRIMARY KEY (device, torch, method, signature))""")
            self._db = db
        return self._db

    def get(self, device: str, torch_version: str, signature: str) -> float | None:
        row = self._connect().execute(
            "SELECT ns FROM kernel_times WHERE device = ? AND torch = ? AND method = ? AND signature = ?",
            (device, torch_version, METHOD_VERSION, signature)).fetchone()
        return None if row is None else float(row[0])

    def put(self, device: str, torch_version: str, signature: str, op: str, ns: float) -> None:
        self._connect().execute("INSERT OR REPLACE INTO kernel_times VALUES (?, ?, ?, ?, ?, ?, ?)",
                                (device, torch_version, METHOD_VERSION, signature, op, ns, time.time()))

    def close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None


def signature_key(sig: OpSignature, settings: dict[str, Any]) -> str:
    """A stable digest of the signature plus the torch settings that change its kernels."""
    return hashlib.sha256(orjson.dumps([sig.to_wire(), settings], option=orjson.OPT_SORT_KEYS)).hexdigest()


# --- rebuilding a call -------------------------------------------------------------------------

def _dim_size(t: TensorMeta, dim: int) -> int:
    return t.shape[dim % len(t.shape)] if t.shape else 1


def _class_count(t: TensorMeta) -> int:
    return t.shape[1] if len(t.shape) >= 2 else (t.shape[0] if t.shape else 1)


_INDEX_AT_2 = frozenset({
    "index_select", "gather", "scatter", "scatter_", "scatter_add", "scatter_add_", "scatter_reduce",
    "scatter_reduce_", "index_add", "index_add_", "index_copy", "index_copy_", "index_fill", "index_fill_",
})
_INDEX_LISTS = frozenset({"index", "_unsafe_index", "index_put", "index_put_", "_index_put_impl_", "_unsafe_index_put"})


def index_bound(sig: OpSignature, position: int, element: int | None) -> int:
    """Exclusive upper bound for the values of integer tensor argument `position` (element
    `element` of a list argument): the size an index argument of this op addresses. Other
    integer tensors get 1, i.e. zeros, a valid index into any non-empty dimension."""
    name, a = sig.short_name, sig.args
    try:
        if name == "embedding" and position == 1:
            return a[0].shape[0]
        if name == "embedding_dense_backward" and position == 1:
            return int(a[2])
        if name in _INDEX_AT_2 and position == 2:
            return _dim_size(a[0], int(a[1]))
        if name in _INDEX_LISTS and position == 1 and element is not None:
            return a[0].shape[element]
        if name in ("nll_loss_forward", "nll_loss2d_forward") and position == 1:
            return _class_count(a[0])
        if name in ("nll_loss_backward", "nll_loss2d_backward") and position == 2:
            return _class_count(a[1])
    except (IndexError, TypeError, ValueError, AttributeError):
        pass
    return 1


class _ArgBuilder:
    def __init__(self, torch_mod: Any, device: str, sig: OpSignature) -> None:
        self.torch = torch_mod
        self.device = device
        self.sig = sig
        self.generator = torch_mod.Generator(device=device if device.startswith("cuda") else "cpu")
        self.generator.manual_seed(0)

    def tensor(self, t: TensorMeta, bound: int) -> Any:
        torch = self.torch
        dtype = getattr(torch, t.dtype, None)
        if not isinstance(dtype, torch.dtype):
            raise Unmeasurable(f"dtype {t.dtype} is not in this torch")
        if t.is_cuda:
            device, pinned = self.device, False
        elif t.device == "cpu":
            device, pinned = "cpu", t.pinned and self.device.startswith("cuda")
        else:
            raise Unmeasurable(f"a tensor on {t.device}")
        # the storage the strides address (broadcast dims have stride 0), filled, then viewed
        extent = 0 if 0 in t.shape else 1 + sum((s - 1) * st for s, st in zip(t.shape, t.stride))
        base = torch.empty(extent, dtype=dtype, device=device, pin_memory=pinned)
        self._fill(base, bound)
        return base.as_strided(t.shape, t.stride)

    def _fill(self, base: Any, bound: int) -> None:
        torch, g = self.torch, self.generator
        if base.numel() == 0:
            return
        if base.dtype == torch.bool:
            base.random_(0, 2, generator=g)
        elif base.dtype.is_floating_point or base.dtype.is_complex:
            if base.dtype.itemsize == 1 or not base.dtype.is_floating_point:  # fp8, complex: fill via float32
                real = torch.empty(base.shape, dtype=torch.float32, device=base.device).uniform_(0.0, 1.0, generator=g)
                base.copy_(real)
            else:
                base.uniform_(0.0, 1.0, generator=g)
        else:
            try:
                base.random_(0, max(int(bound), 1), generator=g)
            except RuntimeError:  # a bound past the dtype's range (int8 indices into a large dim)
                base.zero_()

    def value(self, v: Any, type_str: str, position: int, element: int | None = None, name: str = "") -> Any:
        torch = self.torch
        inner = type_str[len("Optional["):-1] if type_str.startswith("Optional[") else type_str
        if v is None:
            return None
        if isinstance(v, TensorMeta):
            return self.tensor(v, index_bound(self.sig, position, element))
        if isinstance(v, (tuple, list)):
            elem_type = inner[len("List["):-1] if inner.startswith("List[") else inner
            return [self.value(x, elem_type, position, i) for i, x in enumerate(v)]
        if v == FLOAT_PLACEHOLDER:
            return FLOAT_VALUE_BY_ARGUMENT.get(name, FLOAT_VALUE)
        if isinstance(v, str):
            if inner == "str":
                return v
            if inner == "Device":
                return self.device if v.startswith("cuda") else torch.device(v)
            named = getattr(torch, v, None)  # dtype / layout / memory_format names
            if isinstance(named, (torch.dtype, torch.layout, torch.memory_format)):
                return named
            if "Generator" in inner:
                return None
            raise Unmeasurable(f"cannot rebuild argument {v!r} of type {type_str}")
        return v


def resolve_op(sig: OpSignature) -> Any:
    """The torch.ops overload a signature names."""
    import torch

    namespace, _, name = sig.name.rpartition("::")
    if namespace in _COLLECTIVE_NAMESPACES:
        raise Unmeasurable("collective (timed by the network model)")
    try:
        packet = getattr(getattr(torch.ops, namespace or "aten"), name)
        return getattr(packet, sig.overload or "default")
    except (AttributeError, RuntimeError):
        raise Unmeasurable(f"{sig.full_name} is not an op of this torch") from None


def precheck(sig: OpSignature) -> None:
    """Raise Unmeasurable for signatures that must not or cannot be run with random data."""
    if sig.short_name in _ASSERTIONS:
        raise Unmeasurable("an assertion on data")
    if sig.tags & _DATA_DEPENDENT_TAGS or sig.short_name in ("_local_scalar_dense", "item"):
        raise Unmeasurable("data-dependent op")
    devices = {t.device for t in (*sig.tensors_in(), *sig.tensors_out()) if t.is_cuda}
    if len(devices) > 1:
        raise Unmeasurable("spans several GPUs")


def build_call(sig: OpSignature, device: str, max_bytes: int = 0) -> Callable[[], Any]:
    """A closure that runs `sig` on `device` with random inputs of its shapes, dtypes, strides."""
    op, positional, keywords = build_args(sig, device, max_bytes)
    return lambda: op(*positional, **keywords)


def build_args(sig: OpSignature, device: str, max_bytes: int = 0) -> tuple[Any, list[Any], dict[str, Any]]:
    """(op, positional arguments, keyword arguments) to run `sig` on `device` with random data."""
    import torch

    precheck(sig)
    op = resolve_op(sig)
    schema = op._schema.arguments
    if len(sig.args) > len(schema):
        raise Unmeasurable("arguments do not match this torch's schema")
    builder = _ArgBuilder(torch, device, sig)
    positional: list[Any] = []
    keywords: dict[str, Any] = {}
    need = sum(t.nbytes for t in (*sig.tensors_in(), *sig.tensors_out()))
    if max_bytes and need > max_bytes:
        raise Unmeasurable(f"needs {need / 2**30:.1f} GiB, more than the {max_bytes / 2**30:.1f} GiB it may use here")
    for i, (arg, value) in enumerate(zip(schema, sig.args)):
        built = builder.value(value, str(arg.type), i, name=arg.name)
        if arg.kwarg_only:
            keywords[arg.name] = built
        else:
            positional.append(built)
    return op, positional, keywords


def _tensor_shapes(result: Any, torch_mod: Any) -> list[tuple[int, ...]]:
    if isinstance(result, torch_mod.Tensor):
        return [tuple(result.shape)]
    if isinstance(result, (list, tuple)):
        return [s for r in result for s in _tensor_shapes(r, torch_mod)]
    return []


# --- timing ------------------------------------------------------------------------------------

class _CpuClock:
    """perf_counter_ns around back-to-back calls, on one thread: torch's intra-op threads wait for
    each other, and on a loaded machine one descheduled thread adds milliseconds to a call."""

    def __init__(self, device: str) -> None:
        self.device = device

    def sync(self) -> None:
        pass

    def elapsed_ns(self, fn: Callable[[], Any], calls: int, host_ns_per_call: float) -> float:
        start = time.perf_counter_ns()
        for _ in range(calls):
            fn()
        return float(time.perf_counter_ns() - start)


class _CudaClock:
    """CUDA events around `calls` back-to-back launches. A sleep kernel first keeps the GPU busy
    while the host queues them, so the time is the kernels' own (with the ~1 us between
    consecutive kernels a stream really pays), not the host's launch cost."""

    MAX_SLEEP_NS = 50_000_000

    def __init__(self, device: str) -> None:
        import torch

        self.torch = torch
        self.device = torch.device(device)
        props = torch.cuda.get_device_properties(self.device)
        self.cycles_per_ns = getattr(props, "clock_rate", 1_500_000) / 1e6  # clock_rate is in kHz

    def sync(self) -> None:
        self.torch.cuda.synchronize(self.device)

    def elapsed_ns(self, fn: Callable[[], Any], calls: int, host_ns_per_call: float) -> float:
        torch = self.torch
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        self.sync()
        sleep_ns = min(self.MAX_SLEEP_NS, 1.5 * calls * host_ns_per_call + 20_000)
        torch.cuda._sleep(int(sleep_ns * self.cycles_per_ns))
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) * 1e6  # ms -> ns


def time_call(fn: Callable[[], Any], device: str, config: TimingConfig) -> float:
    """Median time of one call of `fn` on `device`, in ns, after warm-up."""
    if device.startswith("cuda"):
        return _time_call(fn, _CudaClock(device), config)
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _time_call(fn, _CpuClock(device), config)
    finally:
        torch.set_num_threads(threads)


def _time_call(fn: Callable[[], Any], clock: Any, config: TimingConfig) -> float:
    host_start = time.perf_counter_ns()
    for _ in range(config.warmup_calls):
        fn()
    host_ns_per_call = (time.perf_counter_ns() - host_start) / max(config.warmup_calls, 1)
    clock.sync()
    single = max(clock.elapsed_ns(fn, 1, host_ns_per_call), 1.0)
    calls = max(1, min(config.max_calls, math.ceil(config.target_ns / single)))
    samples = [clock.elapsed_ns(fn, calls, host_ns_per_call) / calls for _ in range(config.repeats)]
    return statistics.median(samples)


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0].split(". ")[0][:120] if text else type(e).__name__


def _failure(e: Exception, what: str) -> Exception:
    """The exception to raise for a failure of the op: the GPU's own errors end measuring."""
    import torch

    if isinstance(e, torch.OutOfMemoryError):
        torch.cuda.empty_cache()
        return Unmeasurable("does not fit in the local device's memory")
    if "CUDA error" in str(e) or "device-side assert" in str(e):
        return LocalDeviceError(_first_line(e))
    return Unmeasurable(f"{what}: {_first_line(e)}")


def measure_signature(sig: OpSignature, device: str, config: TimingConfig) -> float:
    """Time one signature on `device` (ns per call). Raises Unmeasurable with the reason, or
    LocalDeviceError when the GPU itself failed (nothing more can run on it)."""
    import contextlib

    import torch

    on_gpu = contextlib.nullcontext() if not device.startswith("cuda") else torch.cuda.device(torch.device(device))
    with on_gpu:
        try:
            fn = build_call(sig, device, config.max_bytes)
        except Unmeasurable:
            raise
        except Exception as e:  # noqa: BLE001 - any op or argument torch rejects: not measurable
            raise _failure(e, "cannot build its inputs") from None
        try:
            result = fn()
        except Exception as e:  # noqa: BLE001
            raise _failure(e, "failed to run") from None
        got = _tensor_shapes(result, torch)
        want = [t.shape for t in sig.outputs if t is not None]
        if got and want and got != want:
            raise Unmeasurable(f"ran with output shapes {got} instead of the script's {want}")
        del result
        try:
            return time_call(fn, device, config)
        except Exception as e:  # noqa: BLE001
            raise _failure(e, "failed while timed") from None


def _with_reason(est: KernelEstimate, reason: str) -> KernelEstimate:
    """est with `reason` added to its estimator label: "x" -> "x (reason)", "x (a)" -> "x (a; reason)"."""
    label = est.estimator
    label = f"{label[:-1]}; {reason})" if label.endswith(")") else f"{label} ({reason})"
    return dataclasses.replace(est, estimator=label)


class MeasuredEstimator:
    """Times each distinct signature on a local device; the fallback times what it cannot run."""

    name = ESTIMATOR_NAME

    def __init__(self, gpu: GPUSpec, fallback: Estimator, device: str = "cuda",
                 cache: KernelTimeCache | None = None, timing: TimingConfig | None = None,
                 warn: Callable[[str], None] | None = None) -> None:
        import torch

        self.gpu = gpu
        self.fallback = fallback
        self.device = device
        self.device_name = local_device_name(device)
        self.torch_version = str(torch.__version__)
        self.cache = cache if cache is not None else KernelTimeCache(cache_dir() / "kernel_times.sqlite")
        self.timing = timing or TimingConfig.for_device(device)
        if device.startswith("cuda") and not self.timing.max_bytes:
            free, _total = torch.cuda.mem_get_info(torch.device(device))
            self.timing = dataclasses.replace(self.timing, max_bytes=int(free * 0.4))
        self.stats: Counter[str] = Counter()  # "measured", "cached", "not measured: <why>"
        self._times: dict[str, float | Unmeasurable] = {}
        self._broken: str | None = None
        self._warn = warn or (lambda msg: print(f"phantora: warning: {msg}", file=sys.stderr, flush=True))

    def settings(self) -> dict[str, Any]:
        import torch

        return {"allow_tf32": bool(torch.backends.cuda.matmul.allow_tf32),
                "cudnn_allow_tf32": bool(torch.backends.cudnn.allow_tf32)}

    def estimate(self, sig: OpSignature) -> KernelEstimate:
        est = self.fallback.estimate(sig)
        if est.kind == NO_GPU_WORK or est.kernels == 0:
            return est  # nothing runs on the GPU: nothing to time
        ns = self._time(sig)
        if isinstance(ns, Unmeasurable):
            return _with_reason(est, f"not measured: {ns}")
        return dataclasses.replace(est, duration_ns=max(1, int(round(ns))), estimator=self.name, known=True)

    def _time(self, sig: OpSignature) -> float | Unmeasurable:
        key = signature_key(sig, self.settings())
        if key not in self._times:
            self._times[key] = self._time_uncached(sig, key)
        return self._times[key]

    def _time_uncached(self, sig: OpSignature, key: str) -> float | Unmeasurable:
        if self._broken:
            return self._count(Unmeasurable(f"the local GPU failed earlier: {self._broken}"))
        cached = self._cache_get(key)
        if cached is not None:
            self.stats["from cache"] += 1
            return cached
        try:
            ns = measure_signature(sig, self.device, self.timing)
        except Unmeasurable as e:
            return self._count(e)
        except LocalDeviceError as e:
            self._broken = str(e)
            self._warn(f"the local GPU reported an error while timing {sig.full_name} ({e}); "
                       "the remaining ops fall back to the next estimator")
            return self._count(Unmeasurable(f"the local GPU failed: {e}"))
        self.stats["measured"] += 1
        self._cache_put(key, sig.full_name, ns)
        return ns

    def _count(self, e: Unmeasurable) -> Unmeasurable:
        self.stats[f"not measured ({str(e).split(':')[0]})"] += 1
        return e

    def _cache_get(self, key: str) -> float | None:
        try:
            return self.cache.get(self.device_name, self.torch_version, key)
        except sqlite3.Error as e:
            self._cache_failed(e)
            return None

    def _cache_put(self, key: str, op: str, ns: float) -> None:
        try:
            self.cache.put(self.device_name, self.torch_version, key, op, ns)
        except sqlite3.Error as e:
            self._cache_failed(e)

    def _cache_failed(self, e: Exception) -> None:
        self._warn(f"kernel-time cache {self.cache.path} unusable ({e}); measuring without it")
        self.cache = _NoCache(self.cache.path)


class _NoCache(KernelTimeCache):
    def get(self, device: str, torch_version: str, signature: str) -> float | None:
        return None

    def put(self, device: str, torch_version: str, signature: str, op: str, ns: float) -> None:
        pass
