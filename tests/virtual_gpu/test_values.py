"""The value policy for data-less tensors (interpose/values/policy.py; issue 14, causes 3 and 4).

In-process property tests drive values/policy.py's helpers the way the observer does (a dispatch mode
under FakeTensorMode) and compare what a placeholder reads with what torch computes on real
data that holds the placeholder's value in every element. The traced scripts check the whole
path on a virtual GPU (casts, D2H copies, collectives on 1 and 2 ranks, DeepSpeed's overflow
vote, Accelerate's RNG-state sync, CPU index tensors, DTensor reads) on both torch builds."""

from __future__ import annotations

import math
from typing import Any, Callable

import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode, unset_fake_temporarily
from torch.utils._python_dispatch import TorchDispatchMode

from interpose.values import policy as values
from tests.virtual_gpu.harness import BUILDS, assert_ran, run_traced

aten = torch.ops.aten


class _ValueMode(TorchDispatchMode):
    """What the observer (interpose/ops/observer.py) does with values, without a simulator; with
    `exact`, exact fills take part in shadows as the observer passes them (values.exact_inputs)."""

    def __init__(self, exact: bool = False) -> None:
        super().__init__()
        self.exact = exact

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if func is aten._local_scalar_dense.default and values.is_virtual(args[0]):
            return values.scalar_value(args[0])
        if func is aten.is_nonzero.default and values.is_virtual(args[0]):
            return bool(values.scalar_value(args[0]))
        exact = values.exact_inputs(func, args, kwargs) if self.exact else None
        out = func(*args, **kwargs)
        values.note_result(func, args, kwargs, out, exact or values.READ_NOW)
        values.note_shadow(func, args, kwargs, out, lambda t: isinstance(t, FakeTensor), unset_fake_temporarily,
                           exact)
        return out


def _virtual(fn: Callable[[], Any]) -> Any:
    with FakeTensorMode(allow_non_fake_inputs=True), _ValueMode():
        return fn()


NUMBERS = st.sampled_from([0, 1, 2, 7, 0.0, 1.0, 0.5, 2.5, True, False])
DTYPES = st.sampled_from([torch.bool, torch.uint8, torch.int32, torch.int64, torch.float16, torch.bfloat16,
                          torch.float32, torch.float64])
SIZES = st.integers(values.SHADOW_MAX_NUMEL + 1, 400)  # computed, not copied: a value, no shadow
FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _reads(x: torch.Tensor) -> list[Any]:
    """The ways a script reads a tensor's data, as Python values."""
    return [
        bool(x.any()), bool(x.all()), x.bool().any().item(), int(x.to(torch.uint8).amax()),
        x.float().amax().item(), x.to(torch.float64).amin().item(), x.double().mean().item(),
        x.tolist()[0], x.ne(0).any().item(), int(x.to(torch.int32).max().to(torch.uint8)),
        float(x.float().sum() > 0),
    ]


@FAST
@given(v=NUMBERS, dtype=DTYPES, n=SIZES)
def test_a_placeholder_reads_the_same_however_read(v: Any, dtype: torch.dtype, n: int) -> None:
    """bool, int(byte), float, tolist, any/all, max/min/mean agree with real data of that value."""
    real = _reads(torch.full((n,), v).to(dtype))
    fake = _virtual(lambda: _reads(torch.full((n,), v).to(dtype)))
    assert fake == real


@FAST
@given(dtype=DTYPES, n=SIZES)
def test_unknown_values_read_1_and_flags_false(dtype: torch.dtype, n: int) -> None:
    """Nothing known: 1 (a bool False); isnan/isinf False, isfinite True, in every dtype read."""
    def run() -> list[Any]:
        x = torch.empty(n, dtype=dtype)
        g = torch.empty(n)
        return [x.amax().item(), torch.isnan(g).any().item(), int(torch.isinf(g).to(torch.uint8).amax()),
                torch.isfinite(g).all().item(), float(torch.isnan(g).float().sum())]

    assert _virtual(run) == [values.default_value(dtype), False, 0, True, 0.0]


_UNARY: list[tuple[str, Callable[[torch.Tensor], torch.Tensor]]] = [
    ("abs", lambda x: x.abs()), ("neg", lambda x: -x.float()), ("not", torch.logical_not),
    ("gt", lambda x: x > 0.5), ("eq1", lambda x: x == 1), ("twice", lambda x: x * 2), ("plus_self", lambda x: x + x),
    ("minus1", lambda x: x.float() - 1), ("clamp", lambda x: x.float().clamp(min=0)), ("half", lambda x: x.float() / 2),
    ("where", lambda x: torch.where(x.float() > 0, x.float(), -x.float())), ("isnan", torch.isnan),
    ("isinf", torch.isinf), ("or_isinf", lambda x: x.isnan().logical_or(x.isinf())), ("byte", lambda x: x.byte()),
    ("bool", lambda x: x.bool()), ("max", lambda x: x.float().max()), ("exp", lambda x: x.float().exp()),
    ("sqrt", lambda x: x.float().abs().sqrt()), ("square", lambda x: x.float() ** 2),
]


@FAST
@given(v=NUMBERS, dtype=DTYPES, n=SIZES, chain=st.lists(st.sampled_from(_UNARY), min_size=1, max_size=5))
def test_pointwise_chains_compute_on_the_value(v: Any, dtype: torch.dtype, n: int, chain: list) -> None:
    """Pointwise ops, casts and reductions compute on the value as torch does on uniform data."""
    x = torch.full((n,), v).to(dtype)
    for _name, op in chain:  # a healthy run stays finite; a placeholder that would not reads 1
        try:
            x = op(x)
        except (RuntimeError, NotImplementedError):  # not defined for this dtype in torch either
            assume(False)
        assume(not (x.dtype.is_floating_point and not torch.isfinite(x).all()))

    def run(t: torch.Tensor) -> Any:
        for _name, op in chain:
            t = op(t)
        return t.reshape(-1)[0].item()

    expected = run(torch.full((n,), v).to(dtype))
    got = _virtual(lambda: run(torch.full((n,), v).to(dtype)))
    assert got == expected or (isinstance(got, float) and math.isclose(got, expected, rel_tol=1e-6))


def _has_overflow(grads: list[torch.Tensor]) -> bool:
    """DeepSpeed ZeRO-1/2's has_overflow (runtime/zero/stage_1_and_2.py) and CheckOverflow's
    serial check (runtime/utils.py), in plain torch, without the all_reduce."""
    invalid = torch.zeros([1], dtype=torch.float)
    for grad in grads:
        f = grad.float()
        invalid += f.isnan().logical_or(f.isinf()).float().max()
    overflow_gpu = invalid.bool().byte()
    serial = any(float(g.float().sum()) in (float("inf"), -float("inf")) or float(g.float().sum()) != float(g.float().sum())
                 for g in grads)
    return bool(overflow_gpu[0].item()) or serial


@FAST
@given(count=st.integers(1, 4), n=SIZES, dtype=st.sampled_from([torch.float16, torch.bfloat16, torch.float32]))
def test_deepspeed_overflow_check_sees_no_overflow(count: int, n: int, dtype: torch.dtype) -> None:
    grads = [torch.randn(n).to(dtype) for _ in range(count)]
    assert _has_overflow(grads) is False  # real finite gradients: what a healthy GPU run computes
    assert _virtual(lambda: _has_overflow([torch.randn(n, dtype=dtype) for _ in range(count)])) is False


@FAST
@given(data=st.lists(st.integers(-1000, 1000), min_size=1, max_size=300),
       dtype=st.sampled_from([torch.int32, torch.int64, torch.float64]))
def test_data_copied_from_the_cpu_keeps_its_shadow(data: list[int], dtype: torch.dtype) -> None:
    """A copy of a real CPU tensor holds its data through copies and views, and host_copy (what a
    D2H copy returns) gives the data back exactly."""
    real = torch.tensor(data)

    def run() -> tuple[list, list, Any]:
        x = real.to(dtype, copy=True)
        assert isinstance(x, FakeTensor)
        y = x.clone()[1:] if len(data) > 1 else x.clone()
        return values.host_copy(x).tolist(), values.host_copy(y).tolist(), x[0].item()

    full, tail, first = _virtual(run)
    expected = real.to(dtype)
    assert full == expected.tolist() and tail == (expected[1:] if len(data) > 1 else expected).tolist()
    assert first == expected[0].item()


def test_the_cpu_generator_state_is_a_shadow() -> None:
    """torch.get_rng_state() (5,056 bytes) fits in the shadow cap for data copied from the CPU."""
    state = torch.get_rng_state()
    assert state.numel() <= values.COPY_SHADOW_MAX_NUMEL
    back = _virtual(lambda: values.host_copy(state.clone().to(torch.uint8)))
    assert torch.equal(back, state)


def test_a_fill_is_copied_to_the_cpu_only_when_every_other_input_holds_data(monkeypatch: Any) -> None:
    """index_put_ into a zero fill at rows that hold data: with values that hold data too (ones)
    the result is computed on the CPU; with activations that hold none (randn) nothing can be, and
    the fill's million elements are not made on the CPU first (they were, then dropped: a MoE
    token dispatcher spent 13% of its step there)."""
    made: list[tuple] = []
    full = torch.full
    monkeypatch.setattr(torch, "full", lambda size, *a, **k: made.append(tuple(size)) or full(size, *a, **k))

    def scatter(source: Callable[..., torch.Tensor]) -> torch.Tensor:
        with FakeTensorMode(allow_non_fake_inputs=True), _ValueMode(exact=True):
            buf = torch.zeros(4096, 256)
            rows = torch.arange(0, 4096, 2)
            buf.index_put_((rows,), source(2048, 256))
            return values.host_data(buf)

    data = scatter(torch.ones)
    assert data is not None and data[0].tolist() == [1.0] * 256 and data[1].tolist() == [0.0] * 256
    assert (4096, 256) in made
    made.clear()
    assert scatter(torch.randn) is None
    assert (4096, 256) not in made


@pytest.mark.parametrize("n", [1, 2, 8])
def test_collectives_compute_on_values(n: int) -> None:
    """SUM over N members of placeholder 1 reads N (averages stay 1); flags stay unset."""
    assert values.reduce_values([1.0] * n, "sum", torch.float32) == float(n)
    assert values.reduce_values([1.0] * n, "avg", torch.float32) == 1.0
    assert values.reduce_values([0] * n, "max", torch.uint8) == 0
    assert values.reduce_values([False] * n, "max", torch.bool) is False


@BUILDS
def test_value_policy_on_a_virtual_gpu(tmp_path: Any, user_python: str) -> None:
    proc, _ = run_traced(tmp_path, user_python, "values_policy.py")
    assert_ran(proc, "reads_agree", "deepspeed_overflow", "grad_norm", "d2h_shadow", "float_counter",
               "rng_state_round_trip", "index_tensors_real")


@BUILDS
@pytest.mark.parametrize("ranks", [1, 2])
def test_value_policy_across_ranks(tmp_path: Any, user_python: str, ranks: int) -> None:
    proc, _ = run_traced(tmp_path, user_python, "values_dist.py", options=("--nproc-per-node", str(ranks)))
    assert_ran(proc, "placeholder_all_reduce", "deepspeed_overflow", "real_counter_collectives",
               "rng_state_broadcast", "dtensor_reads")


def test_a_wrapper_subclass_reads_as_its_inner_tensor() -> None:
    """Any traceable wrapper subclass around virtual tensors (DTensor, TwoTensor, torchao's)
    reads as its first inner tensor does, instead of reaching FakeTensor's
    DataDependentOutputException through its own dispatch."""
    from torch.testing._internal.two_tensor import TwoTensor

    def run() -> list[Any]:
        t = TwoTensor(torch.zeros(100), torch.zeros(100))
        assert values.is_virtual(t)
        flags = TwoTensor(torch.empty(100), torch.empty(100)).isnan()
        return [bool(t.any()), t.amax().item(), (t + 2).amax().item(), int(t.byte().amax()), bool(flags.any()),
                t.sum().item()]

    assert _virtual(run) == [False, 0.0, 2.0, 0, False, 0.0]


def test_an_uninitialized_tensor_holds_no_host_copy_where_index_data_computed_from_data_does() -> None:
    """torch.empty of an integer dtype is no index data: nothing in it may be read. Transformer
    Engine's FP8 payloads are such uint8 empties, and each used to take a real host copy."""
    n = 1 << 20

    def make() -> tuple[Any, ...]:
        empty = torch.empty(n, dtype=torch.uint8)
        like = torch.empty_like(empty)
        ids = torch.arange(n) % 7  # index data computed from data: routing needs its elements
        return empty, like, ids, values.shadow_of(empty), values.shadow_of(like), values.shadow_of(ids)

    empty, like, ids, empty_shadow, like_shadow, ids_shadow = _virtual(make)
    assert empty_shadow is None and like_shadow is None
    assert ids_shadow is not None and ids_shadow.shape == (n,) and int(ids_shadow[9]) == 2
