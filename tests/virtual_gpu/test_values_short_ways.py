"""The value policy's short ways leave every tensor reading what its general path leaves:

* values.note_view, the observer's way through a view op (view, t, transpose, detach, unbind...)
  instead of note_result and note_shadow: the same value, shadow, exact fill and draw or mask,
  through the source and through every view, before and after a write through one of them;
* note_shadow's return where an input holds no data (_an_input_holds_nothing): the same state
  after ops of every kind (pointwise, matmul, reductions, in place, copies, fills, comparisons).

Sources in each state the general path knows (nothing, a value, an exact fill, a shadow, a draw, a
mask, dtypes), so that a test fails where a short way takes an op it should leave to the general
path or leaves a tensor another value or shadow."""

from __future__ import annotations

from typing import Any, Callable

import torch
import pytest
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode, unset_fake_temporarily
from torch.utils._python_dispatch import TorchDispatchMode

from interpose.values import policy as values

aten = torch.ops.aten


class _Mode(TorchDispatchMode):
    """The observer's value bookkeeping (interpose/ops/observer.py run_op), with or without note_view."""

    def __init__(self, short_way: bool) -> None:
        super().__init__()
        self.short_way = short_way
        self.taken: list[str] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if func is aten._local_scalar_dense.default and values.is_virtual(args[0]):
            return values.scalar_value(args[0])
        exact = values.exact_inputs(func, args, kwargs)
        out = func(*args, **kwargs)
        if self.short_way and values.note_view(func, args, out):
            self.taken.append(str(func))
            return out
        values.note_result(func, args, kwargs, out, exact)
        values.note_shadow(func, args, kwargs, out, lambda t: isinstance(t, FakeTensor), unset_fake_temporarily, exact)
        return out


def _forget_memory_value(t: torch.Tensor) -> torch.Tensor:
    t.untyped_storage().__dict__.pop(values._values.name, None)
    return t


# how the source tensor is made: each leaves a different state in values/policy.py
SOURCES: dict[str, Callable[[int, torch.dtype], torch.Tensor]] = {
    "nothing": lambda n, dt: torch.empty(n, n, dtype=dt),
    "computed value": lambda n, dt: torch.empty(n, n, dtype=dt).mul(3),
    # memory without a value whose tensor keeps a copy of one, as deepcopy (which copies
    # __dict__) and `.data =` (which swaps the storage) leave it
    "value kept by the tensor only": lambda n, dt: _forget_memory_value(torch.empty(n, n, dtype=dt).mul(3)),
    "exact fill": lambda n, dt: torch.full((n, n), 2, dtype=dt),
    "zero fill, then written": lambda n, dt: torch.zeros(n, n, dtype=dt).add_(torch.empty(n, n, dtype=dt)),
    "draw": lambda n, dt: torch.randn(n, n).to(dt) if dt.is_floating_point else torch.randint(0, 5, (n, n), dtype=dt),
    "mask": lambda n, dt: (torch.randn(n, n) > 0).to(dt),
    "initialised weight": lambda n, dt: torch.nn.init.normal_(torch.empty(n, n, dtype=dt), mean=0.5)
    if dt.is_floating_point else torch.empty(n, n, dtype=dt),
}
VIEWS: dict[str, Callable[[torch.Tensor], list[torch.Tensor]]] = {
    "view": lambda x: [x.view(-1)],
    "t": lambda x: [x.t()],
    "transpose": lambda x: [x.transpose(0, 1)],
    "detach": lambda x: [x.detach()],
    "unbind": lambda x: list(x.unbind(0)),
    "split": lambda x: list(x.split(1, 0)),
    "narrow": lambda x: [x.narrow(0, 0, 1)],
    "view as another dtype": lambda x: [x.view(torch.uint8)],
    "views of a view": lambda x: [x.detach().t().transpose(0, 1).view(-1)],
}
WRITES: dict[str, Callable[[torch.Tensor], Any]] = {
    "none": lambda v: None,
    "fill through a view": lambda v: v.fill_(5),
    "zero through a view": lambda v: v.zero_(),
    "copy into a view": lambda v: v.copy_(torch.empty_like(v)),
}


def _state(t: torch.Tensor) -> tuple:
    shadow = values.shadow_of(t)
    with unset_fake_temporarily():
        shadow_data = None if shadow is None else shadow.tolist()
    return (values.value_of(t), shadow_data, values._exact.get(t), repr(values._dists.get(t)),
            t.__dict__.get(values._values.name), t.untyped_storage().__dict__.get(values._values.name))


def _run(short_way: bool, source: str, dtype: torch.dtype, n: int, view: str, write: str) -> tuple[list, list[str]]:
    values._fallback_draws = 0  # a draw's seed off CUDA: a count of draws
    with FakeTensorMode(allow_non_fake_inputs=True), _Mode(short_way) as mode:
        x = SOURCES[source](n, dtype)
        views = VIEWS[view](x)
        before = [_state(t) for t in (x, *views)]
        WRITES[write](views[-1])
        after = [_state(t) for t in (x, *views)]
        reads = [t.float().amax().item() for t in (x, *views)]
    return [before, after, reads], mode.taken


DTYPES = st.sampled_from([torch.float32, torch.bfloat16, torch.int64, torch.bool])
FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FAST
@given(source=st.sampled_from(sorted(SOURCES)), dtype=DTYPES, n=st.sampled_from([4, 40]),
       view=st.sampled_from(sorted(VIEWS)), write=st.sampled_from(sorted(WRITES)))
def test_a_view_reads_as_the_general_path_leaves_it(source: str, dtype: torch.dtype, n: int, view: str,
                                                    write: str) -> None:
    """n 4: 16 elements, shadowed; n 40: 1,600, a value."""
    general, _ = _run(False, source, dtype, n, view, write)
    short, _ = _run(True, source, dtype, n, view, write)
    assert short == general


def test_the_short_way_is_taken_for_views_of_memory_holding_nothing_kept() -> None:
    """A view of a weight (a value, a draw), of an activation (nothing) or of a mask takes it; a
    view of a shadowed or exact tensor, or one that reinterprets the dtype, does not."""
    assert _run(True, "initialised weight", torch.float32, 40, "t", "none")[1] == ["aten.t.default"]
    assert _run(True, "nothing", torch.bfloat16, 40, "views of a view", "none")[1] == [
        "aten.detach.default", "aten.t.default", "aten.transpose.int", "aten.view.default"]
    assert _run(True, "exact fill", torch.float32, 40, "t", "none")[1] == []
    assert _run(True, "nothing", torch.float32, 4, "t", "none")[1] == []  # a small empty is shadowed (its default)
    assert _run(True, "mask", torch.bool, 40, "t", "none")[1] == ["aten.t.default"]  # made where read
    assert "aten.view.dtype" not in _run(True, "nothing", torch.float32, 40, "view as another dtype", "none")[1]


# ops after which note_shadow may take its short way (or must not: fills, in-place writes of
# shadowed memory, factories), each on a source and a second tensor of the same shape
OPS: dict[str, Callable[[torch.Tensor, torch.Tensor], Any]] = {
    "add": lambda x, y: x + y,
    "mul by a number": lambda x, y: x * 3,
    "matmul": lambda x, y: x.float() @ y.float(),
    "sum": lambda x, y: x.float().sum(),
    "amax": lambda x, y: x.float().amax(0),
    "add_ in place": lambda x, y: x.add_(y),
    "copy_ into": lambda x, y: y.copy_(x),
    "clone": lambda x, y: x.clone(),
    "to another dtype": lambda x, y: x.to(torch.float64),
    "zeros_like": lambda x, y: torch.zeros_like(x),
    "fill_": lambda x, y: x.fill_(3),
    "compare": lambda x, y: x > 0,
    "where": lambda x, y: torch.where(x > 0, x, y),
    "cat": lambda x, y: torch.cat([x, y]),
    "nonzero count": lambda x, y: (x != 0).sum(),
}


def _run_op(short_way: bool, source: str, other: str, dtype: torch.dtype, n: int, op: str,
            monkeypatch: pytest.MonkeyPatch) -> list:
    values._fallback_draws = 0
    with monkeypatch.context() as m:
        if not short_way:
            m.setattr(values, "_an_input_holds_nothing", lambda args, kwargs, exact: False)
        with FakeTensorMode(allow_non_fake_inputs=True), _Mode(False):
            x, y = SOURCES[source](n, dtype), SOURCES[other](n, dtype)
            # a source can change the dtype (bool * 3 is int64): an in-place add that torch refuses
            # on any device (bool += int64) is not a case of this test
            assume(op != "add_ in place" or torch.can_cast(torch.result_type(x, y), x.dtype))
            out = OPS[op](x, y)
            outs = [o for o in (out if isinstance(out, tuple) else (out,)) if isinstance(o, torch.Tensor)]
            return [_state(t) for t in (x, y, *outs)] + [o.float().amax().item() for o in (x, y, *outs)]


@FAST
@given(source=st.sampled_from(sorted(SOURCES)), other=st.sampled_from(sorted(SOURCES)), dtype=DTYPES,
       n=st.sampled_from([4, 40]), op=st.sampled_from(sorted(OPS)))
@example(source="mask", other="computed value", dtype=torch.bool, n=4, op="add_ in place")  # bool += int64
def test_an_op_reads_as_the_general_path_leaves_it(source: str, other: str, dtype: torch.dtype, n: int,
                                                    op: str) -> None:
    with pytest.MonkeyPatch.context() as monkeypatch:
        general = _run_op(False, source, other, dtype, n, op, monkeypatch)
        short = _run_op(True, source, other, dtype, n, op, monkeypatch)
    assert short == general
