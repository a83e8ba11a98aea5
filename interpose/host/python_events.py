"""Python-level events of the user's training code that cost host time on a real machine.

The simulator charges host time per op (phantora/cost/host.py), but eager training code spends
much of its host time around the ops: nn.Module.__call__, torch.utils.checkpoint, the autograd
engine, the optimizer's bookkeeping. This module tells the simulator about those, through
op flags (op_flags) and R_HOST records; it measures nothing itself.

It observes and never replaces: Dynamo recognises torch functions by identity (it turns
torch.utils.checkpoint.checkpoint into its checkpoint operator only if the object it meets *is*
that function), so a wrapper around one breaks torch.compile. Module and optimizer calls are seen
through torch's global hooks; checkpoint regions from the state torch itself keeps while one runs
(CheckpointRegions).
"""

from __future__ import annotations

import functools
import sys
import threading
import weakref
from typing import Any

import torch

from phantora import protocol as P


class ThreadFlags(threading.local):
    """Per-thread state read at every op: defaults on the class, as getattr(local, name, default)
    costs an AttributeError raised and caught in every thread that never set it."""

    depth = 0
    active = False
    python_ns = None


_modules = ThreadFlags()  # .depth: nn.Module forwards running on this thread
beside = ThreadFlags()  # .active: this thread runs beside the training loop (data_loading.py's pin-memory thread)


def beside_flag() -> int:
    """OP_BESIDE when the op being dispatched runs beside the training loop, else 0."""
    return P.OP_BESIDE if beside.active else 0


def op_flags(args: tuple, in_optimizer: bool) -> int:
    """Context of the op being dispatched now (called from inside __torch_dispatch__)."""
    if in_optimizer:
        return P.OP_IN_OPTIMIZER
    if torch._C._current_autograd_node() is not None:
        return P.OP_BACKWARD
    flags = P.OP_IN_MODULE if _modules.depth > 0 else 0
    if torch.is_grad_enabled():
        for a in args:
            if isinstance(a, torch.Tensor) and a.requires_grad:
                return flags | P.OP_RECORDS_GRAD
    return flags


class CheckpointRegions:
    """Tells when the op being dispatched is the first of a torch.utils.checkpoint region, in
    forward or in its recomputation during backward: each costs the region's Python once
    (phantora/cost/host.py checkpoint_region_ns).

    A region is recognised by what torch sets up while it runs, looked at per op:
      - use_reentrant=False: the saved-tensor hooks on top of autograd's stack are a
        `_checkpoint_hook`'s (forward) or a `_recomputation_hook`'s (recomputation); each region
        and each recomputation installs new ones;
      - use_reentrant=True: forward runs inside CheckpointFunction.forward with grad disabled
        (found on the Python stack; its `ctx` names the region), recomputation inside the
        CheckpointFunctionBackward node autograd is running.
    Only a weak reference to the last region's marker is kept, so no tensor lives longer."""

    _STACK_LIMIT = 64  # frames between an op's dispatch and CheckpointFunction.forward, at most

    def __init__(self) -> None:
        import torch.utils.checkpoint as ckpt

        self._reentrant_forward = ckpt.CheckpointFunction.forward.__code__
        self._last: weakref.ref | None = None

    def entered(self) -> bool:
        """Whether the op being dispatched now opens a region not seen before."""
        if torch.compiler.is_compiling():
            return False  # compiled code has no Python region to charge
        marker = self._marker()
        if marker is None or (self._last is not None and self._last() is marker):
            return False
        self._last = weakref.ref(marker)
        return True

    def _marker(self) -> Any:
        hooks = torch._C._autograd._top_saved_tensors_default_hooks(True)
        if hooks is not None:
            pack = hooks[0]
            name = getattr(pack, "__wrapped__", pack).__qualname__  # torch._dynamo.disable wraps one
            return pack if name.startswith(("_checkpoint_hook.", "_recomputation_hook.")) else None
        node = torch._C._current_autograd_node()
        if node is not None:
            return node if node.name() == "CheckpointFunctionBackward" else None
        if torch.is_grad_enabled():
            return None
        frame = sys._getframe(1)
        for _ in range(self._STACK_LIMIT):
            if frame is None:
                return None
            if frame.f_code is self._reentrant_forward:
                return frame.f_locals.get("ctx")
            frame = frame.f_back
        return None


_checkpoint_regions: CheckpointRegions | None = None  # made by install_python_events


def opens_checkpoint_region() -> bool:
    """Whether the GPU op being dispatched now is the first of a checkpoint region (called from
    inside __torch_dispatch__, before the op is recorded)."""
    return _checkpoint_regions is not None and _checkpoint_regions.entered()


def install_python_events(rt: Any) -> None:
    global _checkpoint_regions
    _checkpoint_regions = CheckpointRegions()

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
        _modules.depth += 1
        record("module_call", 1)

    def module_post_hook(module: Any, args: Any, output: Any) -> None:
        if torch.compiler.is_compiling():
            return
        _modules.depth = max(0, _modules.depth - 1)

    if rt.python_time.mode == "modelled":
        # Only the modelled host charges module calls. Global hooks send every module call down
        # nn.Module's slow path (its `inner`, ~450 instructions a call): counted or measured, that
        # would be phantora's Python charged as the program's.
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
    nested: set[int] = set()  # id() of the optimizers stepped inside the outermost step under way

    def optimizer_post_hook(optimizer: Any, args: Any, kwargs: Any) -> None:
        rt.in_optimizer -= 1
        if rt.in_optimizer:
            nested.add(id(optimizer))
            return  # stepped inside another optimizer's step (TorchTitan's OptimizersContainer
            # is an Optimizer whose step steps one per model part): the outer one marks the step
        # Scripts with several optimizers (one per parameter set, or per pipeline stage) step
        # each once per training step: the first one to step marks the steps. A container that
        # steps the one chosen takes its place: a checkpoint load steps the inner optimizers
        # alone first (torch.distributed.checkpoint makes AdamW's state with one zero step).
        if not stepping:
            stepping.append(id(optimizer))
        elif stepping[0] in nested:
            stepping[0] = id(optimizer)
        nested.clear()
        if stepping[0] == id(optimizer) and rt.active and rt.client.connected and rt.model_work_since_step:
            # A second step with no model work since the last (DeepSpeed ZeRO-1/2 steps its
            # optimizer once per parameter group: MoE experts are a group of their own) belongs
            # to the same training step: one mark per training step.
            rt.model_work_since_step = False
            rt.client.record([P.R_STEP])

    from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

    register_optimizer_step_pre_hook(optimizer_pre_hook)
    register_optimizer_step_post_hook(optimizer_post_hook)


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
