"""Custom ops defined in Python (`torch.library.custom_op`), run as their own implementation.

A framework's custom op (TorchTitan's `torchtitan::deterministic_scatter_add`, a user's op) is
one opaque call to the dispatcher, and FakeTensorMode answers it with the op's fake kernel
(output shapes only). On a GPU its implementation runs: the aten ops inside it are what the GPU
executes. phantora has no cost model for a framework's op name, so the observer runs the
implementation instead (the CUDA one if the op registered one, else its default), with the
observer active inside, and each aten op it calls is timed as any other. Ops phantora models
by their qualified name (phantora/cost/families.py QUALIFIED_FAMILIES) stay whole.
"""

from __future__ import annotations

from typing import Any, Callable

from phantora.cost.families import QUALIFIED_FAMILIES

_impls: dict[Any, Callable[..., Any] | None] = {}


def python_implementation(func: Any) -> Callable[..., Any] | None:
    """The Python function a custom op runs on a CUDA tensor, or None (not a custom op, or one
    phantora times by name)."""
    try:
        return _impls[func]
    except KeyError:
        pass
    impl = None
    namespace = getattr(func, "namespace", "aten")
    if namespace not in ("aten", "prims", "prim", "c10d", "_c10d_functional", "_dtensor", "profiler"):
        from torch._library.custom_ops import OPDEFS

        qualified = f"{namespace}::{func._schema.name.split('::', 1)[-1]}"
        opdef = OPDEFS.get(qualified) if qualified not in QUALIFIED_FAMILIES else None
        if opdef is not None:
            impl = opdef._backend_fns.get("cuda") or opdef._init_fn
    _impls[func] = impl
    return impl


def run_implementation(obs: Any, impl: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
    """The custom op's implementation, its aten ops observed (the observer is popped while it
    answers an op; it is pushed again for the body, as for a higher-order op's kernel)."""
    with obs:
        return impl(*args, **kwargs)
