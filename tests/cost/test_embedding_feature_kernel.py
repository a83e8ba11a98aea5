"""torch's sort-free embedding backward (embedding_backward_feature_kernel, up to 3,072 indices)
against every real profile that ran it: chunks of 32 indices at a memory latency each, rows of
grad_weight in L2 or in HBM (phantora/cost/indexing.py feature_kernel_ns). The L2 latency is
fitted to the H100 profiles and checked on the lent H200's; the HBM one is fitted to the H200's
one Llama 8B-shaped profile, the only table larger than L2 in the data."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from phantora.cost.analytical import AnalyticalEstimator
from phantora.cost.indexing import embedding_backward
from phantora.hardware import lookup_gpu
from phantora.ops import OpSignature, TensorMeta

DATA = Path(__file__).resolve().parents[1] / "data" / "groundtruth"
PROFILES = {"h100": sorted((DATA / "examples").glob("profile_*.json")),
            "h200": sorted((DATA / "h200_vm" / "examples").glob("profile_*.json"))}
# the programs' vocabulary sizes: the GPT examples' position tables have as many rows as the
# sequence (the first shape), the Llama programs' token table 128,256 rows
LLAMA_VOCAB = 128256


def tensor(shape, dtype) -> TensorMeta:
    stride, acc = [], 1
    for s in reversed(shape):
        stride.append(acc)
        acc *= s
    return TensorMeta(tuple(shape), dtype, tuple(reversed(stride)), "cuda:0", False)


def measured_calls(gpu: str) -> list[tuple[str, list[int], str, int, float]]:
    """(profile, grad shape, dtype, table rows, us a call) of every embedding backward that took
    the sort-free kernel (the op's self device time is that kernel's: the zero fill is a child op)."""
    out = []
    for path in PROFILES[gpu]:
        doc = json.loads(path.read_text())
        if not any("embedding_backward_feature_kernel" in k["name"] for k in doc["kernels"]):
            continue
        for op in doc["ops"]:
            if op["op"] != "aten::embedding_dense_backward":
                continue
            grad = json.loads(op["shapes"])[0]
            if math.prod(grad[:-1]) > 3072:
                continue
            llama = "llama" in path.name
            out.append((path.name, grad, "bfloat16" if llama else "float32",
                        LLAMA_VOCAB if llama else grad[0], op["self_device_us"] / op["count"]))
    return out


def modelled_us(gpu: str, grad: list[int], dtype: str, rows: int) -> float:
    est = AnalyticalEstimator(lookup_gpu(gpu))
    ids = tensor(grad[:-1], "int64")
    sig = OpSignature("aten::embedding_dense_backward", "default", (tensor(grad, dtype), ids, rows, -1, False),
                      (tensor((rows, grad[-1]), dtype),), frozenset())
    kernel = next(k for k in embedding_backward(sig, est.ctx).kernels if k.name == "embedding_backward_feature_kernel")
    return kernel.duration_ns / 1e3


@pytest.mark.parametrize("gpu, role", [("h100", "fitted"), ("h200", "held out, and the one HBM point fitted")])
def test_the_feature_kernel_takes_a_latency_per_chunk_of_32_indices(gpu, role):
    calls = measured_calls(gpu)
    assert len(calls) >= 3, calls  # the GPT examples' position embeddings (and on the H200 the 8B)
    for name, grad, dtype, rows, real in calls:
        model = modelled_us(gpu, grad, dtype, rows)
        assert abs(model / real - 1) < 0.05, (gpu, role, name, grad, real, model)


def test_a_table_larger_than_l2_is_slower_per_chunk_than_one_it_holds():
    small = modelled_us("h200", [2048, 4096], "bfloat16", 1024)  # 8 MiB: in L2
    large = modelled_us("h200", [2048, 4096], "bfloat16", LLAMA_VOCAB)  # 1 GB
    assert 1.8 < large / small < 2.2
    # the same 64 chunks whatever the width, in one wave up to 2 x 132 blocks of 32 features
    assert modelled_us("h200", [2048, 768], "bfloat16", 1024) == small
