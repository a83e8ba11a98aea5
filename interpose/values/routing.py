"""Routing decisions over data phantora does not hold: top-k and argmax (docs/moe.md).

A router picks experts with `topk(scores, k)` (or `argmax`, for top-1) over scores computed
on the GPU. On a virtual GPU the scores hold no data; every element reads as one value, and a
top-k of equal values would send every token to the same k experts. The indices such an op
returns come from the routing model instead (phantora/routing.py; balanced by default), and are
held as the indices' shadow, so everything the program derives from them (one_hot masks, counts
by histc or bincount, sorts, `torch.where(mask)`, split sizes read with .tolist()) agrees.

A MoE layer is a router module: the innermost nn.Module whose code made the call (outside any
module, the call's source line). Layers are numbered in the order they first route. Each layer's
per-expert counts go to the simulator (R_ROUTING) for the trace and the summary, when they change.
A second decision over the same experts in the same module (DeepSpeed's top-2 gating: an argmax,
then an argmax with the first choice masked) picks experts shifted by one, so that a token's
choices differ, as they do on real data.
"""

from __future__ import annotations

import os
import sys
import weakref
from typing import Any, Callable

import numpy as np
import torch

from interpose.values import policy as values
from phantora import protocol as P
from phantora.routing import ENV, ExpertCountMismatch, RoutingModel, assign_experts, expert_counts, parse_routing

aten = torch.ops.aten

_model: RoutingModel | None = None


def routing_model() -> RoutingModel:
    """The run's routing model (`phantora trace --routing`, passed in PHANTORA_ROUTING)."""
    global _model
    if _model is None:
        _model = parse_routing(os.environ.get(ENV, "balanced"))
    return _model


class _Layers:
    """MoE layers, numbered in the order their routers first ran."""

    def __init__(self) -> None:
        self.by_module: weakref.WeakKeyDictionary[torch.nn.Module, int] = weakref.WeakKeyDictionary()
        self.by_line: dict[tuple[str, int], int] = {}
        self.labels: list[str] = []
        self.decisions: dict[int, list[tuple[int, str, int]]] = {}  # layer -> its (experts, file, line)
        self.sent: dict[tuple[int, int, int], tuple[int, ...]] = {}  # (layer, sub, experts) -> counts

    def site(self, experts: int) -> tuple[int, int, str]:
        """(layer, sub, label) of the routing call being made now: sub counts the earlier call
        lines of this layer that decide over as many experts."""
        frame = sys._getframe(2)
        module, call, where = None, None, None
        while frame is not None:
            code = frame.f_code
            if not _internal(code.co_filename):
                if call is None:  # the line that made the call
                    call = (code.co_filename, frame.f_lineno)
                # a method's first argument (self, by any name) that is a module
                owner = frame.f_locals.get(code.co_varnames[0]) if code.co_argcount else None
                if isinstance(owner, torch.nn.Module):
                    module, where = owner, (code.co_filename, frame.f_lineno)
                    break
            frame = frame.f_back
        call = call or ("<unknown>", 0)
        if module is not None:
            layer = self.by_module.get(module)
            if layer is None:
                layer = self.by_module[module] = self._new(f"{type(module).__name__} ({_short(where or call)})")
        else:
            layer = self.by_line.get(call)
            if layer is None:
                layer = self.by_line[call] = self._new(_short(call))
        seen = self.decisions.setdefault(layer, [])
        mine = (experts, *call)
        if mine not in seen:
            seen.append(mine)
        sub = [d for d in seen if d[0] == experts].index(mine)
        return layer, sub, self.labels[layer]

    def _new(self, label: str) -> int:
        self.labels.append(label)
        return len(self.labels) - 1


_layers = _Layers()


def _internal(filename: str) -> bool:
    return f"{os.sep}torch{os.sep}" in filename or f"{os.sep}interpose{os.sep}" in filename


def _short(where: tuple[str, int]) -> str:
    return f"{os.path.basename(where[0])}:{where[1]}"


# Decisions over more choices than this are balanced and not reported: an argmax over a
# vocabulary (a metric, a sampler) is not a MoE layer, and routers choose among at most a few
# hundred experts.
REPORTED_EXPERTS_MAX = 4096


def decide(obs: Any, x: torch.Tensor, k: int, dim: int | None) -> tuple[torch.Tensor, Callable[[], None]] | None:
    """The routing model's experts for a top-k (k) or argmax (k = 1) over x's dimension `dim`
    (None: over all elements): a CPU int64 tensor of x's shape with `dim` of size k, and the
    report of the decision to the simulator, to call once the result holds it. None where no
    decision is modelled (no experts, too many tokens to hold)."""
    shape = tuple(x.shape)
    if dim is None:  # argmax over all elements: one decision among numel
        shape, dim = (max(x.numel(), 1),), 0
    if not shape:
        return None
    dim %= len(shape)
    experts = shape[dim]
    tokens = x.numel() // experts if experts else 0
    if experts == 0 or tokens * k > values.DERIVED_SHADOW_MAX_NUMEL:
        return None
    if experts > REPORTED_EXPERTS_MAX:  # not a MoE router: balanced, no layer, not reported
        layer, sub, label, model = -1, 0, "", RoutingModel()
    else:
        layer, sub, label = _layers.site(experts)
        model = routing_model()
    try:
        fractions = model.fractions(layer, experts)
    except ExpertCountMismatch as e:
        fractions = RoutingModel().fractions(layer, experts)
        _warn(obs, f"{e} ({label}); that decision is balanced")
    counts = expert_counts(fractions, tokens, k)
    table = assign_experts(counts, tokens, k)  # [tokens, k], tokens in the order of x's other dims
    if sub:
        table = (table + sub) % experts
        counts = np.roll(counts, sub)
    rest = shape[:dim] + shape[dim + 1:]
    with values.real_cpu():
        t = torch.from_numpy(table).reshape(*rest, k).movedim(-1, dim)
    return t, lambda: _send(obs, layer, sub, label, experts, k, counts)


def _route(obs: Any, x: torch.Tensor, k: int, dim: int | None, indices: torch.Tensor, keepdim: bool) -> None:
    """Give `indices`, the result of a top-k (k) or argmax (k = 1) over x's dimension `dim`, the
    routing model's experts."""
    decided = decide(obs, x, k, dim)
    if decided is None:
        return
    t, report = decided
    dim = 0 if dim is None else dim % x.dim()
    with values.real_cpu():
        if tuple(indices.shape) != tuple(t.shape):  # argmax without keepdim: no k dimension
            t = t.squeeze(dim) if not keepdim else t
        if tuple(indices.shape) != tuple(t.shape):
            return
        values.set_shadow(indices, t.to(indices.dtype).contiguous())
    report()


def _record(obs: Any, rec: list[Any]) -> None:
    rt = obs.rt
    if rt.client.connected:
        with rt.lock:
            rt.client.record(rec)


def _warn(obs: Any, text: str) -> None:
    _record(obs, [P.R_WARN, text])


def _send(obs: Any, layer: int, sub: int, label: str, experts: int, k: int, counts: np.ndarray) -> None:
    """The layer's counts to the simulator, when they differ from what it was sent last."""
    if layer < 0:
        return
    key = (layer, sub, experts)
    c = tuple(int(x) for x in counts)
    if _layers.sent.get(key) != c:
        _layers.sent[key] = c
        _record(obs, [P.R_ROUTING, layer, sub, label, experts, k, list(c)])


def unheld(obs: Any, x: Any) -> bool:
    """A routing decision is modelled where the scores are on a virtual GPU without data."""
    return obs.active() and isinstance(x, torch.Tensor) and values.is_virtual(x) and values.host_data(x) is None


def _topk(obs: Any, func: Any, args: tuple, kwargs: dict) -> Any:
    out = obs.run_op(func, args, kwargs)
    x = args[0]
    if unheld(obs, x):
        k = int(args[1] if len(args) > 1 else kwargs["k"])
        dim = int(args[2] if len(args) > 2 else kwargs.get("dim", -1))
        _route(obs, x, k, dim, out[1], keepdim=True)
    return out


def _argmax(obs: Any, func: Any, args: tuple, kwargs: dict) -> Any:
    out = obs.run_op(func, args, kwargs)
    x = args[0]
    if unheld(obs, x):
        dim = args[1] if len(args) > 1 else kwargs.get("dim")
        keepdim = bool(args[2] if len(args) > 2 else kwargs.get("keepdim", False))
        _route(obs, x, 1, None if dim is None else int(dim), out, keepdim)
    return out


def routing_handlers() -> dict[Any, Any]:
    """Handlers the observer uses for these ops (observer.py _SPECIAL). max(dim)/min(dim) are
    not routers' ops (losses take the row maximum for stability): their indices keep the value."""
    return {aten.topk.default: _topk, aten.argmax.default: _argmax}
