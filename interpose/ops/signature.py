"""Turn one live aten call (func, args, kwargs, result) into a phantora.ops.OpSignature.

This runs for every intercepted op, so it avoids pytree and other generic machinery: arguments
are walked by the op schema, once.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch._ops import HigherOrderOperator

from interpose.values import policy as values
from phantora.ops import FLOAT_PLACEHOLDER, OpSignature, TensorMeta

_DTYPE_NAMES: dict[torch.dtype, str] = {}


def dtype_name(dtype: torch.dtype) -> str:
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        name = _DTYPE_NAMES[dtype] = str(dtype).removeprefix("torch.")
    return name


def _never_pinned(t: torch.Tensor) -> bool:
    return False


def tensor_meta(t: torch.Tensor, is_pinned: Callable[[torch.Tensor], bool] = _never_pinned) -> TensorMeta:
    dev = t.device
    device = f"{dev.type}:{dev.index if dev.index is not None else 0}" if dev.type == "cuda" else dev.type
    pinned = dev.type == "cpu" and is_pinned(t)
    return TensorMeta(tuple(t.shape), dtype_name(t.dtype), tuple(t.stride()), device, pinned)


def _arg(a: Any, is_pinned: Callable[[torch.Tensor], bool]) -> Any:
    if isinstance(a, torch.Tensor):
        return tensor_meta(a, is_pinned)
    if isinstance(a, (list, tuple)):
        return tuple(_arg(x, is_pinned) for x in a)
    if isinstance(a, bool) or a is None or isinstance(a, (int, str)):
        return a
    if isinstance(a, float):
        return FLOAT_PLACEHOLDER
    if isinstance(a, (torch.dtype, torch.device, torch.layout, torch.memory_format)):
        return str(a).removeprefix("torch.")
    if isinstance(a, torch.SymInt):
        return int(a)
    return repr(type(a).__name__)


_SCHEMA_ARGS: dict[Any, tuple[tuple[str, ...], tuple[Any, ...]]] = {}


def _schema_of(func: Any) -> tuple[tuple[str, ...], tuple[Any, ...]]:
    cached = _SCHEMA_ARGS.get(func)
    if cached is None:
        names, defaults = [], []
        for a in func._schema.arguments:
            names.append(a.name)
            defaults.append(a.default_value if a.has_default_value() else None)
        cached = _SCHEMA_ARGS[func] = (tuple(names), tuple(defaults))
    return cached


_TAGS: dict[Any, frozenset[str]] = {}


def op_tags(func: Any) -> frozenset[str]:
    tags = _TAGS.get(func)
    if tags is None:
        tags = frozenset(str(t).removeprefix("Tag.") for t in getattr(func, "tags", ()))
        if getattr(func, "is_view", False):
            tags = tags | {"view"}
        _TAGS[func] = tags
    return tags


def positional_args(func: Any, args: tuple, kwargs: dict) -> list[Any]:
    """Arguments in schema order, keyword arguments placed where the schema puts them."""
    names, defaults = _schema_of(func)
    out = list(args)
    if len(out) < len(names):
        for i in range(len(out), len(names)):
            out.append(kwargs.get(names[i], defaults[i]))
    return out


# Arguments whose values decide an op's work (OpSignature.data), by qualified op name: a grouped
# GEMM's group offsets; varlen flash attention's cumulative sequence offsets (aten's, and
# FlashAttention 3's, interpose/device/flash_attn3.py).
_DATA_ARGS: dict[str, tuple[str, ...]] = {
    "aten::_grouped_mm": ("offs",),
    "aten::_scaled_grouped_mm": ("offs",),
    "aten::_scaled_grouped_mm_v2": ("offs",),
    "aten::_flash_attention_forward": ("cum_seq_q", "cum_seq_k"),
    "aten::_flash_attention_forward_no_dropout_inplace": ("cum_seq_q", "cum_seq_k"),
    "aten::_flash_attention_backward": ("cum_seq_q", "cum_seq_k"),
    "flash_attn_3::fwd": ("cu_seqlens_q", "cu_seqlens_k"),
    "flash_attn_3::bwd": ("cu_seqlens_q", "cu_seqlens_k"),
}
_data_arg_names: dict[Any, tuple[str, ...]] = {}


def _data_args(func: Any) -> tuple[str, ...]:
    names = _data_arg_names.get(func)
    if names is None:
        schema = getattr(func, "_schema", None)
        names = _data_arg_names[func] = _DATA_ARGS.get(schema.name, ()) if schema is not None else ()
    return names


def signature_data(func: Any, args: tuple, kwargs: dict) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """OpSignature.data for this call: the values of the arguments _DATA_ARGS names, as the
    program's data (interpose/values/policy.py) holds them. Empty for other ops; an argument
    that holds no data is left out."""
    wanted = _data_args(func)
    if not wanted:
        return ()
    names, _ = _schema_of(func)
    found = []
    for name in wanted:
        if name not in names:
            continue
        i = names.index(name)
        t = args[i] if i < len(args) else kwargs.get(name)
        if not isinstance(t, torch.Tensor):
            continue
        data = values.host_data(t)
        if data is None:
            continue
        with values.real_cpu():
            found.append((name, tuple(int(x) for x in data.reshape(-1).tolist())))
    return tuple(found)


def signature_of(
    func: Any,
    args: tuple,
    kwargs: dict,
    result: Any,
    is_pinned: Callable[[torch.Tensor], bool] = _never_pinned,
    extra_tags: frozenset[str] = frozenset(),
    data: tuple[tuple[str, tuple[int, ...]], ...] = (),
) -> OpSignature:
    """The signature of `func(*args, **kwargs)` that returned `result`."""
    if isinstance(func, HigherOrderOperator):
        # No schema: "higher_order::flex_attention", its arguments in call order (interpose/ops/hops.py
        # reduced functions, graphs and option dicts to plain values).
        schema_name, overload = f"higher_order::{func.name()}", "default"
        in_args = tuple(_arg(a, is_pinned) for a in (*args, *kwargs.values()))
    else:
        schema_name = func._schema.name  # "aten::mm"
        overload = func._overloadname
        in_args = tuple(_arg(a, is_pinned) for a in positional_args(func, args, kwargs))
    if isinstance(result, torch.Tensor):
        outs: tuple = (tensor_meta(result, is_pinned),)
    elif isinstance(result, (list, tuple)):
        flat: list = []
        for r in result:
            if isinstance(r, torch.Tensor):
                flat.append(tensor_meta(r, is_pinned))
            elif isinstance(r, (list, tuple)):
                flat.extend(tensor_meta(x, is_pinned) for x in r if isinstance(x, torch.Tensor))
            else:
                flat.append(None)
        outs = tuple(flat)
    else:
        outs = ()
    tags = op_tags(func)
    if any(isinstance(a, TensorMeta) and a.dtype == "float32" for a in in_args):
        tags = tags | _fp32_math_tags()
    return OpSignature(schema_name, overload, in_args, outs, tags | extra_tags, data)


def _fp32_math_tags() -> frozenset[str]:
    """The program's fp32 math settings where they differ from torch's defaults, read at the
    op's first call with this signature (phantora/cost/roofline.py: TF32_MATMUL_TAG,
    NO_TF32_CUDNN_TAG). A program that changes them between calls of the same shapes keeps the
    first setting for those shapes."""
    tags = set()
    if torch._C._get_cublas_allow_tf32():  # allow_tf32 / set_float32_matmul_precision("high")
        tags.add("tf32_matmul")
    if not torch._C._get_cudnn_allow_tf32():
        tags.add("no_tf32_cudnn")
    return frozenset(tags)
