"""Python-level events of the user's training code that cost host time on a real machine.

The simulator charges host time per op (phantora/cost/host.py), but eager training code spends
much of its host time around the ops: nn.Module.__call__, torch.utils.checkpoint, the autograd
engine, the optimizer's bookkeeping. This module tells the simulator about those, through
op flags (op_flags) and R_HOST records; it measures nothing itself.
"""

from __future__ import annotations

import functools
import threading
from typing import Any

import torch

from phantora import protocol as P


_modules = threading.local()  # .depth: nn.Module forwards running on this thread


def op_flags(args: tuple, in_optimizer: bool) -> int:
    """Context of the op being dispatched now (called from inside __torch_dispatch__)."""
    if in_optimizer:
        return P.OP_IN_OPTIMIZER
    if torch._C._current_autograd_node() is not None:
        return P.OP_BACKWARD
    flags = P.OP_IN_MODULE if getattr(_modules, "depth", 0) > 0 else 0
    if torch.is_grad_enabled():
        for a in args:
            if isinstance(a, torch.Tensor) and a.requires_grad:
                return flags | P.OP_RECORDS_GRAD
    return flags


def install_python_events(rt: Any) -> None:
    def record(kind: str, count: int) -> None:
        # Only for a process that already is a rank: a module call before the first GPU op
        # must not make a DataLoader worker or launcher agent connect.
        if rt.active and rt.client.connected:
            rt.client.record([P.R_HOST, kind, count])

    def module_pre_hook(module: Any, args: Any) -> None:
        # Dynamo traces the hooks of the modules it compiles: they trace to nothing, as the
        # compiled code has no module calls to charge.
        if torch.compiler.is_compiling():
            return
        _modules.depth = getattr(_modules, "depth", 0) + 1
        record("module_call", 1)

    def module_post_hook(module: Any, args: Any, output: Any) -> None:
        if torch.compiler.is_compiling():
            return
        _modules.depth = max(0, getattr(_modules, "depth", 0) - 1)

    modules = torch.nn.modules.module
    own = (modules.register_module_forward_pre_hook(module_pre_hook),
           modules.register_module_forward_hook(module_post_hook, always_call=True))
    _hide_own_global_hooks(modules, own)

    def outside_optimizer(closure: Any) -> Any:
        # optimizer.step(closure) runs the closure (Lightning's forward and backward, LBFGS's
        # re-evaluation) inside the step: its ops are model code, charged as such, not as the
        # optimizer's own ops (whose Python is charged per step and parameter).
        @functools.wraps(closure)
        def run(*a: Any, **k: Any) -> Any:
            depth = rt.in_optimizer
            rt.in_optimizer = depth - 1
            try:
                return closure(*a, **k)
            finally:
                rt.in_optimizer = depth

        return run

    def optimizer_pre_hook(optimizer: Any, args: Any, kwargs: Any) -> tuple[tuple, dict] | None:
        rt.in_optimizer += 1
        record("optimizer_step", sum(len(g["params"]) for g in optimizer.param_groups))
        if callable(kwargs.get("closure")):
            return args, {**kwargs, "closure": outside_optimizer(kwargs["closure"])}
        if len(args) > 1 and callable(args[1]):  # args[0] is the optimizer itself
            return (args[0], outside_optimizer(args[1]), *args[2:]), kwargs
        return None

    stepping: list[int] = []  # id() of the optimizer whose steps mark training steps

    def optimizer_post_hook(optimizer: Any, args: Any, kwargs: Any) -> None:
        rt.in_optimizer -= 1
        if rt.in_optimizer:
            return  # stepped inside another optimizer's step (TorchTitan's OptimizersContainer
            # is an Optimizer whose step steps one per model part): the outer one marks the step
        # Scripts with several optimizers (one per parameter set, or per pipeline stage) step
        # each once per training step: the first one to step marks the steps.
        if not stepping:
            stepping.append(id(optimizer))
        if stepping[0] == id(optimizer) and rt.active and rt.client.connected and rt.model_work_since_step:
            # A second step with no model work since the last (DeepSpeed ZeRO-1/2 steps its
            # optimizer once per parameter group: MoE experts are a group of their own) belongs
            # to the same training step: one mark per training step.
            rt.model_work_since_step = False
            rt.client.record([P.R_STEP])

    from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

    register_optimizer_step_pre_hook(optimizer_pre_hook)
    register_optimizer_step_post_hook(optimizer_post_hook)

    import torch.utils.checkpoint as ckpt

    original = ckpt.checkpoint

    @functools.wraps(original)
    def checkpoint(function: Any, *args: Any, **kwargs: Any) -> Any:
        if torch.compiler.is_compiling():  # compiled code has no Python region to charge
            return original(function, *args, **kwargs)
        record("checkpoint", 1)
        out = original(function, *args, **kwargs)
        # The region's Python runs again when backward recomputes it: charge it when the
        # gradient reaches the region's output.
        first = out if isinstance(out, torch.Tensor) else next(
            (t for t in (out if isinstance(out, (tuple, list)) else ()) if isinstance(t, torch.Tensor)), None)
        if first is not None and first.requires_grad:
            first.register_hook(lambda grad: record("checkpoint", 1))
        return out

    ckpt.checkpoint = checkpoint


def _hide_own_global_hooks(modules: Any, own: tuple) -> None:
    """torch.compile(module) warns that global module hooks fire an extra time when any are
    registered (torch.nn.modules.module._has_any_global_hook): phantora's own are left out of
    that question, so the warning appears when the user's program registers one, as on a GPU."""
    original = modules._has_any_global_hook
    ids = {h.id for h in own}

    def _has_any_global_hook() -> bool:
        user_pre = any(k not in ids for k in modules._global_forward_pre_hooks)
        user_post = any(k not in ids for k in modules._global_forward_hooks)
        return bool(user_pre or user_post or modules._global_backward_pre_hooks or modules._global_backward_hooks
                    or modules._global_forward_hooks_with_kwargs
                    or any(k not in ids for k in modules._global_forward_hooks_always_called))

    _has_any_global_hook.__doc__ = original.__doc__
    modules._has_any_global_hook = _has_any_global_hook
