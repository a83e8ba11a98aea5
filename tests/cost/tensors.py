"""A contiguous tensor on the first virtual GPU, as op signatures describe it: what the cost
tests build their hand-made signatures from."""

from __future__ import annotations

from phantora.ops import TensorMeta


def cuda_tensor(shape: tuple[int, ...] | list[int], dtype: str = "float32") -> TensorMeta:
    stride, acc = [], 1
    for n in reversed(shape):
        stride.append(acc)
        acc *= n
    return TensorMeta(tuple(shape), dtype, tuple(reversed(stride)), "cuda:0")
