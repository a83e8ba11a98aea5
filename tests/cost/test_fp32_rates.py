"""fp32 math rates: true fp32 on CUDA cores unless TF32 is allowed, TF32 tensor cores when it is,
3xTF32 in fp32 memory-efficient attention; the TF32 settings a signature records win over the
estimator's defaults.

Expected rates come from the GPU table's datasheet peaks (H100 SXM: fp32 67 TFLOP/s, TF32 494.7
dense) and from the H100 calibration rows (true fp32 GEMMs, TF32 off: ~51 TFLOP/s at 4096^3).
"""

from __future__ import annotations

import json

import pytest

from phantora.cost.analytical import AnalyticalEstimator
from phantora.cost.calibrated import TF32_NOT_CALIBRATED
from phantora.cost import choose_estimator
from phantora.cost.roofline import NO_TF32_CUDNN_TAG, TF32_MATMUL_TAG
from phantora.hardware import lookup_gpu
from phantora.ops import OpSignature
from tests.cost.tensors import cuda_tensor as _t

from .workloads import CALIBRATION

TAGS = frozenset({"core"})
H100 = lookup_gpu("h100")




def mm(m: int, k: int, n: int, tags: frozenset[str] = frozenset()) -> OpSignature:
    return OpSignature("aten::mm", "default", (_t((m, k)), _t((k, n))), (_t((m, n)),), tags)


def _fp32_mm_rows() -> list[dict]:
    rows = [json.loads(line) for line in CALIBRATION.read_text().splitlines() if line.strip()]
    return [r for r in rows if r.get("op") == "mm" and r.get("dtype") == "fp32" and r["us"] > 1000]


def test_fp32_gemm_runs_at_the_simt_peak_without_tf32() -> None:
    est = AnalyticalEstimator(H100, allow_tf32=False)
    sig = mm(8192, 8192, 8192)
    e = est.estimate(sig)
    flops = 2.0 * 8192**3
    assert "sgemm" in e.kernel_name
    # large square GEMM: the dense fp32 peak times the GEMM efficiency, within 3%
    assert abs(e.duration_ns / (flops / (H100.peak_flops["fp32"] * H100.gemm_efficiency) * 1e9) - 1) < 0.03


@pytest.mark.parametrize("row", _fp32_mm_rows(), ids=lambda r: f"{r['M']}x{r['N']}x{r['K']}")
def test_fp32_gemm_matches_the_calibration_rows(row: dict) -> None:
    """Every true-fp32 GEMM the H100 measured for >1 ms (TF32 off), analytical within 6%."""
    est = AnalyticalEstimator(H100, allow_tf32=False)
    got_us = est.estimate(mm(row["M"], row["K"], row["N"])).duration_ns / 1e3
    assert abs(got_us / row["us"] - 1) < 0.06, (got_us, row)


def test_tf32_gemm_runs_at_the_tensor_core_peak() -> None:
    est = AnalyticalEstimator(H100, allow_tf32=True)
    e = est.estimate(mm(8192, 8192, 8192))
    flops = 2.0 * 8192**3
    assert "tf32" in e.kernel_name
    assert abs(e.duration_ns / (flops / (H100.peak_flops["tf32"] * H100.gemm_efficiency) * 1e9) - 1) < 0.03
    fp32 = AnalyticalEstimator(H100, allow_tf32=False).estimate(mm(8192, 8192, 8192))
    assert fp32.duration_ns / e.duration_ns == pytest.approx(494.7 / 67, rel=0.05)


def test_the_signature_tag_switches_tf32_per_call() -> None:
    """The program's own torch.backends.cuda.matmul.allow_tf32, recorded on the call, wins."""
    est = AnalyticalEstimator(H100)  # torch's defaults: matmul TF32 off
    plain, tagged = est.estimate(mm(4096, 4096, 4096)), est.estimate(mm(4096, 4096, 4096, frozenset({TF32_MATMUL_TAG})))
    assert "sgemm" in plain.kernel_name and "tf32" in tagged.kernel_name
    assert plain.duration_ns / tagged.duration_ns > 5
    cal = choose_estimator("calibrated", H100).estimator
    assert cal.estimate(mm(4096, 4096, 4096, frozenset({TF32_MATMUL_TAG}))).estimator == TF32_NOT_CALIBRATED
    assert cal.estimate(mm(4096, 4096, 4096)).estimator == "calibrated"


def test_cudnn_tf32_off_puts_fp32_convolutions_on_cuda_cores() -> None:
    x, w, y = _t((64, 256, 56, 56)), _t((256, 256, 3, 3)), _t((64, 256, 56, 56))
    args = (x, w, None, (1, 1), (1, 1), (1, 1), False, (0, 0), 1)
    est = AnalyticalEstimator(H100)
    on = est.estimate(OpSignature("aten::convolution", "default", args, (y,)))
    off = est.estimate(OpSignature("aten::convolution", "default", args, (y,), frozenset({NO_TF32_CUDNN_TAG})))
    assert off.duration_ns / on.duration_ns > 5  # 494.7 vs 67 TFLOP/s, less the fixed costs


def test_fp32_efficient_attention_runs_3xtf32() -> None:
    """fp32 SDPA (memory-efficient backend only) issues three TF32 MMAs per product: a sixth of
    the bf16 rate on the H100 (989.4 vs 494.7 / 3), whatever allow_tf32 says."""
    def sdpa(dtype: str) -> OpSignature:
        q = _t((8, 16, 4096, 128), dtype)
        out = (_t((8, 16, 4096, 128), dtype), _t((8, 16, 4096), "float32"), None, None)
        return OpSignature("aten::_scaled_dot_product_efficient_attention", "default",
                           (q, q, q, None, True, 0.0, False, None), out)
    est = AnalyticalEstimator(H100)
    ratio = est.estimate(sdpa("float32")).duration_ns / est.estimate(sdpa("bfloat16")).duration_ns
    # memory traffic and exponentials do not scale with the MMA rate: between 4.5x and 6x
    assert 4.5 < ratio <= 6.0 * 1.01, ratio
