"""What a script reads when it asks a virtual GPU for a value (.item(), float(t), bool(t), .tolist()).

Tensors on virtual GPUs hold no data, so a read gets a placeholder chosen to keep a healthy
training loop on its normal path: numbers read as 1 (never 0, so `x / n` does not raise),
booleans as False, except results of isfinite (True) and of isnan/isinf (False) and
what is derived from them by not/any/all/copies, and GradScaler's found_inf (0: no inf/NaN
gradients). This is documented in the README; the values
a script prints are placeholders, only its timings are predictions.

Small integer and boolean tensors on virtual GPUs are the exception: scripts steer by them
(pipelining's stage vote, step counters, flags exchanged between ranks), so each keeps a real
CPU "shadow" while every input it is computed from has one. Views of a shadowed tensor shadow
views of its shadow, so in-place writes through a view reach the base. interpose/distributed.py
carries shadows across send/recv, broadcast and all_reduce.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
from torch._subclasses.fake_tensor import unset_fake_temporarily

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
# Float tensors that read as 0 on a healthy run (they are counters of things going wrong).
_zero_hints = _IdentityHints()


class _IdentityShadows:
    """Tensor on a virtual GPU -> its real CPU shadow, by identity (see _IdentityHints)."""

    def __init__(self) -> None:
        self._shadows: dict[int, tuple[weakref.ref, torch.Tensor]] = {}

    def set(self, t: torch.Tensor, shadow: torch.Tensor) -> None:
        key = id(t)
        self._shadows[key] = (weakref.ref(t, lambda _r, key=key: self._shadows.pop(key, None)), shadow)

    def get(self, t: torch.Tensor) -> torch.Tensor | None:
        entry = self._shadows.get(id(t))
        if entry is None or entry[0]() is not t:
            return None
        return entry[1]

    def drop(self, t: torch.Tensor) -> None:
        entry = self._shadows.get(id(t))
        if entry is not None and entry[0]() is t:
            del self._shadows[id(t)]


SHADOW_MAX_NUMEL = 64  # larger integer tensors (token ids, indices) are data, not control
_shadows = _IdentityShadows()


class _NoShadow(Exception):
    pass


def shadowable(t: Any) -> bool:
    """A small integer or boolean tensor on a virtual GPU: one that keeps a real shadow."""
    return (isinstance(t, torch.Tensor) and not t.dtype.is_floating_point and not t.dtype.is_complex
            and t.device.type == "cuda" and t.numel() <= SHADOW_MAX_NUMEL)


def shadow_of(t: torch.Tensor) -> torch.Tensor | None:
    return _shadows.get(t)


def set_shadow(t: torch.Tensor, shadow: torch.Tensor | None) -> None:
    if shadow is None:
        _shadows.drop(t)
    else:
        _shadows.set(t, shadow)


def _on_cpu(a: Any, is_fake: Any) -> Any:
    if isinstance(a, torch.Tensor):
        if not is_fake(a):
            if a.device.type != "cpu":
                raise _NoShadow
            return a
        s = _shadows.get(a)
        if s is None:
            raise _NoShadow
        return s
    if isinstance(a, torch.device):
        return torch.device("cpu") if a.type == "cuda" else a
    if isinstance(a, (list, tuple)):
        return type(a)(_on_cpu(x, is_fake) for x in a)
    if isinstance(a, str) and a.startswith("cuda"):
        return "cpu"
    return a


def note_shadow(func: Any, args: tuple, kwargs: dict, out: Any, is_fake: Any, real_mode: Any) -> None:
    """Give small integer/bool results on a virtual GPU their real values, computed on the CPU
    shadows of the inputs; forget stale ones when that is not possible. `real_mode` is a
    context manager under which ops compute for real (the observer's unset_fake_temporarily).
    Several outputs (unbind: iterating over a tensor) are shadowed one by one."""
    outs = out if isinstance(out, (tuple, list)) else (out,)
    if not any(shadowable(o) for o in outs):
        return
    try:
        cargs, ckwargs = _on_cpu(args, is_fake), {k: _on_cpu(v, is_fake) for k, v in kwargs.items()}
        if "pin_memory" in ckwargs:
            ckwargs["pin_memory"] = False
        with real_mode():
            res = func(*cargs, **ckwargs)
    except Exception:  # no shadow for an input, or an op the CPU does not run: value unknown
        res = None
    results = res if isinstance(res, (tuple, list)) else (res,)
    for i, o in enumerate(outs):
        if not shadowable(o):
            continue
        r = results[i] if i < len(results) else None
        if isinstance(r, torch.Tensor) and r.shape == o.shape:
            _shadows.set(o, r)
        else:
            _shadows.drop(o)


def host_copy(func: Any, args: tuple, kwargs: dict, out: Any, real_mode: Any) -> Any:
    """A copy to the host (`.cpu()`, `.to("cpu")`) of a virtual-GPU tensor that keeps a shadow
    reads the shadow, as a GPU's copy reads its memory: the result is a real CPU tensor. (The
    CUDA RNG state that DTensor moves to the GPU and back, for one, must come back as data.)"""
    if func is not aten._to_copy.default or not isinstance(out, torch.Tensor) or out.device.type != "cpu":
        return out
    shadow = _shadows.get(args[0]) if isinstance(args[0], torch.Tensor) else None
    if shadow is None:
        return out
    ckwargs = {k: v for k, v in kwargs.items() if k != "pin_memory"}
    ckwargs["device"] = torch.device("cpu")
    with real_mode():
        return func(shadow, *args[1:], **ckwargs)


_TRUE_SOURCES = {aten.isfinite.default}
_FALSE_SOURCES = {aten.isnan.default, aten.isinf.default, aten.isposinf.default, aten.isneginf.default}
_NEGATE = {aten.logical_not.default, aten.bitwise_not.default}
_KEEP = {aten.any.default, aten.any.dim, aten.all.default, aten.all.dim, aten.clone.default,
         aten._to_copy.default, aten.view.default, aten.squeeze.default, aten.detach.default,
         aten.alias.default, aten.select.int, aten.reshape.default, aten.expand.default,
         aten.lift_fresh.default, aten.min.default, aten.max.default}


def note_result(func: Any, args: tuple, out: Any) -> None:
    """Remember what a boolean result would be on a healthy run, where we can tell."""
    if func is aten._amp_foreach_non_finite_check_and_unscale_.default:
        # GradScaler's found_inf (written in place): no inf/NaN gradient on a healthy run. Read as
        # the usual placeholder 1, it made GradScaler skip every optimizer step (fp16 AMP).
        if len(args) > 1 and isinstance(args[1], torch.Tensor):
            _zero_hints[args[1]] = True
        return
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
    shadow = _shadows.get(t)
    if shadow is not None and shadow.numel() == 1:
        with unset_fake_temporarily():
            return shadow.item()
    if t.dtype is torch.bool:
        return _bool_hints.get(t, False)
    if _zero_hints.get(t, False):
        return 0.0 if t.dtype.is_floating_point else 0
    if t.dtype.is_complex:
        return complex(1.0)
    if t.dtype.is_floating_point:
        return 1.0
    return 1


def tolist_value(t: torch.Tensor) -> Any:
    shadow = _shadows.get(t)
    if shadow is not None:
        with unset_fake_temporarily():
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
