"""What a script reads when it asks a virtual GPU for a value (.item(), float(t), bool(t),
.tolist(), .cpu(), .numpy()), and how those values flow through ops, copies and collectives.

Tensors on virtual GPUs hold no data. The policy, one rule per kind of tensor:

| tensor                                              | reads as                                      |
|-----------------------------------------------------|-----------------------------------------------|
| computed on a virtual GPU from data with no shadow  | its *value*: one number, every element and    |
|                                                     | every aggregate of it, in whatever dtype read |
|   from an op nothing is known about (matmul, ...)   |   1 (float 1.0), a bool False                 |
|   from isfinite / isnan, isinf / found_inf (AMP)  |   True / False / 0: a healthy run is finite   |
|   from zeros, ones, full, fill_, zero_              |   the fill value                              |
|   from a cast, copy, view, or a reduction (sum,     |   its input's value (sum of 1s reads 1)       |
|     max, any, norm, ...) of one tensor              |                                               |
|   from a pointwise op (add, logical_or, gt, ...)    |   the op computed on the inputs' values;      |
|                                                     |   a non-finite float result reads 1 instead   |
|   from an initializer's draw (normal_, uniform_)    |   the distribution's mean                     |
|   from another random op (randn, bernoulli_, ...)   |   1 / False (it does not draw CPU randomness) |
| a mask: a comparison of a draw (randn, normal_,     | a pattern with the fraction the distribution  |
|   rand, uniform_, randint) or of unknown float data |   implies, or the default (--mask-fraction)   |
|   with a constant; bernoulli_, dropout's mask       |   for unknown data: masks.py, made when read  |
| holding data from real CPU tensors (a *shadow*)     | that data, exactly                            |
|   copied from the CPU (torch.tensor(..., 'cuda'),   |   up to COPY_SHADOW_MAX_NUMEL elements        |
|     .to('cuda')), and copies/views of such tensors  |                                               |
|   computed from shadowed inputs only                |   up to SHADOW_MAX_NUMEL elements             |
| copied to the CPU (.cpu(), .to('cpu'), copy_)       | a shadow arrives as a real CPU tensor; a value|
|                                                     |   stays the value of the (fake) CPU copy      |
| after all_reduce / broadcast / all_gather / recv    | the collective computed on every member's     |
|                                                     |   shadow or value: SUM over N ranks of 1 is N |
| a tensor subclass wrapping virtual tensors (DTensor)| as its inner (local) tensor                   |

So a bool read False is 0 as a byte and 0.0 as a float; DeepSpeed's overflow vote (floats ->
isnan/isinf -> logical_or -> float -> max -> += -> bool -> byte -> all_reduce(MAX) -> item)
says "no overflow", a gradient norm is a finite positive number, and a counter computed on the
CPU keeps its value through the GPU and back. The values a script prints from model data are
placeholders; only its timings are predictions. Small integer/bool and 1-element CPU tensors
from factories, and integer CPU factories up to REAL_CPU_INT_FACTORY_MAX_NUMEL elements
(randperm for a sampler), are real CPU tensors (interpose/ops/observer.py).

Views of a shadowed tensor shadow views of its shadow, so in-place writes through a view reach
the base. A value belongs to the memory (the storage), not to one tensor object: a write through
any view is read through every view of it, the last write winning (_StorageAttr). interpose/distributed/process_group.py carries shadows and values across collectives (tensors up to
COPY_SHADOW_MAX_NUMEL elements; larger ones take every member to hold this rank's value): each
rank posts its contribution to the c10d store when it issues the collective and reads the
others' when the result is first used (`defer`), so issuing a collective never blocks the host.
"""

from __future__ import annotations

import dataclasses
import math
import weakref
from contextlib import contextmanager
from typing import Any, Callable, Iterator

import numpy as np
import torch
from torch._subclasses.fake_tensor import FakeTensor, unset_fake_temporarily
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from interpose.values import masks

aten = torch.ops.aten
Number = bool | int | float | complex

# Results computed from shadowed inputs keep a shadow up to this size: scripts steer by small
# tensors (flags, counters, votes); larger integer results (token ids, indices) are data.
SHADOW_MAX_NUMEL = 64
# Data copied to a virtual GPU from a real CPU tensor, and copies, views and collectives of it,
# keep a shadow up to this size: 64 Ki elements (at most 512 KiB of host memory, a shadow
# duplicates data the script already holds on the CPU). It holds the CPU generator state
# Accelerate broadcasts through the GPU (5,056 bytes) and a batch of token ids (8 x 1024),
# and leaves out image batches and model weights, whose copies would cost real memory per rank.
COPY_SHADOW_MAX_NUMEL = 1 << 16
# Index data: integer and bool results (expert ids, masks, counts, positions), and any result
# computed only from tensors that hold data, keep a shadow up to this size: 32 Mi elements (256 MiB
# as int64). Routing is steered by such tensors: a top-k's expert ids (the routing model's,
# phantora/routing.py), one_hot masks of them ([tokens, k, experts]: 16 Mi elements for 16 Ki
# tokens, top-8 of 128 experts), their sums, sorts and cumulative sums; every count a program
# reads back must follow from them. Beyond this size a result reads as one value (docs/moe.md).
DERIVED_SHADOW_MAX_NUMEL = 1 << 25
# Floating-point results computed from tensors that hold data keep a shadow up to this size (16
# MiB as float32): loss masks, position tables, router probabilities. Larger ones are
# activation-sized (a zero-filled gradient of vocabulary logits that a loss scatters its labels
# into: 16 Mi elements per chunk of TorchTitan's chunked loss, built on the CPU for every chunk
# and never read) and steer nothing.
DERIVED_FLOAT_SHADOW_MAX_NUMEL = 1 << 22
# Integer/bool CPU tensors from factories (randperm, arange) are real up to this size: 16 Mi
# elements, 128 MiB as int64, the index permutation of a 16M-sample dataset; .tolist() on them is
# then one local call. The real program holds the same tensor in host memory.
REAL_CPU_INT_FACTORY_MAX_NUMEL = 1 << 24


@contextmanager
def real_cpu() -> Iterator[None]:
    """Compute on real CPU tensors, unseen by the dispatch modes: values and shadows are
    phantora's bookkeeping, not the script's work, and must not be reported as its ops (this
    also runs outside any dispatch: .tolist(), collectives)."""
    with unset_fake_temporarily(), torch._C._DisableTorchDispatch():
        yield


class _TensorAttr:
    """Per-tensor state kept in the tensor's own __dict__: it dies with the tensor, and it moves
    with the data where torch moves a tensor's Python state (torch.utils.swap_tensors in
    Module.to(), deepcopy). A weakref to the tensor would do neither, and swap_tensors refuses
    tensors that have one ("Cannot swap t1 because it has weakref associated with it")."""

    def __init__(self, name: str) -> None:
        self.name = name

    def set(self, t: torch.Tensor, value: Any) -> None:
        t.__dict__[self.name] = value

    def get(self, t: torch.Tensor) -> Any:
        return t.__dict__.get(self.name)

    def drop(self, t: torch.Tensor) -> None:
        t.__dict__.pop(self.name, None)


class _StorageAttr(_TensorAttr):
    """State of the memory a tensor views rather than of the tensor: kept in its storage's
    __dict__ (torch keeps one Python object per storage), so a write through one view is read
    through every other view and the base, as on a GPU. DeepSpeed ZeRO-3 zero-fills a flat
    gradient buffer, takes per-parameter views of it, later copies each gradient in through
    fresh views of the same memory and reads the norm through the first ones: per tensor,
    they kept reading the zeros (grad norm 0). The last write wins (one number per storage).
    The tensor keeps a copy, read where its storage has none (a deepcopy that copied the
    tensor's __dict__ but not an observed op); wrapper subclasses (DTensor) have no storage of
    their own and keep it per tensor."""

    def _storage(self, t: torch.Tensor) -> dict | None:
        if not isinstance(t, FakeTensor):
            return None
        return t.untyped_storage().__dict__

    def set(self, t: torch.Tensor, value: Any) -> None:
        if value is None:
            t.__dict__.pop(self.name, None)
        else:
            t.__dict__[self.name] = value
        storage = self._storage(t)
        if storage is not None:
            storage[self.name] = value  # None too: the memory now reads as the default

    def get(self, t: torch.Tensor) -> Any:
        storage = self._storage(t)
        if storage is not None and self.name in storage:
            return storage[self.name]
        return t.__dict__.get(self.name)

    def drop(self, t: torch.Tensor) -> None:
        self.set(t, None)


_shadows = _TensorAttr("_phantora_shadow")  # virtual tensor -> real CPU tensor holding its data
_values = _StorageAttr("_phantora_value")   # virtual memory -> its value, where not its dtype's default


# virtual memory -> True where every element holds its value exactly (a fill: zeros, ones, full,
# fill_, and views, copies and pointwise ops of such memory), not a placeholder for unknown data.
# Combined with data phantora holds (a shadow), such memory takes part as what it is: a routing
# map `zeros_like(scores).int().scatter(1, expert_ids, 1)` has real counts.
_exact = _StorageAttr("_phantora_exact")
# virtual memory -> how its elements were made where phantora knows (masks.Draw, masks.Mask) or a
# masks.Unknown seed: what a comparison on it selects (masks.py)
_dists = _StorageAttr("_phantora_dist")
_pending = _TensorAttr("_phantora_pending")  # virtual tensor -> values other ranks still owe it
_SHADOW_NAME, _VALUE_NAME, _PENDING_NAME = _shadows.name, _values.name, _pending.name  # read inline per op


class _Once:
    def __init__(self, fn: Callable[[], None]) -> None:
        self.fn: Callable[[], None] | None = fn
        _unresolved[id(self)] = self

    def __call__(self) -> None:
        fn, self.fn = self.fn, None
        _unresolved.pop(id(self), None)
        if fn is not None:
            fn()


# Deferred resolves not run yet, in the order they were made. Weak: the tensors that owe a value
# hold their resolve; once they are gone nothing can read it (a loss all-reduced every step and
# never read would otherwise keep one closure and its tensors alive per step).
_unresolved: weakref.WeakValueDictionary[int, _Once] = weakref.WeakValueDictionary()


def settle_all() -> None:
    """Run every deferred resolve now (the process is about to leave its process group: what
    other ranks owe it must be read while the store is there)."""
    for once in list(_unresolved.values()):
        once()


def defer(tensors: list[torch.Tensor], resolve: Callable[[], None]) -> Callable[[], None]:
    """Values a collective brings from other ranks are written by `resolve` when the script
    first reads or overwrites one of `tensors`: issuing a collective does not block the host on
    a real GPU, and a rank that never joins must be found by the simulator's collective timeout,
    not hang in a wait for its contribution."""
    once = _Once(resolve)
    for t in tensors:
        _pending.set(t, once)
    return once


def _settle(t: torch.Tensor) -> None:
    owed = _pending.get(t)
    if owed is not None:
        _pending.drop(t)
        owed()


class _NoShadow(Exception):
    pass


# --- reading ----------------------------------------------------------------------------------
def default_value(dtype: torch.dtype) -> Number:
    """The value of a tensor nothing is known about: 1 (never 0, so `x / n` does not raise); a
    bool False (flags are unset on a healthy run)."""
    if dtype is torch.bool:
        return False
    if dtype.is_complex:
        return complex(1.0)
    return 1.0 if dtype.is_floating_point else 1


_casts: dict[tuple, Number] = {}


def as_dtype(v: Number, dtype: torch.dtype) -> Number:
    """The number v read in dtype, cast as torch casts it (float -> int truncates, uint8 wraps)."""
    if isinstance(v, complex) and not dtype.is_complex:
        # the real part, as the cast keeps; torch's cast would also print its "discards the
        # imaginary part" warning into the user's output for phantora's own bookkeeping
        v = v.real
    key = (type(v), v, dtype)
    r = _casts.get(key)
    if r is None:
        with real_cpu():
            wide = torch.float64 if isinstance(v, float) else torch.complex128 if isinstance(v, complex) else None
            r = torch.tensor(v, dtype=wide).to(dtype).item()  # from Python's full precision
        if len(_casts) > 4096:
            _casts.clear()
        _casts[key] = r
    return r


def inner_tensor(t: torch.Tensor) -> torch.Tensor | None:
    """The first inner tensor of a traceable wrapper subclass (a DTensor's local tensor)."""
    if not is_traceable_wrapper_subclass(t):
        return None
    attrs, _ = t.__tensor_flatten__()
    for name in attrs:
        inner = getattr(t, name, None)
        if isinstance(inner, torch.Tensor):
            return inner
    return None


def is_virtual(t: Any) -> bool:
    """A tensor without data: a FakeTensor, or a wrapper subclass around one (DTensor)."""
    if isinstance(t, FakeTensor):
        return True
    inner = inner_tensor(t) if isinstance(t, torch.Tensor) else None
    return inner is not None and is_virtual(inner)


def value_of(t: torch.Tensor) -> Number:
    """The one number t reads as where it has no shadow to read (see the module's table)."""
    _settle(t)
    data = _shadows.get(t)
    if data is None and not is_virtual(t) and t.device.type != "meta":  # meta tensors have no data either
        data = t  # a real tensor (a CPU scalar in `x * torch.tensor(2.0)`)
    if data is not None and data.numel() > 0:
        with real_cpu():
            return as_dtype(data.reshape(-1)[0].item(), t.dtype)
    v = _values.get(t)
    if v is not None:
        return as_dtype(v, t.dtype)
    inner = inner_tensor(t)
    if inner is not None:
        return as_dtype(value_of(inner), t.dtype)
    return default_value(t.dtype)


def scalar_value(t: torch.Tensor) -> Number:
    """t.item() for a virtual tensor: a mask's element where it is one (masks.py), else its value."""
    if t.numel() == 1 and shadow_of(t) is None:
        data = mask_data(t)
        if data is not None:
            with real_cpu():
                return as_dtype(data.reshape(-1)[0].item(), t.dtype)
    return value_of(t)


def tolist_value(t: torch.Tensor) -> Any:
    shadow = shadow_of(t)
    if shadow is None:
        shadow = mask_data(t)
    if shadow is not None:
        with real_cpu():
            return shadow.tolist()
    v = scalar_value(t)
    shape = tuple(t.shape)
    if not shape:
        return v

    def build(dims: tuple[int, ...]) -> Any:
        if len(dims) == 1:
            return [v] * dims[0]
        return [build(dims[1:]) for _ in range(dims[0])]

    return build(shape)


def host_data(t: torch.Tensor) -> torch.Tensor | None:
    """t's data as a real CPU tensor where it is known element by element (its shadow, or t
    itself when t is real); None where t reads as one value."""
    if not is_virtual(t):
        return t if t.device.type == "cpu" else None
    shadow = shadow_of(t)
    if shadow is None:
        inner = inner_tensor(t)
        return host_data(inner) if inner is not None else mask_data(t)
    return shadow


def host_view(t: torch.Tensor) -> torch.Tensor:
    """What t reads as, as a real CPU tensor of t's shape: its data (host_data), else its value
    in every element, as a broadcast view that costs no memory."""
    data = host_data(t)
    with real_cpu():
        if data is not None:
            return data if data.dtype == t.dtype else data.to(t.dtype)
        return torch.tensor(value_of(t), dtype=t.dtype).expand(tuple(t.shape))


def host_copy(t: torch.Tensor) -> torch.Tensor:
    """A real CPU tensor with what t reads as: its shadow, or its value in every element."""
    with real_cpu():
        if not is_virtual(t):
            return t.clone()
        shadow = shadow_of(t)
        if shadow is None:
            shadow = mask_data(t)
        if shadow is not None:
            return shadow.to(dtype=t.dtype).clone()
        return torch.full(tuple(t.shape), value_of(t), dtype=t.dtype)


def set_value(t: torch.Tensor, v: Number | None, exact: bool = False) -> None:
    """t now reads as v everywhere (None: as its dtype's default); `exact`: every element holds v
    (a fill), rather than v standing for data nothing is known about. A wrapper's (DTensor's)
    inner tensor takes the value too: the observer sees the wrapper's ops, not those on its
    local tensor, and reads fall through to the local tensor."""
    _settle(t)
    if v is None or as_dtype(v, t.dtype) == default_value(t.dtype):
        _values.drop(t)
    else:
        _values.set(t, as_dtype(v, t.dtype))
    exact = exact and v is not None
    if exact or _exact.get(t) is not None:
        # A fill written through a view that covers part of the memory leaves the rest as it was:
        # the memory is exact only if the view covers all of it, or it held that value already.
        keep = exact and (_covers_storage(t) or (_exact.get(t) and v == _values.get(t)))
        _exact.set(t, True if keep else None)
    inner = inner_tensor(t) if not isinstance(t, FakeTensor) else None
    if inner is not None:
        _shadows.drop(inner)  # the wrapper's op changed the local data out of the observer's sight
        set_value(inner, v, exact)


def _covers_storage(t: torch.Tensor) -> bool:
    """t addresses every byte of its storage (a fill through it fills the memory)."""
    if not isinstance(t, FakeTensor):
        return True
    return t.untyped_storage().nbytes() == t.numel() * t.element_size()


def _marked_exact(t: FakeTensor) -> bool:
    """_exact.get(t), inlined: it runs for arguments of many ops."""
    storage = t.untyped_storage().__dict__
    return bool(storage[_EXACT_NAME] if _EXACT_NAME in storage else t.__dict__.get(_EXACT_NAME))


_EXACT_NAME = _exact.name


class ExactInputs:
    """Which of an op's arguments hold exact fills (_exact), and their values. An op that writes
    none of its arguments leaves them as they are, so they are read when asked (most ops never
    ask); an op that writes some (in place, out=) is asked about those as they were before it
    ran: a zero fill that index_put_ writes ones into is computed from its zeros."""

    __slots__ = ("before",)

    def __init__(self, before: dict[int, Number] | None = None) -> None:
        self.before = before  # id -> value of the written arguments that were exact; None: nothing written

    def has(self, t: Any) -> bool:
        if self.before is not None and id(t) in self.before:
            return True
        return isinstance(t, FakeTensor) and _marked_exact(t)

    def value(self, t: Any) -> Number:
        """The fill's value as the op read it."""
        if self.before is not None and id(t) in self.before:
            return self.before[id(t)]
        return value_of(t)


READ_NOW = ExactInputs()  # no argument written by the op (or none exact): every one as it is now


def exact_inputs(func: Any, args: tuple, kwargs: dict) -> ExactInputs:
    """The op's arguments' exactness, taken before the op runs (see ExactInputs)."""
    if not _written_args(func):
        return READ_NOW
    before = {id(t): value_of(t) for t in _written_tensors(func, args, kwargs)
              if isinstance(t, FakeTensor) and _marked_exact(t)}
    return ExactInputs(before) if before else READ_NOW


# --- shadows ----------------------------------------------------------------------------------
def shadowable(t: Any, cap: int = SHADOW_MAX_NUMEL) -> bool:
    """A tensor (virtual GPU, or a fake CPU copy of one) small enough to keep a real shadow. Not
    one on the meta device (FLOP counting on a meta model, as Lightning's measure_flops does): it
    has no data on a GPU either, and its shadow would be a meta tensor nothing can read."""
    return isinstance(t, FakeTensor) and t.device.type != "meta" and t.numel() <= cap


def exchanges_values(t: torch.Tensor) -> bool:
    """Whether a collective on t exchanges shadows and values between ranks (through the c10d
    store). It depends on shape only, so every member of the collective decides the same. An empty
    tensor has nothing to exchange (the placeholders of object collectives: posted, never read,
    their keys would stay in the store)."""
    return 0 < t.numel() <= COPY_SHADOW_MAX_NUMEL


def shadow_of(t: torch.Tensor) -> torch.Tensor | None:
    _settle(t)
    return _shadows.get(t)


def set_shadow(t: torch.Tensor, shadow: torch.Tensor | None) -> None:
    _settle(t)
    if shadow is None:
        _shadows.drop(t)
    else:
        _shadows.set(t, shadow)


class _MaskInput:
    """A mask argument whose pattern is made only once every other argument proved to hold data."""

    def __init__(self, t: FakeTensor) -> None:
        self.t = t


def _lacks_data(a: Any, is_fake: Callable[[Any], bool], exact: ExactInputs | None) -> bool:
    """Whether an argument holds a tensor without data on the CPU: a real tensor elsewhere, or a
    virtual one with neither a shadow, nor a mask's pattern, nor (per `exact`) an exact fill no
    larger than DERIVED_SHADOW_MAX_NUMEL. Told before _on_cpu copies anything: an op one of whose
    inputs holds nothing (a scatter of activations into a zero fill) makes no copy of the others."""
    if isinstance(a, torch.Tensor):
        if not is_fake(a):
            return a.device.type != "cpu"
        if shadow_of(a) is not None:
            return False
        if a.numel() > DERIVED_SHADOW_MAX_NUMEL:
            return True
        if isinstance(_dists.get(a), masks.Mask):
            return False
        return exact is None or not exact.has(a)
    if isinstance(a, (list, tuple)):
        return any(_lacks_data(x, is_fake, exact) for x in a)
    return False


def _on_cpu(a: Any, is_fake: Callable[[Any], bool], exact: ExactInputs | None, mask_inputs: list[_MaskInput]) -> Any:
    """a, whose tensors all hold data (not _lacks_data), with every virtual tensor replaced by its
    data on the CPU: its shadow, or an exact fill's value in every element. Masks (masks.py) are
    left as _MaskInput in `mask_inputs` (_with_masks makes them)."""
    if isinstance(a, torch.Tensor):
        if not is_fake(a):
            return a  # on the CPU
        s = shadow_of(a)
        if s is not None:
            return s
        if isinstance(_dists.get(a), masks.Mask):
            mask_inputs.append(_MaskInput(a))
            return mask_inputs[-1]
        assert exact is not None
        v = exact.value(a)
        with real_cpu():
            return torch.full(tuple(a.shape), v, dtype=a.dtype)
    if isinstance(a, torch.device):
        return torch.device("cpu") if a.type == "cuda" else a
    if isinstance(a, (list, tuple)):
        return type(a)(_on_cpu(x, is_fake, exact, mask_inputs) for x in a)
    if isinstance(a, str) and a.startswith("cuda"):
        return "cpu"
    return a


def _with_masks(a: Any) -> Any:
    """a with each _MaskInput replaced by the mask's pattern."""
    if isinstance(a, _MaskInput):
        data = mask_data(a.t)
        if data is None:
            raise _NoShadow
        return data
    if isinstance(a, (list, tuple)):
        return type(a)(_with_masks(x) for x in a)
    return a


def _kept(t: torch.Tensor) -> bool:
    """t holds a shadow or values owed by a collective, read as it is now (nothing settled)."""
    d = t.__dict__
    return d.get(_SHADOW_NAME) is not None or d.get(_PENDING_NAME) is not None


def _holds_nothing(a: Any, exact: ExactInputs | None) -> bool:
    """a is virtual and holds no data: no shadow, none owed by a collective (_kept), no exact
    fill (per `exact`, as _lacks_data counts one) and no mask."""
    if not isinstance(a, FakeTensor) or _kept(a):
        return False
    if exact is not None and exact.has(a):
        return False
    return not isinstance(_dists.get(a), masks.Mask)


def _an_input_holds_nothing(args: tuple, kwargs: dict, exact: ExactInputs | None) -> bool:
    """Some tensor argument (or one in a list argument) holds no data (_holds_nothing), so
    _lacks_data would find the op's inputs lacking, and no result gets a shadow."""
    for a in (*args, *kwargs.values()):
        if isinstance(a, (list, tuple)):
            if any(_holds_nothing(x, exact) for x in a):
                return True
        elif _holds_nothing(a, exact):
            return True
    return False


def _any_kept(outs: tuple) -> bool:
    """A result holds a shadow or a value owed by a collective (an in-place op's argument)."""
    return any(isinstance(o, torch.Tensor) and _kept(o) for o in outs)


def _any_shadow(a: Any) -> bool:
    if isinstance(a, FakeTensor):
        return shadow_of(a) is not None
    return isinstance(a, (list, tuple)) and any(_any_shadow(x) for x in a)


# Ops that copy data unchanged (or a view of it): their results keep shadows up to the copy cap.
# Ops whose result holds no defined data (on a GPU: whatever the caching allocator's block
# held). Their shadows read as the default value, as a tensor nothing is known about does; a
# shadow of the CPU's uninitialized memory made runs read different garbage each time.
_UNINITIALIZED = {aten.empty.memory_format, aten.empty_like.default, aten.empty_strided.default,
                  aten.new_empty.default, aten.new_empty_strided.default}
_COPIES = {aten._to_copy.default, aten.clone.default, aten.copy_.default, aten.lift_fresh.default,
           aten.lift_fresh_copy.default, aten.detach.default, aten.alias.default, aten._copy_from.default,
           aten.contiguous.default}


# Ops that read no data of their first argument, only its shape and dtype (a factory "like" it, a
# fill): their result has data whether or not the argument does. Megatron's and TorchTitan's
# routing maps are `zeros_like(scores, dtype=bool).scatter_(1, expert_ids, True)` over scores
# without data.
_SHAPE_ONLY = {aten.zeros_like.default, aten.ones_like.default, aten.full_like.default, aten.empty_like.default,
               aten.new_zeros.default, aten.new_ones.default, aten.new_full.default, aten.new_empty.default,
               aten.new_empty_strided.default, aten.zero_.default, aten.fill_.Scalar, aten.fill.Scalar}


def _shape_stand_in(t: Any) -> Any:
    """A real CPU tensor shaped like t (its data unread), for _SHAPE_ONLY ops."""
    if not isinstance(t, torch.Tensor):
        return t
    with real_cpu():
        return torch.empty_strided(tuple(t.shape), tuple(t.stride()), dtype=t.dtype)


def _shadow_cap(func: Any) -> int:
    return COPY_SHADOW_MAX_NUMEL if func in _COPIES or getattr(func, "is_view", False) else SHADOW_MAX_NUMEL


def is_index_dtype(dtype: torch.dtype) -> bool:
    """Integer and bool tensors: ids, masks, counts (not data a model computes in floats)."""
    return not (dtype.is_floating_point or dtype.is_complex)


def _has_tensor(a: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return True
    return isinstance(a, (list, tuple)) and any(_has_tensor(x) for x in a)


def _derived_cap(o: Any, from_tensors: bool) -> int:
    """The shadow size allowed for output o, beyond _shadow_cap: index data, and anything
    computed from tensors that all hold data (shadows or real CPU tensors)."""
    if not isinstance(o, FakeTensor):
        return 0
    if is_index_dtype(o.dtype):
        return DERIVED_SHADOW_MAX_NUMEL
    return DERIVED_FLOAT_SHADOW_MAX_NUMEL if from_tensors else 0


def _cpu_call(func: Any, args: Any, kwargs: dict) -> Any:
    """func on CPU tensors, computing what CUDA computes where the CPU kernel lacks a dtype: histc
    of integers (Transformers counts tokens per expert with `histc(expert_ids.int())` on CUDA;
    the CPU's histc takes floats only) is the histc of their exact float64 values."""
    if func is aten.histc.default and isinstance(args[0], torch.Tensor) and is_index_dtype(args[0].dtype):
        x = args[0]
        return func(x.double(), *args[1:], **kwargs).to(x.dtype)
    return func(*args, **kwargs)


def note_shadow(func: Any, args: tuple, kwargs: dict, out: Any, is_fake: Callable[[Any], bool],
                real_mode: Callable[[], Any], exact: ExactInputs | None = None) -> None:
    """Give results on a virtual GPU their real values, computed on the CPU shadows of the
    inputs; forget stale ones when that is not possible. `real_mode` is a context manager under
    which ops compute for real (the observer's unset_fake_temporarily). Several outputs (unbind:
    iterating over a tensor) are shadowed one by one. Random ops get no shadow: computing them
    on the CPU would draw from the script's CPU generator. Which results may hold a shadow:
    small ones (_shadow_cap), index data and results of shadowed inputs (_derived_cap). Inputs
    that are exact fills (`exact`, exact_inputs) take part with their value in every element
    where another input has a shadow or every result is small; else their value and exactness
    carry over (note_result) without copying them to the CPU."""
    outs = out if isinstance(out, (tuple, list)) else (out,)
    if func not in _SHAPE_ONLY and _an_input_holds_nothing(args, kwargs, exact) and not _any_kept(outs):
        return  # what follows would end in no shadow for any result, and none to forget
    base = _shadow_cap(func)
    from_tensors = func not in _SHAPE_ONLY and (_has_tensor(args) or _has_tensor(tuple(kwargs.values())))
    # An uninitialized result (empty, empty_like) holds nothing a program may read, so it is index
    # data to shadow only up to the base cap: FP8 payloads are uint8 `empty`s (Transformer
    # Engine), and shadowing them kept a real copy of every FP8 weight and activation per rank
    # (9 GB on Megatron-LM's Llama 3 70B stage, where the GPU holds it, not the host).
    caps = [base if func in _UNINITIALIZED else max(base, _derived_cap(o, from_tensors)) for o in outs]
    if not any(shadowable(o, cap) for o, cap in zip(outs, caps)):
        return
    if exact is not None and not (_any_shadow(args) or _any_shadow(tuple(kwargs.values()))) and \
            not all(shadowable(o) or not isinstance(o, FakeTensor) for o in outs):
        exact = None  # exact memory alone, large results: values carry it (no CPU copy)
    if _certain_reduction(func, args) is not None or \
            all(not shadowable(o, cap) or _lazy_mask(func, args, o) for o, cap in zip(outs, caps)):
        return  # masks note_result described (no pattern made), any/all of one whose answer is certain
    res = None
    if torch.Tag.nondeterministic_seeded not in getattr(func, "tags", ()):
        try:
            if func in _SHAPE_ONLY and args and isinstance(args[0], torch.Tensor) and shadow_of(args[0]) is None:
                args = (_shape_stand_in(args[0]), *args[1:])
            if _lacks_data(args, is_fake, exact) or _lacks_data(tuple(kwargs.values()), is_fake, exact):
                raise _NoShadow
            mask_inputs: list[_MaskInput] = []
            cargs = _on_cpu(args, is_fake, exact, mask_inputs)
            ckwargs = {k: _on_cpu(v, is_fake, exact, mask_inputs) for k, v in kwargs.items()}
            if mask_inputs:
                # a mask the op wrote in place already describes the result (note_result)
                written = {id(t) for t in _written_tensors(func, args, kwargs)}
                if any(id(m.t) in written for m in mask_inputs):
                    raise _NoShadow
                cargs, ckwargs = _with_masks(cargs), {k: _with_masks(v) for k, v in ckwargs.items()}
            if "pin_memory" in ckwargs:
                ckwargs["pin_memory"] = False
            with real_mode():
                res = _cpu_call(func, cargs, ckwargs)
                if func in _UNINITIALIZED:
                    res.fill_(default_value(res.dtype))
        except Exception:  # no shadow for an input, or an op the CPU does not run: value unknown
            res = None
    results = res if isinstance(res, (tuple, list)) else (res,)
    for i, (o, cap) in enumerate(zip(outs, caps)):
        if not shadowable(o, cap):
            continue
        r = results[i] if i < len(results) else None
        set_shadow(o, r if isinstance(r, torch.Tensor) and r.shape == o.shape else None)


# --- values -----------------------------------------------------------------------------------
_ZERO_SOURCES = {aten.isnan.default, aten.isinf.default, aten.isposinf.default, aten.isneginf.default}
_FILLS: dict[Any, Callable[[tuple], Any]] = {
    aten.zeros.default: lambda a: 0, aten.zeros_like.default: lambda a: 0, aten.new_zeros.default: lambda a: 0,
    aten.zero_.default: lambda a: 0, aten.ones.default: lambda a: 1, aten.ones_like.default: lambda a: 1,
    aten.new_ones.default: lambda a: 1, aten.full.default: lambda a: a[1], aten.full_like.default: lambda a: a[1],
    aten.new_full.default: lambda a: a[2], aten.fill_.Scalar: lambda a: a[1], aten.fill.Scalar: lambda a: a[1],
    aten.scalar_tensor.default: lambda a: a[0],
}


def _arg(args: tuple, kwargs: dict, i: int, name: str, default: float) -> Any:
    return args[i] if len(args) > i else kwargs.get(name, default)


# The in-place draws weight initializers make (nn.init's normal_, trunc_normal_, uniform_,
# xavier/kaiming) read as their distribution's mean: a value the samples of a healthy run take,
# inside any bounds centred on it. Rejection samplers loop until no element is out of range
# (torch 2.14's nn.init.trunc_normal_: `while ((r < a) | (r > b)).any()`); read as the
# placeholder 1, a weight drawn with std 0.02 and bounds +-3 std was out of range forever.
# Factories (randn, rand), which scripts use as stand-ins for data, keep the placeholder.
_RANDOM_MEANS: dict[Any, Callable[[tuple, dict], Any]] = {
    aten.normal_.default: lambda a, k: _arg(a, k, 1, "mean", 0.0),
    aten.uniform_.default: lambda a, k: (_arg(a, k, 1, "from", 0.0) + _arg(a, k, 2, "to", 1.0)) / 2,
}
_FROM_SECOND = {aten.copy_.default, aten._copy_from.default, aten.fill_.Tensor, aten.fill.Tensor}
_KEEP_EXTRA = {aten._to_copy.default, aten.clone.default, aten.lift_fresh.default, aten.lift_fresh_copy.default,
               aten.contiguous.default, aten.repeat.default, aten.cat.default, aten.stack.default,
               aten.index_select.default, aten.gather.default, aten.index.Tensor, aten.masked_select.default,
               aten.flip.default, aten.roll.default, aten.constant_pad_nd.default}
_KEEP, _POINTWISE, _OTHER = 0, 1, 2
_kinds: dict[Any, int] = {}
_pointwise_cache: dict[tuple, Number | None] = {}
_POINTWISE_CACHE_MAX = 4096


def _kind(func: Any) -> int:
    kind = _kinds.get(func)
    if kind is None:
        tags = getattr(func, "tags", ())
        if func in _KEEP_EXTRA or getattr(func, "is_view", False) or torch.Tag.reduction in tags:
            kind = _KEEP
        elif torch.Tag.pointwise in tags and torch.Tag.nondeterministic_seeded not in tags:
            kind = _POINTWISE
        else:
            kind = _OTHER
        _kinds[func] = kind
    return kind


def _first_tensor(a: Any) -> torch.Tensor | None:
    if isinstance(a, torch.Tensor):
        return a
    if isinstance(a, (list, tuple)):
        for x in a:
            t = _first_tensor(x)
            if t is not None:
                return t
    return None


def _finite(v: Any, dtype: torch.dtype) -> Number | None:
    """A healthy run's numbers are finite: inf/NaN from placeholder arithmetic (log 0, 1/0)
    read as the default instead."""
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, complex) and not (math.isfinite(v.real) and math.isfinite(v.imag)):
        return None
    return v


def _pointwise_value(func: Any, args: tuple, kwargs: dict) -> Number | None:
    """A pointwise op computed on its inputs' values, as torch computes it (type promotion,
    integer division, comparisons), on 0-dim CPU tensors."""
    key_parts: list[Any] = [func]
    scalar_args: list[Any] = []
    for a in args:
        if isinstance(a, torch.Tensor):
            v = value_of(a)
            key_parts.append((a.dtype, v))
            scalar_args.append((a.dtype, v))
        else:
            key_parts.append(a if isinstance(a, (int, float, bool, complex, type(None), torch.dtype)) else repr(a))
            scalar_args.append(a)
    for k, v in kwargs.items():
        key_parts.append((k, (v.dtype, value_of(v)) if isinstance(v, torch.Tensor) else
                          v if isinstance(v, (int, float, bool, complex, type(None), torch.dtype)) else repr(v)))
    key = tuple(key_parts)
    if key in _pointwise_cache:
        return _pointwise_cache[key]

    def real(x: Any) -> Any:
        if isinstance(x, tuple) and len(x) == 2 and isinstance(x[0], torch.dtype):
            return torch.tensor(x[1], dtype=x[0])
        return x

    result: Number | None = None
    try:
        with real_cpu():
            cargs = [real(a) for a in scalar_args]
            ckwargs = {k: torch.tensor(value_of(v), dtype=v.dtype) if isinstance(v, torch.Tensor) else
                       ("cpu" if isinstance(v, (str, torch.device)) and str(v).startswith("cuda") else v)
                       for k, v in kwargs.items() if k != "out"}
            r = func(*cargs, **ckwargs)
            r = r[0] if isinstance(r, (tuple, list)) else r
            if isinstance(r, torch.Tensor) and r.numel() == 1:
                result = _finite(r.item(), r.dtype)
    except Exception:  # an op that needs more than scalars: nothing known
        result = None
    if len(_pointwise_cache) >= _POINTWISE_CACHE_MAX:
        _pointwise_cache.clear()
    _pointwise_cache[key] = result
    return result


def _result_value(func: Any, args: tuple, kwargs: dict) -> Number | None:
    if func in _ZERO_SOURCES:
        return 0
    if func is aten.isfinite.default:
        return 1
    mean = _RANDOM_MEANS.get(func)
    if mean is not None:
        v = mean(args, kwargs)
        return v if isinstance(v, (int, float)) else None
    fill = _FILLS.get(func)
    if fill is not None:
        try:
            v = fill(args)
        except IndexError:
            return None
        return v if isinstance(v, (bool, int, float, complex)) else None
    if func in _FROM_SECOND:
        src = args[1] if len(args) > 1 else None
        return value_of(src) if isinstance(src, torch.Tensor) else src
    kind = _kind(func)
    if kind == _KEEP:
        src = _first_tensor(args)
        return None if src is None else value_of(src)
    if kind == _POINTWISE:
        return _pointwise_value(func, args, kwargs)
    return None


def _result_exact(func: Any, args: tuple, kwargs: dict, exact: ExactInputs) -> bool:
    """Whether the result holds its value in every element: a fill, or a view, copy or pointwise
    op of exact memory (`exact`: exact_inputs before the op) and plain numbers."""
    if func in _FILLS:
        return True
    if func in _FROM_SECOND:
        src = args[1] if len(args) > 1 else None
        return not isinstance(src, torch.Tensor) or exact.has(src) or (not is_virtual(src) and src.numel() == 1)
    kind = _kind(func)
    if kind == _KEEP and (getattr(func, "is_view", False) or func in _COPIES):
        src = _first_tensor(args)
        return src is not None and exact.has(src)
    if kind == _POINTWISE:
        tensors = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
        return bool(tensors) and all(exact.has(a) or (not is_virtual(a) and a.numel() == 1) for a in tensors)
    return False


_written: dict[Any, tuple[tuple[int, str], ...]] = {}


def _written_args(func: Any) -> tuple[tuple[int, str], ...]:
    """(schema position, name) of the arguments func writes (in-place ops, out= variants,
    _foreach_*_)."""
    found = _written.get(func)
    if found is None:
        schema = getattr(func, "_schema", None)
        found = tuple((i, a.name) for i, a in enumerate(schema.arguments)
                      if a.alias_info is not None and a.alias_info.is_write) if schema is not None else ()
        _written[func] = found
    return found


def _written_tensors(func: Any, args: tuple, kwargs: dict) -> Iterator[Any]:
    for i, name in _written_args(func):
        a = args[i] if i < len(args) else kwargs.get(name)
        if isinstance(a, (list, tuple)):
            yield from a
        else:
            yield a


def _forget_exact(func: Any, args: tuple, kwargs: dict) -> None:
    """The memory an op writes no longer holds a fill (unless the op says so again below): ops
    that write in place and return nothing (_foreach_add_, fsdp::chunk_cat) would leave it
    marked exact."""
    for t in _written_tensors(func, args, kwargs):
        if isinstance(t, FakeTensor) and _exact.get(t):
            _exact.set(t, None)


def note_result(func: Any, args: tuple, kwargs: dict, out: Any, exact: ExactInputs = READ_NOW) -> None:
    """Set the value of an op's result (the module's table), and whether it is exact (`exact`:
    exact_inputs before the op); then what its memory holds where it is a draw or a mask
    (masks.py). Called before note_shadow, so an in-place op still sees its input's old shadow."""
    _note_value(func, args, kwargs, out, exact)
    _note_dists(func, args, kwargs, out)


def _note_value(func: Any, args: tuple, kwargs: dict, out: Any, exact: ExactInputs) -> None:
    if exact.before:  # an exact argument was written
        _forget_exact(func, args, kwargs)
    if func is aten._amp_foreach_non_finite_check_and_unscale_.default:
        # GradScaler's found_inf (written in place): no inf/NaN gradient on a healthy run. Read as
        # the usual placeholder 1, it made GradScaler skip every optimizer step (fp16 AMP).
        if len(args) > 1 and isinstance(args[1], torch.Tensor):
            set_value(args[1], 0)
        return
    if isinstance(out, torch.Tensor):
        if is_virtual(out):
            set_value(out, _result_value(func, args, kwargs), _result_exact(func, args, kwargs, exact))
    elif isinstance(out, (tuple, list)):
        if getattr(func, "is_view", False):  # unbind, split, chunk: views of the input's memory
            src = _first_tensor(args)
            if src is None:
                return
            # src's value is read once: each output views its memory and takes the value that
            # memory holds, which leaves it unchanged (FSDP2 chunks every parameter into
            # world-size views). Its exactness is read per output: a partial view can clear it.
            v = value_of(src)
            for o in out:
                if isinstance(o, torch.Tensor) and is_virtual(o):
                    set_value(o, v, exact.has(src))
            return
        first = True
        for o in out:
            if isinstance(o, torch.Tensor) and is_virtual(o):
                # (values, indices) of max/min/sort: the values keep; everything else is unknown
                set_value(o, _result_value(func, args, kwargs) if first and _kind(func) == _KEEP else None)
                first = False


_plain_views: dict[Any, bool] = {}


def _plain_view(func: Any) -> bool:
    """func returns views of its first argument and writes none of its arguments (cached per op)."""
    found = _plain_views.get(func)
    if found is None:
        found = _plain_views[func] = bool(getattr(func, "is_view", False)) and not _written_args(func)
    return found


def note_view(func: Any, args: tuple, out: Any) -> bool:
    """note_result and note_shadow in one for the commonest op of a training step, a view (view,
    t, transpose, detach: over half of GPT-2's ops) of memory that holds no data phantora keeps
    (no shadow, exact fill or value owed by a collective): there the general path only gives
    each view its memory's value, and finds nothing to shadow (a mask's pattern is made where
    it is read; a view shares its memory's draw or mask). Returns False, having done
    nothing, where the general path must run (another op, or memory holding any of those)."""
    if not args or not _plain_view(func):
        return False
    src = args[0]
    if not isinstance(src, FakeTensor) or _kept(src) or _marked_exact(src):
        return False
    storage = src.untyped_storage()
    outs = out if isinstance(out, (tuple, list)) else (out,)
    dtype = src.dtype
    for o in outs:
        if not isinstance(o, FakeTensor) or o.dtype != dtype or o.untyped_storage() is not storage or _kept(o):
            return False
    # value_of(src), then set_value(o, it) for each view, written out: its memory is src's
    sd = storage.__dict__
    v = sd[_VALUE_NAME] if _VALUE_NAME in sd else src.__dict__.get(_VALUE_NAME)  # _values.get(src)
    v = None if v is None else as_dtype(v, dtype)
    if v is not None and v == default_value(dtype):
        v = None
    for o in outs:
        if v is None:
            o.__dict__.pop(_VALUE_NAME, None)
        else:
            o.__dict__[_VALUE_NAME] = v
    sd[_VALUE_NAME] = v
    return True


# --- draws and masks (masks.py) ------------------------------------------------------------------
# A mask's pattern is made for reads up to this many elements (1 byte each, plus its indices in
# chunks); a larger mask reads as its value, as any data beyond what phantora holds.
MASK_DATA_MAX_NUMEL = 1 << 28
# any()/all() of a mask are answered without its pattern where the expected number of elements
# that decide them is at least this: a pattern with none of them has probability e^-40.
_CERTAIN_COUNT = 40.0


def _whole(t: torch.Tensor) -> bool:
    """t is its memory, element for element in order (a fresh result, not a view of part)."""
    return t.storage_offset() == 0 and t.is_contiguous() and _covers_storage(t)


def _layout_seed(seed: int, t: torch.Tensor) -> int:
    """The seed of a mask compared from t: the draw's own, or, for a view of part of its memory,
    one mixed with where the view lies (so x[:, 0] > 0 and x[:, 1] > 0 are independent)."""
    if _whole(t):
        return seed
    return masks.mix(seed, t.storage_offset(), *t.shape, *t.stride())


_fallback_draws = 0


def _rng_seed(t: torch.Tensor, kwargs: dict) -> int:
    """A seed from the state of the generator a draw on t's device uses: its Philox offset,
    which every random op advances, so it is distinct per draw and the same when a program
    replays a draw (activation checkpointing restores the state). Not the generator's seed:
    an unseeded program gets a random one (torch.seed() at import), and masks must be the same
    from run to run. Off CUDA, a count of draws."""
    generator = kwargs.get("generator")
    if t.device.type == "cuda":
        try:
            if generator is None:
                index = t.device.index if t.device.index is not None else torch.cuda.current_device()
                generator = torch.cuda.default_generators[index]
            return masks.mix(0xC0DA, generator.get_offset())
        except (IndexError, RuntimeError, AttributeError):
            pass
    global _fallback_draws
    _fallback_draws += 1
    return masks.mix(0x5EED, _fallback_draws)


def _dist_of(t: Any) -> Any:
    """t's masks.Draw / Mask / Unknown where its memory has one and no shadow holds its data."""
    if not isinstance(t, FakeTensor):
        return None
    d = _dists.get(t)
    if d is None or shadow_of(t) is not None:
        return None
    return d


def _constant(a: Any) -> Number | None:
    """The one number an argument holds in every element: a Python number, a real 1-element
    tensor, an exact fill; None otherwise."""
    if isinstance(a, (bool, int, float)):
        return a
    if not isinstance(a, torch.Tensor):
        return None
    if not is_virtual(a):
        if a.numel() != 1 or a.device.type != "cpu":
            return None
        with real_cpu():
            return a.item()
    if isinstance(a, FakeTensor):
        s = shadow_of(a)
        if s is not None:
            if s.numel() != 1:
                return None
            with real_cpu():
                return s.reshape(-1)[0].item()
        if _marked_exact(a):
            return value_of(a)
    return None


def _storage_index(t: torch.Tensor) -> np.ndarray:
    """The index in its memory of each of t's elements, in t's shape."""
    shape, n = tuple(t.shape), t.numel()
    if t.is_contiguous():
        return np.arange(t.storage_offset(), t.storage_offset() + n, dtype=np.int64).reshape(shape)
    idx = np.full(shape, t.storage_offset(), dtype=np.int64)
    for d, (size, stride) in enumerate(zip(shape, t.stride())):
        idx += (np.arange(size, dtype=np.int64) * stride).reshape([-1 if i == d else 1 for i in range(len(shape))])
    return idx


def mask_data(t: torch.Tensor) -> torch.Tensor | None:
    """A mask's elements as a real CPU tensor (masks.py: its pattern), or None where t is no
    mask (or a larger one than MASK_DATA_MAX_NUMEL)."""
    d = _dist_of(t)
    if not isinstance(d, masks.Mask) or t.numel() > MASK_DATA_MAX_NUMEL:
        return None
    sel = masks.inside(d, _storage_index(t))
    with real_cpu():
        picked = torch.from_numpy(sel)
        if t.dtype is torch.bool and d.inside is True and d.outside is False:
            return picked
        return torch.where(picked, torch.tensor(as_dtype(d.inside, t.dtype), dtype=t.dtype),
                           torch.tensor(as_dtype(d.outside, t.dtype), dtype=t.dtype))


def _lazy_mask(func: Any, args: tuple, t: Any) -> bool:
    """t's memory is a mask that no shadow holds: its pattern is made only where it is read. A
    copy to the host (.cpu()) holds its data, as the real copy does (observer._real_host_copy)."""
    if not (isinstance(t, FakeTensor) and isinstance(_dists.get(t), masks.Mask) and shadow_of(t) is None):
        return False
    return not (func is aten._to_copy.default and t.device.type == "cpu" and args and
                isinstance(args[0], torch.Tensor) and args[0].device.type != "cpu")


def _truthy_fraction(d: masks.Mask) -> float:
    f = d.fraction()
    return (f if d.inside else 0.0) + ((1.0 - f) if d.outside else 0.0)


_ANY_ALL = {aten.any.default: "any", aten.all.default: "all"}


def _certain_reduction(func: Any, args: tuple) -> bool | None:
    """any()/all() over a whole mask where the answer is certain without its pattern (a
    rejection sampler's `while mask.any()` over a weight of 16 Mi elements makes none)."""
    kind = _ANY_ALL.get(func)
    if kind is None or not args:
        return None
    d = _dist_of(args[0])
    if not isinstance(d, masks.Mask):
        return None
    p, n = _truthy_fraction(d), args[0].numel()
    if kind == "any":
        return False if p == 0.0 else True if p * n >= _CERTAIN_COUNT else None
    return True if p == 1.0 else False if (1.0 - p) * n >= _CERTAIN_COUNT else None


def _number(x: Any) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else None


def _source_dist(func: Any, args: tuple, kwargs: dict, out: torch.Tensor) -> Any:
    """The draw or mask a random op makes (None: not one modelled)."""
    name, overload = func.overloadpacket.__name__, func._overloadname
    if name in ("randn", "randn_like"):
        return masks.Draw("normal", _rng_seed(out, kwargs))
    if name in ("rand", "rand_like"):
        return masks.Draw("uniform", _rng_seed(out, kwargs))
    if name == "normal_" or (name == "normal" and overload == "float_float"):
        first = 1 if name == "normal_" else 0
        mean, std = _number(_arg(args, kwargs, first, "mean", 0.0)), _number(_arg(args, kwargs, first + 1, "std", 1.0))
        if mean is None or std is None:
            return None
        return masks.Draw("normal", _rng_seed(out, kwargs), (("affine", std, mean),))
    if name == "uniform_":
        lo, hi = _number(_arg(args, kwargs, 1, "from", 0.0)), _number(_arg(args, kwargs, 2, "to", 1.0))
        if lo is None or hi is None:
            return None
        return masks.Draw("uniform", _rng_seed(out, kwargs), (("affine", hi - lo, lo),))
    if name in ("randint", "randint_like", "random_"):
        numbers = [a for a in (args[1:] if name != "randint" else args) if isinstance(a, int) and not isinstance(a, bool)]
        if name == "random_" and (overload not in ("from", "to") or (overload == "from" and len(numbers) < 2)):
            return None  # random_() over the dtype's range, random_(from, None): not modelled
        bounds = (0, numbers[0]) if len(numbers) == 1 else tuple(numbers[:2]) if len(numbers) >= 2 else None
        if name == "randint" and overload in ("default", "generator"):
            bounds = (0, numbers[0]) if numbers else None
        if bounds is None:
            return None
        return masks.Draw("randint", _rng_seed(out, kwargs), low=int(bounds[0]), high=int(bounds[1]))
    if name in ("bernoulli_", "bernoulli"):
        p = _arg(args, kwargs, 1, "p", None) if overload in ("float", "Tensor", "p") else args[0]
        p = _constant(p)
        if p is None or isinstance(p, complex):
            return None
        return masks.Mask(_rng_seed(out, kwargs), masks.normalize([(0.0, float(p))]),
                          as_dtype(1, out.dtype), as_dtype(0, out.dtype))
    return None


def _dropout_dists(args: tuple, kwargs: dict, outs: tuple) -> list[Any]:
    """native_dropout(x, p, train) -> (output, mask): the mask keeps 1 - p of the elements; the
    output is a mask too where x is a constant (x / (1 - p) where kept)."""
    p = _number(args[1]) if len(args) > 1 else None
    train = args[2] if len(args) > 2 else kwargs.get("train")
    if p is None or train is False or len(outs) != 2 or not isinstance(outs[1], torch.Tensor):
        return [None] * len(outs)
    keep = masks.normalize([(0.0, 1.0 - p)])
    seed = _rng_seed(outs[1], kwargs)
    x = _constant(args[0])
    scaled = None
    if isinstance(x, (int, float)) and p < 1.0:
        scaled = masks.Mask(seed, keep, as_dtype(x / (1.0 - p), outs[0].dtype), as_dtype(0, outs[0].dtype))
    return [scaled, masks.Mask(seed, keep, True, False)]


_COMPARISON_NAMES = frozenset(masks.COMPARISONS)


def _comparison_dist(func: Any, name: str, args: tuple, out: torch.Tensor) -> Any:
    """`x op c` (or `c op x`) for x a draw or unknown float data, c a constant."""
    if len(args) < 2:
        return None
    op = name
    x, c = args[0], _constant(args[1])
    if not isinstance(x, FakeTensor) or c is None:
        x, c, op = args[1], _constant(args[0]), masks.FLIPPED[name]
        if not isinstance(x, FakeTensor) or c is None:
            return None
    if isinstance(c, complex) or shadow_of(x) is not None or _constant(x) is not None:
        return None
    d = _dist_of(x)
    if isinstance(d, masks.Draw):
        return masks.Mask(_layout_seed(d.seed, x), masks.draw_cells(d, op, float(c)), True, False)
    if isinstance(d, masks.Mask) or shadow_of(x) is not None or not x.dtype.is_floating_point or \
            op in ("eq", "ne") or x.numel() <= SHADOW_MAX_NUMEL:
        return None  # small tensors are numbers a script steers by (a loss, a norm): their value decides
    # unknown data: the placeholder value decides whether it passes (value_of(out), just set)
    if not value_of(out):
        return None
    if not isinstance(d, masks.Unknown):
        d = masks.Unknown(_rng_seed(x, {}))
        _dists.set(x, d)
    return masks.Mask(_layout_seed(d.seed, x), masks.unknown_cells(True), True, False)


def _as_seen_through(d: masks.Draw, t: torch.Tensor) -> masks.Draw:
    """The draw as the result of an op on t holds it: where t views part of the memory, its
    seed is the one a comparison on t would use, so `x[:, 0] * 2 > 0` selects as `x[:, 0] > 0`."""
    seed = _layout_seed(d.seed, t)
    return d if seed == d.seed else dataclasses.replace(d, seed=seed)


_COPY_NAMES = frozenset({"_to_copy", "clone", "contiguous", "lift_fresh", "lift_fresh_copy", "copy_", "copy"})


def _draw_transform(name: str, func: Any, args: tuple, kwargs: dict, out: torch.Tensor) -> Any:
    """-x, a * x, x / a, x + b, x - b, b - x, |x| of a draw (a, b constants); copies and casts."""
    if name in _COPY_NAMES:
        src = args[1] if name in ("copy_", "copy") and len(args) > 1 else args[0] if args else None
        d = _dist_of(src)
        if isinstance(d, masks.Draw) and (out.dtype.is_floating_point or
                                          (d.kind == "randint" and not out.dtype.is_complex and out.dtype is not torch.bool)):
            return _as_seen_through(d, src)
        return None
    if not out.dtype.is_floating_point:
        return None
    base = name.rstrip("_")
    tensors = [i for i, a in enumerate(args) if isinstance(a, FakeTensor)]
    drawn = [i for i in tensors if isinstance(_dist_of(args[i]), masks.Draw)]
    if len(drawn) != 1:
        return None
    i = drawn[0]
    d: masks.Draw = _as_seen_through(_dist_of(args[i]), args[i])
    if base in ("neg", "abs"):
        return d.then(("affine", -1.0, 0.0) if base == "neg" else ("abs",))
    if base not in ("mul", "div", "add", "sub", "rsub") or len(args) < 2:
        return None
    c = _number(_constant(args[1 - i]))
    alpha = _number(kwargs.get("alpha", 1))
    if c is None or alpha is None:
        return None
    if base == "mul":
        return d.then(("affine", c, 0.0))
    if base == "div":
        return d.then(("affine", 1.0 / c, 0.0)) if c != 0 and kwargs.get("rounding_mode") is None and i == 0 else None
    if base == "add":
        return d.then(("affine", 1.0, c * alpha) if i == 0 else ("affine", alpha, c))
    if base == "sub":
        return d.then(("affine", 1.0, -c * alpha) if i == 0 else ("affine", -alpha, c))
    return d.then(("affine", -alpha, c)) if i == 0 else None  # rsub(x, c) = c - alpha x


def _mask_pointwise(func: Any, name: str, args: tuple, kwargs: dict, out: torch.Tensor) -> Any:
    """A pointwise op (or a copy) of whole masks with one seed and constants: a mask again."""
    if not _whole(out):
        return None
    if name in ("copy_", "copy"):  # dst.copy_(src): the source's elements, in dst's dtype
        src = args[1] if len(args) > 1 else None
        d = _dist_of(src)
        if not isinstance(d, masks.Mask) or not _whole(src) or tuple(src.shape) != tuple(out.shape):
            return None
        return masks.pointwise([d], lambda vals: as_dtype(vals[0], out.dtype))
    found: list[masks.Mask] = []
    slots: list[tuple[int, Any]] = []  # (index of the mask in `found` or -1, the argument)
    for a in args:
        d = _dist_of(a)
        if isinstance(d, masks.Mask):
            if not _whole(a) or tuple(a.shape) != tuple(out.shape) or (found and d.seed != found[0].seed):
                return None
            found.append(d)
            slots.append((len(found) - 1, a))
        elif isinstance(a, torch.Tensor):
            c = _constant(a)
            if c is None:
                return None
            if isinstance(c, complex):
                return None
            with real_cpu():
                slots.append((-1, torch.tensor(c, dtype=a.dtype)))
        else:
            slots.append((-1, a))
    if not found:
        return None
    if name in _COPY_NAMES:
        return masks.pointwise(found, lambda vals: as_dtype(vals[-1], out.dtype))
    ckwargs = {k: ("cpu" if isinstance(v, (str, torch.device)) and str(v).startswith("cuda") else v)
               for k, v in kwargs.items() if k != "out" and not isinstance(v, torch.Tensor)}
    if len(ckwargs) != len([k for k in kwargs if k != "out"]):
        return None

    def evaluate(vals: list[Number]) -> Number:
        with real_cpu():
            cargs = [torch.tensor(vals[j], dtype=a.dtype) if j >= 0 else a for j, a in slots]
            r = func(*cargs, **ckwargs)
            r = r[0] if isinstance(r, (tuple, list)) else r
            return as_dtype(r.item(), out.dtype)

    try:
        return masks.pointwise(found, evaluate)
    except (RuntimeError, TypeError, ValueError, OverflowError):
        return None


_OTHER_DIST, _SOURCE_DIST, _DROPOUT_DIST, _COMPARE_DIST, _POINTWISE_DIST = range(5)
_dist_kinds: dict[Any, int] = {}


def _dist_kind(func: Any) -> int:
    """Which rule of this section can give func's result a draw or a mask (cached per op)."""
    kind = _dist_kinds.get(func)
    if kind is None:
        name, tags = func.overloadpacket.__name__, getattr(func, "tags", ())
        if name == "native_dropout":
            kind = _DROPOUT_DIST
        elif torch.Tag.nondeterministic_seeded in tags:
            kind = _SOURCE_DIST
        elif name.rstrip("_") in _COMPARISON_NAMES:
            kind = _COMPARE_DIST
        elif torch.Tag.pointwise in tags or name in _COPY_NAMES:
            kind = _POINTWISE_DIST
        else:
            kind = _OTHER_DIST
        _dist_kinds[func] = kind
    return kind


def _result_dists(func: Any, kind: int, args: tuple, kwargs: dict, outs: tuple) -> list[Any]:
    if kind == _DROPOUT_DIST:
        return _dropout_dists(args, kwargs, outs)
    out = outs[0]
    rest = [None] * (len(outs) - 1)
    if not isinstance(out, FakeTensor):
        return [None, *rest]
    name = func.overloadpacket.__name__
    if kind == _SOURCE_DIST:
        return [_source_dist(func, args, kwargs, out), *rest]
    if kind == _COMPARE_DIST:
        d = _comparison_dist(func, name.rstrip("_"), args, out)
        if d is not None:
            return [d, *rest]
    d = _draw_transform(name, func, args, kwargs, out)
    if d is None:
        d = _mask_pointwise(func, name, args, kwargs, out)
    return [d, *rest]


def _holds_dist(args: tuple) -> bool:
    for a in args:
        if isinstance(a, FakeTensor) and _dists.get(a) is not None:
            return True
    return False


def _note_dists(func: Any, args: tuple, kwargs: dict, out: Any) -> None:
    """What the op's results hold as draws or masks; memory it wrote otherwise holds neither.
    Views share their memory's description and leave it as it is."""
    if getattr(func, "is_view", False):
        return
    outs = tuple(out) if isinstance(out, (tuple, list)) else (out,)
    if func in _ANY_ALL:
        certain = _certain_reduction(func, args)
        if certain is not None and isinstance(outs[0], torch.Tensor) and is_virtual(outs[0]):
            set_value(outs[0], certain)
    written = [t for t in _written_tensors(func, args, kwargs) if isinstance(t, FakeTensor)] if _written_args(func) else []
    kind = _dist_kind(func)
    # most ops: none of this section's rules apply, or no argument is a draw, mask or unknown data
    # a comparison could make one of
    if kind == _OTHER_DIST or (kind == _POINTWISE_DIST and not _holds_dist(args)) or \
            not any(isinstance(o, FakeTensor) for o in outs):
        for t in written:
            if _dists.get(t) is not None:
                _dists.set(t, None)
        return
    try:
        new = _result_dists(func, kind, args, kwargs, outs)
    except (RuntimeError, TypeError, ValueError, OverflowError, ZeroDivisionError, IndexError):
        new = [None] * len(outs)
    result_ids = set()
    for o, d in zip(outs, new):
        if not isinstance(o, FakeTensor):
            continue
        result_ids.add(id(o))
        fresh = not any(o is t for t in written)
        if d is not None and not _covers_storage(o):
            d = None  # a write through a view of part of the memory: the rest is unchanged, the whole unknown
        if d is not None or (not fresh and _dists.get(o) is not None):
            _dists.set(o, d)
    for t in written:
        if id(t) not in result_ids and _dists.get(t) is not None:
            _dists.set(t, None)


def note_collective_value(t: torch.Tensor, values: list[Number], reduce_op: str) -> None:
    """A reduction collective wrote into t: its value is the reduction of the members' values."""
    set_value(t, reduce_values(values, reduce_op, t.dtype))


def reduce_values(vals: list[Number], reduce_op: str, dtype: torch.dtype) -> Number | None:
    with real_cpu():
        stacked = torch.tensor(vals, dtype=dtype)
        out = combine(list(stacked.unbind(0)), reduce_op)
    return None if out is None else _finite(out.item(), dtype)


def combine(parts: list[torch.Tensor], reduce_op: str) -> torch.Tensor | None:
    """What a reduction collective computes from the members' tensors (NCCL's ops)."""
    stacked = torch.stack(parts)
    dtype = parts[0].dtype
    if reduce_op in ("sum", "avg"):
        out = stacked.sum(0)
        if reduce_op == "avg":
            out = out / len(parts) if dtype.is_floating_point or dtype.is_complex else out // len(parts)
    elif reduce_op == "product":
        out = stacked.prod(0)
    elif reduce_op == "min":
        out = stacked.amin(0) if dtype is not torch.bool else stacked.all(0)
    elif reduce_op == "max":
        out = stacked.amax(0) if dtype is not torch.bool else stacked.any(0)
    else:
        return None
    return out.to(dtype)


def _hinting_isfinite(original: Any) -> Any:
    # torch.isfinite decomposes (abs, ne, eq, mul) before dispatch, so its value is set here.
    def isfinite(t: torch.Tensor) -> torch.Tensor:
        out = original(t)
        if isinstance(out, torch.Tensor) and is_virtual(out):
            set_value(out, True)
        return out

    return isfinite


def install_value_hints() -> None:
    torch.isfinite = _hinting_isfinite(torch.isfinite)
    torch.Tensor.isfinite = _hinting_isfinite(torch.Tensor.isfinite)  # type: ignore[method-assign]
