"""Values live with the memory, not with one tensor object: a write through one view is read
through every other view of the same storage, as on a GPU (interpose/values/policy.py _StorageAttr).

DeepSpeed ZeRO-3 (runtime/zero/stage3.py) zero-fills a flat gradient buffer, keeps per-parameter
views of it, copies each reduce-scattered gradient in through *fresh* views of the same memory
and computes the gradient norm through the *first* views; when values were kept per tensor
object, the norm read the zeros: get_global_grad_norm() was 0.0 on every step."""

from __future__ import annotations

import pytest
import torch

from tests.virtual_gpu.test_values import _virtual

N = 100_000  # large enough to hold a value, not a shadow (exact data)


def _zero3_grad_norm() -> float:
    flat = torch.zeros(3 * N)
    kept = [flat.narrow(0, i * N, N) for i in range(3)]  # averaged_gradients, taken at start
    for i in range(3):
        grad = torch.full((N,), 2.0)
        flat.narrow(0, i * N, N).narrow(0, 0, N).copy_(grad)  # partition_grads' fresh views
    norms = torch.stack([g.float().norm(2) for g in kept])
    return float(torch.sum(norms.pow(2)) ** 0.5)


def test_a_write_through_one_view_is_read_through_another() -> None:
    real = _zero3_grad_norm()
    virtual = _virtual(_zero3_grad_norm)
    assert real == pytest.approx((3 * N * 4.0) ** 0.5)  # on data: the norm of 300,000 twos
    # a value is one number every element reads, and a reduction reads its input's value (the
    # table in interpose/values/policy.py): each norm reads 2, their squares 4, the sum 4, its root 2.
    # Per tensor object, the views taken before the copies read the zero fill: 0.
    assert virtual == 2.0


def test_unbind_keeps_the_value_of_what_it_views() -> None:
    def read() -> list[float]:
        x = torch.full((N,), 0.0)
        parts = x.view(4, N // 4).unbind(0)
        return [float(p.sum()) for p in parts] + [float(x.sum())]

    assert _virtual(read) == [0.0] * 5


def test_a_fill_through_the_base_reaches_views_taken_before() -> None:
    def read() -> tuple[float, float]:
        x = torch.full((N,), 3.0)
        v = x[: N // 2]
        x.zero_()
        return float(v.amax()), float(x.amax())

    assert _virtual(read) == (0.0, 0.0)
