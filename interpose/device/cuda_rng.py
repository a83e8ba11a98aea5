"""The CUDA random number generators of the virtual GPUs.

Fake tensors draw no random numbers, but a generator's state is data that programs keep:
torch.random.fork_rng and activation checkpointing save and restore it, Megatron's
CudaRNGStatesTracker keeps one state per parallel group and swaps them in and out, DTensor's
OffsetBasedRNGTracker rewrites the offset bytes of the state so each shard draws its own slice.
So the generators are real: each device has a default `torch.Generator` (device cuda:i) made by
the native shim (interpose/device/shim/virtual_cuda.cpp, the CUDA hooks' getDefaultGenerator) with a
real CUDA generator's state, the 16-byte Philox layout (seed as uint64, then offset as int64),
and `torch.Generator(device="cuda")` makes new ones (getNewGenerator). torch.cuda's own RNG
functions (torch/cuda/random.py) run unchanged on top of `torch.cuda.default_generators`.

The offset advances as on a real GPU for the random ops whose increment torch computes from the
launch shape alone (see `philox_increment`): the distribution kernels (rand, randn, randint,
*_like, uniform_, normal_, bernoulli_, random_, exponential_, ...), fused dropout, and flash
attention with dropout. Other random ops (randperm, multinomial, memory-efficient and cuDNN
attention with dropout) leave it unchanged; a program that compares offsets across them sees a
difference from a real GPU, one that saves and restores state does not.
"""

from __future__ import annotations

import ctypes
from typing import Any, Callable

import torch
from torch._subclasses.fake_tensor import FakeTensor

aten = torch.ops.aten

# ATen/native/cuda/DistributionTemplates.h (calc_execution_policy) and Dropout.cu launch 256-thread
# blocks, at most as many as fit on all SMs at once, each thread drawing `unroll` numbers per
# Philox call, and advance the offset by 4 per call a thread makes.
_BLOCK = 256
_OFFSET_PER_CALL = 4


def _default_generator_objects(count: int) -> tuple[torch.Generator, ...]:
    """The Python objects of the shim's default generators, as torch's CUDA init makes them."""
    make = ctypes.PyDLL(None).phantora_cuda_default_generator  # the shim is loaded RTLD_GLOBAL
    make.restype = ctypes.c_void_p
    make.argtypes = [ctypes.c_int]
    generators = []
    for i in range(count):
        ptr = make(i)
        if not ptr:
            raise RuntimeError(f"phantora: the native shim could not make the default CUDA generator of cuda:{i} "
                               "(THPGenerator_initDefaultGenerator not found in libtorch_python)")
        # The new reference it returns is kept for the life of the process, as torch's own
        # torch.cuda.default_generators tuple keeps it.
        generators.append(ctypes.cast(ptr, ctypes.py_object).value)
    return tuple(generators)


def _grid_stride_increment(numel: int, unroll: int, sm_count: int, threads_per_sm: int) -> int:
    if numel <= 0:
        return 0
    grid = min(sm_count * (threads_per_sm // _BLOCK), (numel + _BLOCK - 1) // _BLOCK)
    return ((numel - 1) // (_BLOCK * grid * unroll) + 1) * _OFFSET_PER_CALL


def _float_unroll(t: torch.Tensor) -> int:
    # curand_uniform4 / curand_normal4 (4 numbers a call); for double, the *2_double variants.
    return 2 if t.dtype == torch.float64 else 4


def _random_unroll(t: torch.Tensor, low: int | None, high: int | None) -> int:
    # random_kernel draws 64 bits (2 numbers a call) for int64/double/float/bfloat16;
    # random_from_to does for ranges of 2**32 or more.
    if low is None and high is None:
        return 2 if t.dtype in (torch.int64, torch.float64, torch.float32, torch.bfloat16) else 4
    if high is None:
        return 2
    return 2 if high - low >= 1 << 32 else 4


def _numel_increment(unroll: Callable[[torch.Tensor, tuple, dict], int]) -> Callable[..., int]:
    def increment(out: torch.Tensor, args: tuple, kwargs: dict, sm_count: int, threads_per_sm: int) -> int:
        return _grid_stride_increment(out.numel(), unroll(out, args, kwargs), sm_count, threads_per_sm)

    return increment


_by_dtype = _numel_increment(lambda out, args, kwargs: _float_unroll(out))


def _bounded_random(bounds: Callable[[tuple, dict], tuple[int, int | None]]) -> Callable[..., int]:
    """random_(from, to) and randint: `bounds` reads (low, high) from the op's arguments."""
    def increment(out: torch.Tensor, args: tuple, kwargs: dict, sm: int, tps: int) -> int:
        low, high = bounds(args, kwargs)
        return _grid_stride_increment(out.numel(), _random_unroll(out, low, high), sm, tps)

    return increment


def _optional_int(x: Any) -> int | None:
    return None if x is None else int(x)


def _bernoulli_tensor_p(out: torch.Tensor, args: tuple, kwargs: dict, sm: int, tps: int) -> int:
    return 12 if out.numel() else 0  # bernoulli_tensor_cuda_kernel: philox_cuda_state(10), rounded up to 4


def _native_dropout(out: Any, args: tuple, kwargs: dict, sm: int, tps: int) -> int:
    x, p = args[0], float(args[1])
    train = args[2] if len(args) > 2 else kwargs.get("train")
    if train is False or p == 1.0:  # native_dropout_cuda's shortcuts draw nothing
        return 0
    return _grid_stride_increment(x.numel(), 4, sm, tps)


def _flash_attention(out: Any, args: tuple, kwargs: dict, sm: int, tps: int) -> int:
    dropout_p = args[3] if len(args) > 3 else kwargs.get("dropout_p", 0.0)
    if not dropout_p:
        return 0
    batch, heads = args[0].shape[0], args[0].shape[1]
    return batch * heads * 32  # flash_api.cpp: counter_offset = batch_size * num_heads * 32


# op -> increment(out, args, kwargs, sm_count, max_threads_per_sm); `out` is the tensor whose
# elements the kernel draws (the op's first output).
_INCREMENTS: dict[Any, Callable[..., int]] = {}


def _register(increment: Callable[..., int], *ops: Any) -> None:
    for op in ops:
        if op is not None:
            _INCREMENTS[op] = increment


def _overloads(packet: Any, *names: str) -> list[Any]:
    return [getattr(packet, n, None) for n in names]


_register(_by_dtype, aten.uniform_.default, aten.normal_.default, aten.exponential_.default,
          aten.cauchy_.default, aten.log_normal_.default, aten.geometric_.default, aten.bernoulli_.float,
          aten.bernoulli.p,
          *_overloads(aten.rand, "default", "generator", "names", "generator_with_names"),
          *_overloads(aten.randn, "default", "generator", "names", "generator_with_names"),
          aten.rand_like.default, aten.randn_like.default,
          *_overloads(aten.normal, "Tensor_float", "float_Tensor", "Tensor_Tensor", "float_float"),
          *_overloads(aten.uniform, "default"))
_register(_bernoulli_tensor_p, aten.bernoulli_.Tensor, aten.bernoulli.default)
_register(_numel_increment(lambda out, args, kwargs: _random_unroll(out, None, None)), aten.random_.default)
_register(_bounded_random(lambda a, k: (int(a[1]), _optional_int(a[2] if len(a) > 2 else k.get("to")))),
          *_overloads(aten.random_, "from"))
_register(_bounded_random(lambda a, k: (0, int(a[1]))), *_overloads(aten.random_, "to"))
_register(_bounded_random(lambda a, k: (0, int(a[0]))), *_overloads(aten.randint, "default", "generator"))
_register(_bounded_random(lambda a, k: (int(a[0]), int(a[1]))), *_overloads(aten.randint, "low", "low_generator"))
_register(_bounded_random(lambda a, k: (0, int(a[1]))), *_overloads(aten.randint_like, "default"))
_register(_bounded_random(lambda a, k: (int(a[1]), int(a[2]))), *_overloads(aten.randint_like, "low_dtype"))
_register(_native_dropout, aten.native_dropout.default)
_register(_flash_attention, aten._scaled_dot_product_flash_attention.default)

RANDOM_OPS = frozenset(_INCREMENTS)


def _first_tensor(out: Any) -> torch.Tensor | None:
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, (tuple, list)):
        for x in out:
            if isinstance(x, torch.Tensor):
                return x
    return None


def philox_increment(func: Any, args: tuple, kwargs: dict, out: Any, sm_count: int, threads_per_sm: int) -> int:
    """How far a real GPU advances the generator's Philox offset for this op (0 if not known)."""
    increment = _INCREMENTS.get(func)
    drawn = _first_tensor(out)
    if increment is None or drawn is None:
        return 0
    return increment(drawn, args, kwargs, sm_count, threads_per_sm)


class OffsetAdvancer:
    """Advances the generator a random op on a virtual GPU draws from, as the GPU would."""

    def __init__(self, sm_count: int, threads_per_sm: int) -> None:
        self.sm_count = sm_count
        self.threads_per_sm = threads_per_sm

    def __call__(self, func: Any, args: tuple, kwargs: dict, out: Any) -> None:
        drawn = _first_tensor(out)
        if not isinstance(drawn, FakeTensor) or drawn.device.type != "cuda":
            return
        increment = philox_increment(func, args, kwargs, out, self.sm_count, self.threads_per_sm)
        if increment <= 0:
            return
        generator = kwargs.get("generator")
        if generator is None:
            index = drawn.device.index if drawn.device.index is not None else torch.cuda.current_device()
            generator = torch.cuda.default_generators[index]
        elif generator.device.type != "cuda":
            return  # a CPU generator for a CUDA op: a GPU refuses it, the fake kernel does not check
        # CUDAGeneratorState::increase rounds up to a multiple of 4.
        generator.set_offset(generator.get_offset() + (increment + 3) // 4 * 4)


_advancer: OffsetAdvancer | None = None


def note_random_op(func: Any, args: tuple, kwargs: dict, out: Any) -> None:
    """Called by the op observer for every op in RANDOM_OPS once it has run."""
    if _advancer is not None:
        _advancer(func, args, kwargs, out)


def install_cuda_rng(device_count: int, current_device: Callable[[], int], count_devices: Callable[[], int],
                     sm_count: int, threads_per_sm: int) -> None:
    """Fill torch.cuda.default_generators and point torch/cuda/random.py at the virtual devices.

    torch/cuda/random.py bound current_device, device_count and is_initialized from torch.cuda
    when it was imported, before phantora replaced torch.cuda's; rebind them there."""
    import torch.cuda.random as crandom

    torch.cuda.default_generators = _default_generator_objects(device_count)  # type: ignore[assignment]
    crandom.current_device = current_device  # type: ignore[attr-defined]
    crandom.device_count = count_devices  # type: ignore[attr-defined]
    crandom.is_initialized = lambda: True  # type: ignore[attr-defined]
    global _advancer
    _advancer = OffsetAdvancer(sm_count, threads_per_sm)
