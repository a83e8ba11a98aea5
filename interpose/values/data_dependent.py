"""Ops whose output shape depends on data, on virtual GPUs (docs/moe.md).

FakeTensorMode cannot size the result of `nonzero`, `x[mask]`, `masked_select`, `unique`,
`bincount` or `repeat_interleave(counts)` without the data: it raises
DynamicOutputShapeException. Here they take their sizes from the one value model of
interpose/values/policy.py: an input's data where phantora holds it (its shadow: data copied from the
CPU, and everything computed from it or from the routing model's expert ids), a mask's pattern
(masks.py: a comparison over drawn or unknown data selects a fraction of the elements), else its
value in every element (True selects everything, False nothing). The op runs on the CPU on
that data; the virtual GPU gets an output of the resulting shape, holding the result as its
shadow, so counts read back later (`.tolist()`, `.item()`) agree with the shapes.

Where the CUDA implementation copies a count to the host and waits for it (nonzero, and the ops
built on it: boolean-mask indexing and index_put_, masked_select; unique; bincount;
repeat_interleave without output_size), the op is reported with the HOST_SYNC tag and the
simulated host waits for the GPU there, as the real one stalls.

A boolean mask used as an index is what the CUDA kernel makes of it: `nonzero` of the mask (an
op of its own here, with its sync), then indexing with the resulting integer indices.
"""

from __future__ import annotations

from typing import Any

import torch
from torch._prims_common import make_contiguous_strides_for

from interpose.values import policy as values
from phantora.ops import HOST_SYNC

aten = torch.ops.aten
_SYNC = frozenset({HOST_SYNC})


def _is_mask(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and t.dtype in (torch.bool, torch.uint8)


def _virtual_device(args: Any) -> torch.device | None:
    """The device of the first virtual tensor among args (None: every tensor is real)."""
    for a in args:
        if isinstance(a, torch.Tensor):
            if values.is_virtual(a):
                return a.device
        elif isinstance(a, (list, tuple)):
            d = _virtual_device(a)
            if d is not None:
                return d
    return None


def _to_host(a: Any) -> Any:
    if isinstance(a, torch.Tensor):
        return values.host_view(a) if values.is_virtual(a) else a
    if isinstance(a, torch.device):
        return torch.device("cpu") if a.type == "cuda" else a
    if isinstance(a, (list, tuple)):
        return type(a)(_to_host(x) for x in a)
    return a


def _virtual_result(real: torch.Tensor, device: torch.device, stride: tuple[int, ...] | None = None) -> torch.Tensor:
    """A tensor on the virtual device with real's shape and dtype, holding real as its shadow
    (up to values.DERIVED_SHADOW_MAX_NUMEL elements; beyond, its first element as its value)."""
    shape = tuple(real.shape)
    out = torch.empty_strided(shape, stride or make_contiguous_strides_for(shape),
                              dtype=real.dtype, device=device)
    if real.numel() <= values.DERIVED_SHADOW_MAX_NUMEL:
        with values.real_cpu():
            values.set_shadow(out, real.contiguous())
    elif real.numel():
        with values.real_cpu():
            values.set_value(out, real.reshape(-1)[0].item())
    return out


def computed_on_host(obs: Any, func: Any, args: tuple, kwargs: dict, sync: bool = True) -> Any:
    """nonzero, unique, bincount, repeat_interleave(counts): computed on the CPU from what the
    inputs read as; the outputs, on the virtual device, hold the result."""
    device = _virtual_device((*args, *kwargs.values()))
    if device is None:  # real CPU tensors: the op itself
        return obs.run_op(func, args, kwargs)
    hargs, hkwargs = _to_host(args), {k: _to_host(v) for k, v in kwargs.items()}
    with values.real_cpu():
        real = func(*hargs, **hkwargs)
    if isinstance(real, torch.Tensor):
        stride = None
        if func is aten.nonzero.default and device.type == "cuda":
            stride = (1, max(real.shape[0], 1))  # CUDA's nonzero fills its output column by column
        out: Any = _virtual_result(real, device, stride)
    else:
        out = tuple(_virtual_result(r, device) for r in real)
    if obs.active():
        obs._report(func, args, kwargs, out, _SYNC if sync else frozenset())
    return out


def _repeat_interleave(obs: Any, func: Any, args: tuple, kwargs: dict) -> Any:
    """repeat_interleave(repeats): its length is sum(repeats), which CUDA reads back unless the
    caller passes output_size."""
    output_size = kwargs.get("output_size", args[1] if len(args) > 1 else None)
    return computed_on_host(obs, func, args, kwargs, sync=output_size is None)


def _mask_indices(obs: Any, mask: torch.Tensor) -> list[torch.Tensor]:
    """The integer indices a boolean mask selects (one tensor per mask dimension), as the CUDA
    kernel derives them: nonzero of the mask, reported as its own op (with its host sync)."""
    if mask.dtype is torch.uint8:
        mask = obs.run_op(aten._to_copy.default, (mask,), {"dtype": torch.bool})
    nz = computed_on_host(obs, aten.nonzero.default, (mask,), {})
    cols = aten.unbind.int(nz, 1)
    shadow = values.shadow_of(nz)
    for i, c in enumerate(cols):
        with values.real_cpu():
            values.set_shadow(c, None if shadow is None else shadow[:, i].contiguous())
    return list(cols)


def _expanded(obs: Any, indices: Any) -> list[Any] | None:
    """indices with every mask replaced by its integer indices; None when there is no mask."""
    if not isinstance(indices, (list, tuple)) or not any(_is_mask(i) for i in indices):
        return None
    out: list[Any] = []
    for i in indices:
        if _is_mask(i) and values.is_virtual(i):
            out.extend(_mask_indices(obs, i))
        elif _is_mask(i):  # a real CPU mask indexing a virtual tensor: its indices are real too
            with values.real_cpu():
                out.extend(i.bool().nonzero().unbind(1))
        else:
            out.append(i)
    return out


def _index_with_masks(obs: Any, func: Any, args: tuple, kwargs: dict) -> Any:
    """x[mask], index_put_ with a mask: the mask becomes integer indices first (nonzero)."""
    indices = _expanded(obs, args[1] if len(args) > 1 else kwargs.get("indices"))
    if indices is None or _virtual_device(args) is None:
        return obs.run_op(func, args, kwargs)
    new_args = (args[0], indices, *args[2:])
    kwargs = {k: v for k, v in kwargs.items() if k != "indices"}
    return obs.run_op(func, new_args, kwargs)


def _masked_select(obs: Any, func: Any, args: tuple, kwargs: dict) -> Any:
    """masked_select(x, mask): as many elements as the (broadcast) mask selects, a 1-D tensor.
    Its data is computed only where x holds data; a placeholder x leaves its value."""
    x, mask = args[0], args[1]
    device = _virtual_device(args)
    if device is None:
        return obs.run_op(func, args, kwargs)
    shape = torch.broadcast_shapes(tuple(x.shape), tuple(mask.shape))
    hmask = values.host_view(mask)
    with values.real_cpu():
        count = int(torch.count_nonzero(hmask.expand(shape)))
    out = torch.empty((count,), dtype=x.dtype, device=device)
    data = values.host_data(x) if values.is_virtual(x) else x
    with values.real_cpu():
        if data is not None and count <= values.DERIVED_SHADOW_MAX_NUMEL:
            values.set_shadow(out, torch.masked_select(data, hmask))
        else:
            values.set_value(out, values.value_of(x))
    if obs.active():
        obs._report(func, args, kwargs, out, _SYNC)
    return out


def _identity_sort(obs: Any, func: Any, args: tuple, kwargs: dict) -> Any:
    """sort of data phantora does not hold: its elements all read as one value, and a sort of
    equal keys leaves them in place (stable, as CUDA's radix sort of equal keys is), so the
    indices are 0, 1, 2, ... along the sorted dimension."""
    out = obs.run_op(func, args, kwargs)
    x = args[0]
    if not (obs.active() and values.is_virtual(x) and values.host_data(x) is None):
        return out
    indices = out[1]
    if not values.is_virtual(indices) or indices.numel() > values.DERIVED_SHADOW_MAX_NUMEL:
        return out
    dim = kwargs.get("dim", args[1] if func is aten.sort.default and len(args) > 1 else -1)
    shape = tuple(indices.shape)
    if not shape:
        return out
    d = dim % len(shape)
    with values.real_cpu():
        ramp = torch.arange(shape[d], dtype=indices.dtype).reshape([-1 if i == d else 1 for i in range(len(shape))])
        values.set_shadow(indices, ramp.expand(shape).contiguous())
    return out


def _grouped_mm(obs: Any, func: Any, args: tuple, kwargs: dict) -> Any:
    """torch._grouped_mm (F.grouped_mm). In bf16 one CUTLASS grouped kernel (phantora/cost/gemm.py
    times it from its offsets). In other dtypes CUDA takes its fallback (GroupedBlas.cpp
    _grouped_mm_fallback): the offsets are copied to the host (a sync) and each group is one mm
    into its slice of the output, which is what is reported here; FakeTensor's meta kernel
    refuses these dtypes outright."""
    from torch._meta_registrations import _create_grouped_mm_output_tensor

    a, b = args[0], args[1]
    offs = args[2] if len(args) > 2 else kwargs.get("offs")
    bias = args[3] if len(args) > 3 else kwargs.get("bias")
    out_dtype = args[4] if len(args) > 4 else kwargs.get("out_dtype")
    if (a.dtype == b.dtype == torch.bfloat16 and out_dtype in (None, torch.bfloat16)) or bias is not None \
            or _virtual_device((a, b)) is None:
        return obs.run_op(func, args, kwargs)
    out = _create_grouped_mm_output_tensor(a, b, offs, out_dtype)
    bounds: list[int] = []
    if offs is not None:
        obs.run_op(aten._to_copy.default, (offs,), {"device": torch.device("cpu")})  # offs.cpu(): waits
        with values.real_cpu():
            bounds = [int(x) for x in values.host_view(offs).tolist()]
    starts = [0, *bounds[:-1]]
    if a.dim() == 2 and b.dim() == 3:  # groups of a's rows
        for g, (lo, hi) in enumerate(zip(starts, bounds)):
            if hi > lo:
                obs.run_op(aten.mm.out, (a[lo:hi], b[g]), {"out": out[lo:hi]})
    elif a.dim() == 2 and b.dim() == 2:  # groups of the shared K: one [M, N] output each
        for g, (lo, hi) in enumerate(zip(starts, bounds)):
            obs.run_op(aten.mm.out, (a[:, lo:hi], b[lo:hi]), {"out": out[g]})
    elif a.dim() == 3 and b.dim() == 2:  # groups of b's columns
        for g, (lo, hi) in enumerate(zip(starts, bounds)):
            if hi > lo:
                obs.run_op(aten.mm.out, (a[g], b[:, lo:hi]), {"out": out[:, lo:hi]})
    else:
        obs.run_op(aten.bmm.out, (a, b), {"out": out})
    return out


def data_dependent_handlers() -> dict[Any, Any]:
    """Handlers the observer uses for these ops (observer.py _SPECIAL)."""
    handlers: dict[Any, Any] = {
        aten.nonzero.default: computed_on_host,
        aten.bincount.default: computed_on_host,
        aten.repeat_interleave.Tensor: _repeat_interleave,
        aten.masked_select.default: _masked_select,
        aten.index.Tensor: _index_with_masks,
        aten.sort.default: _identity_sort,
        aten.sort.stable: _identity_sort,
        aten._grouped_mm.default: _grouped_mm,
    }
    for name in ("_unique", "_unique2", "unique_dim", "unique_consecutive", "unique_dim_consecutive"):
        packet = getattr(aten, name, None)
        if packet is not None:
            handlers[packet.default] = computed_on_host
    for name in ("index_put", "index_put_", "_index_put_impl_", "_unsafe_index_put"):
        packet = getattr(aten, name, None)
        if packet is not None:
            handlers[packet.default] = _index_with_masks  # CUDA's index_put_ with a mask: nonzero first
    return handlers
