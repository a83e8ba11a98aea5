"""What a script reads when it asks a virtual GPU for a value (.item(), float(t), bool(t), .tolist()).

Tensors on virtual GPUs hold no data, so a read gets a placeholder chosen to keep a healthy
training loop on its normal path: numbers read as 1 (never 0, so `x / n` does not raise),
booleans as False, except results of isfinite (True) and of isnan/isinf (False) and
what is derived from them by not/any/all/copies. This is documented in the README; the values
a script prints are placeholders, only its timings are predictions.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch

aten = torch.ops.aten

class _IdentityHints:
    """Tensor -> bool by identity. (WeakKeyDictionary compares keys with ==, which on tensors is
    an elementwise op whose truth value is itself a data read.)"""

    def __init__(self) -> None:
        self._hints: dict[int, tuple[weakref.ref, bool]] = {}

    def __setitem__(self, t: torch.Tensor, value: bool) -> None:
        key = id(t)
        self._hints[key] = (weakref.ref(t, lambda _r, key=key: self._hints.pop(key, None)), value)

    def get(self, t: torch.Tensor, default: bool | None = None) -> bool | None:
        entry = self._hints.get(id(t))
        if entry is None or entry[0]() is not t:
            return default
        return entry[1]


_bool_hints = _IdentityHints()

_TRUE_SOURCES = {aten.isfinite.default}
_FALSE_SOURCES = {aten.isnan.default, aten.isinf.default, aten.isposinf.default, aten.isneginf.default}
_NEGATE = {aten.logical_not.default, aten.bitwise_not.default}
_KEEP = {aten.any.default, aten.any.dim, aten.all.default, aten.all.dim, aten.clone.default,
         aten._to_copy.default, aten.view.default, aten.squeeze.default, aten.detach.default,
         aten.alias.default, aten.select.int, aten.reshape.default, aten.expand.default,
         aten.lift_fresh.default, aten.min.default, aten.max.default}


def note_result(func: Any, args: tuple, out: Any) -> None:
    """Remember what a boolean result would be on a healthy run, where we can tell."""
    if not isinstance(out, torch.Tensor) or out.dtype is not torch.bool:
        return
    if func in _TRUE_SOURCES:
        _bool_hints[out] = True
    elif func in _FALSE_SOURCES:
        _bool_hints[out] = False
    elif (func in _NEGATE or func in _KEEP) and args and isinstance(args[0], torch.Tensor):
        hint = _bool_hints.get(args[0])
        if hint is not None:
            _bool_hints[out] = (not hint) if func in _NEGATE else hint


def _hinting_isfinite(original: Any) -> Any:
    # torch.isfinite decomposes (abs, ne, eq, mul) before dispatch, so it is tagged here.
    def isfinite(t: torch.Tensor) -> torch.Tensor:
        out = original(t)
        if isinstance(out, torch.Tensor):
            _bool_hints[out] = True
        return out

    return isfinite


def install_value_hints() -> None:
    torch.isfinite = _hinting_isfinite(torch.isfinite)
    torch.Tensor.isfinite = _hinting_isfinite(torch.Tensor.isfinite)  # type: ignore[method-assign]


def scalar_value(t: torch.Tensor) -> bool | int | float | complex:
    if t.dtype is torch.bool:
        return _bool_hints.get(t, False)
    if t.dtype.is_complex:
        return complex(1.0)
    if t.dtype.is_floating_point:
        return 1.0
    return 1


def tolist_value(t: torch.Tensor) -> Any:
    v = scalar_value(t)
    shape = tuple(t.shape)
    if not shape:
        return v

    def build(dims: tuple[int, ...]) -> Any:
        if len(dims) == 1:
            return [v] * dims[0]
        return [build(dims[1:]) for _ in range(dims[0])]

    return build(shape)
