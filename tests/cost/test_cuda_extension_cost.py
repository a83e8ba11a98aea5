"""The cost model of CUDA-extension kernels phantora never compiles (interpose/device/cuda_extensions.py):
DeepSpeed's / Apex's multi_tensor_adam is timed as torch's fused Adam on the same tensors."""

from __future__ import annotations

import math

import pytest

from phantora.cost.families import classify
from phantora.cost.optimizers import CHUNK_ELEMENTS
from phantora.ops import OpSignature, TensorMeta


def tensor(shape: tuple[int, ...], dtype: str = "float32") -> TensorMeta:
    stride, acc = [], 1
    for s in reversed(shape):
        stride.append(acc)
        acc *= s
    return TensorMeta(tuple(shape), dtype, tuple(reversed(stride)), "cuda:0", False)


def extension_adam(params: tuple[TensorMeta, ...]) -> OpSignature:
    # multi_tensor_adam(chunk_size, noop_flag, grads, params, exp_avgs, exp_avg_sqs, lr, beta1,
    #                   beta2, eps, step, mode, bias_correction, weight_decay)
    noop = tensor((1,), "int32")
    return OpSignature("cuda_extension::multi_tensor_adam", "default",
                       (2048 * 32, noop, params, params, params, params, 1e-3, 0.9, 0.95, 1e-8, 3, 1, 1, 0.1),
                       (), frozenset())


def test_multi_tensor_adam_is_an_optimizer_kernel() -> None:
    family = classify("cuda_extension::multi_tensor_adam")
    assert family is not None and family.name == "optimizer" and family.modelled


def test_multi_tensor_adam_streams_what_torch_fused_adam_streams(estimator) -> None:
    # ZeRO's flat fp32 partition: one 3M-element tensor, and a list of several
    params = (tensor((3_000_000,)),) + tuple(tensor((1024, 1024)) for _ in range(40))
    n = sum(t.numel for t in params)
    e = estimator.estimate(extension_adam(params))
    # grads read, params and both moments read and written: 7 passes over fp32 elements
    assert e.bytes == pytest.approx(7 * 4 * n, rel=1e-9)
    assert "AdamFunctor" in e.kernel_name
    steps = tuple(tensor(()) for _ in params)
    torch_fused = estimator.estimate(OpSignature(
        "aten::_fused_adamw_", "default",
        (params, params, params, params, (), steps) + (1e-3, 0.9, 0.95, 0.1, 1e-8) + (False, False, None, None),
        (), frozenset({"inplace"})))
    assert e.duration_ns == pytest.approx(torch_fused.duration_ns, rel=1e-9)
    assert e.kernels == torch_fused.kernels
    # the 3M-element tensor alone fills ceil(3e6 / 65,536) = 46 blocks; 40 more 1 Mi-element
    # tensors of 16 blocks each: 686 blocks, at most 320 per launch
    assert e.kernels == math.ceil((math.ceil(3_000_000 / CHUNK_ELEMENTS) + 40 * 16) / 320)
