"""FlashAttention 3 on a virtual H100 (interpose/device/flash_attn3.py), on both torch builds.

torch's activate_flash_attention_impl("FA3") imports `flash_attn_interface` (the stand-in under
phantora) and then runs aten's flash attention through FA3's `flash_attn_3::fwd` / `bwd`; so do
FA3's own flash_attn_func / flash_attn_varlen_func. Each kernel must last exactly what the cost
model gives aten's flash attention on the same shapes, computed here from the model itself with
signatures written by hand (varlen: summed per sequence where the offsets' values are known,
at the average length where they are not). Before the stand-in, the activation failed with
"ModuleNotFoundError: No module named 'flash_attn_interface'" (TorchTitan's varlen attention).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from phantora.cost.analytical import AnalyticalEstimator
from phantora.hardware import DEFAULT_GPU, lookup_gpu
from phantora.ops import OpSignature, TensorMeta
from phantora.trace.check import load_chrome_trace
from tests.virtual_gpu.harness import assert_ran, run_traced

H, D, T = 4, 64, 1024  # tests/virtual_gpu/scripts/flash_attn3.py
OFFSETS = (0, 300, 800, 1024)
MAX_LEN = 500


def _t(shape: tuple[int, ...], dtype: str = "bfloat16") -> TensorMeta:
    stride, n = [], 1
    for s in reversed(shape):
        stride.append(n)
        n *= s
    return TensorMeta(tuple(shape), dtype, tuple(reversed(stride)), "cuda:0")


def _aten_flash(q: TensorMeta, k: TensorMeta, cu: TensorMeta | None, max_len: int,
                offsets: tuple[int, ...] | None) -> tuple[OpSignature, OpSignature]:
    """aten::_flash_attention_forward / _backward (causal) as torch calls them for these shapes."""
    lse = _t((q.shape[1], q.shape[0]) if cu else (q.shape[0], q.shape[2], q.shape[1]), "float32")
    rng, philox, debug = _t((2,), "uint64"), _t((), "uint64"), _t((0,))
    data = (("cum_seq_q", offsets), ("cum_seq_k", offsets)) if offsets else ()
    forward = OpSignature("aten::_flash_attention_forward", "default",
                          (q, k, k, cu, cu, max_len, max_len, "<float>", True, False),
                          (q, lse, rng, philox, debug), data=data)
    backward = OpSignature("aten::_flash_attention_backward", "default",
                           (q, q, k, k, q, lse, cu, cu, max_len, max_len, "<float>", True, rng, _t((0,))),
                           (q, k, k), data=data)
    return forward, backward


def _expected_ns() -> list[int]:
    """Each call's trace duration for aten's op: its kernels back to back, with the stream's gap
    between an op's own kernels (phantora/engine/timeline.py op_span)."""
    gpu = lookup_gpu(DEFAULT_GPU)
    est = AnalyticalEstimator(gpu)
    packed, cu = _t((T, H, D)), _t((4,), "int32")
    q_gqa, kv_gqa = _t((2, 512, 8, D)), _t((2, 512, 2, D))
    calls = [_aten_flash(packed, packed, cu, MAX_LEN, OFFSETS),  # varlen, offsets copied from the CPU
             _aten_flash(packed, packed, cu, MAX_LEN, None),  # varlen, offsets without data
             _aten_flash(q_gqa, kv_gqa, None, 512, None),  # flash_attn_func, dense GQA
             _aten_flash(packed, packed, cu, MAX_LEN, OFFSETS)]  # flash_attn_varlen_func
    estimates = [est.estimate(sig) for pair in calls for sig in pair]
    return [e.duration_ns + gpu.kernel_gap_ns * (e.kernels - 1) for e in estimates]


# The CUDA build only, where FA3's users run (TorchTitan 0.3.0 needs torch 2.14): both builds
# carry the same torch/nn/attention/_fa3.py, and the suite's time is kept for other cases.
@pytest.mark.parametrize("user_python", ["cuda-build"], indirect=True)
def test_fa3_kernels_timed_as_aten_flash_attention(tmp_path: Path, user_python: str) -> None:
    proc, trace = run_traced(tmp_path, user_python, "flash_attn3.py")
    assert_ran(proc, "activate", "varlen_known", "varlen_unknown", "flash_attn_func", "flash_attn_varlen_func",
               "unmodelled_api")
    kernels = sorted((e for e in load_chrome_trace(trace)["traceEvents"]
                      if e.get("ph") == "X" and e.get("cat") == "kernel"
                      and str(e["args"].get("op", "")).startswith("flash_attn_3::")), key=lambda e: e["ts"])
    assert [k["args"]["op"] for k in kernels] == ["flash_attn_3::fwd.default", "flash_attn_3::bwd.default"] * 4
    assert all(k["name"] == "flash::FlashAttnFwdSm90" for k in kernels[::2])
    assert all(k["name"] == "flash::FlashAttnBwdSm90 (+2 kernels)" for k in kernels[1::2])
    assert all(k["args"]["estimator"].startswith("analytical") for k in kernels)
    expected = _expected_ns()
    measured = [round(k["dur"] * 1000) for k in kernels]
    assert measured == expected
    # Known offsets cost more than the average-length rule here (300^2 + 500^2 + 224^2 > 3 x 341^2
    # causal cells), so the first pair is slower than the second.
    assert measured[0] > measured[2] and measured[1] > measured[3]
    assert "unknown ops: none" in proc.stdout + proc.stderr
