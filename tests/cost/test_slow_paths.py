"""torch's non-vectorized elementwise paths (phantora/cost/pointwise.py slow_path_ns, copies.copy):
the generic elementwise_kernel<128, ...> that a broadcast operand forces (class
"elementwise_strided": every operand element loaded through the offset calculator, an SM-side
cost) and the dynamic-casting unrolled_elementwise_kernel of a dtype change other than fp32 -> bf16
(class "unrolled_cast", 0.66 of the streaming rate). Both are fitted to the H100 sweep's unfused
RMSNorm cases (phantora/cost/sweep_fit.py) and held out here on the GPT examples' real H100
training profiles (tests/data/groundtruth/examples, torch.profiler, bf16 autocast): the learned
position embedding's broadcast add, the residual adds of an fp32 stream and a bf16 branch, and the
logits' bf16 -> fp32 cast before the loss. Unfused RMSNorm, RoPE's cos/sin products and the
loss's upcast put many of these kernels in a Llama-style step.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from phantora.cost import choose_estimator, fitted
from phantora.cost.analytical import AnalyticalEstimator
from phantora.hardware import lookup_gpu
from phantora.ops import OpSignature
from tests.cost.tensors import cuda_tensor as _t

PROFILES = Path(__file__).resolve().parents[1] / "data" / "groundtruth" / "examples"
POINTWISE = frozenset({"core", "pointwise"})




def _estimator(gpu="h100"):
    return choose_estimator("auto", lookup_gpu(gpu), cuda_probe=lambda: None).estimator


def _us(sig, gpu="h100") -> float:
    return _estimator(gpu).estimate(sig).duration_ns / 1e3


def _profile(name: str) -> dict:
    return json.loads((PROFILES / f"profile_{name}.json").read_text())


def _kernel_us(profile: dict, *parts: str) -> float:
    """Mean time of the one profiled kernel whose name holds every part."""
    (k,) = [k for k in profile["kernels"] if all(p in k["name"] for p in parts)]
    return k["us"] / k["count"]


@pytest.mark.parametrize("name,d", [("gpt_124m_b8", 768), ("gpt_350m_b8", 1024)])
def test_broadcast_add_follows_its_operand_elements(name, d):
    """tok_emb [8, 1024, d] + pos_emb [1024, d] (fp32): torch's elementwise_kernel<128, 2>, 23.5 /
    30.9 us in real training; held out. The streaming curve put it at 16.2 / 22.4 us (-31%, -28%)."""
    real = _kernel_us(_profile(name), "elementwise_kernel<128, 2", "CUDAFunctor_add<float>")
    x, pos = _t([8, 1024, d]), _t([1024, d])
    predicted = _us(OpSignature("aten::add", "Tensor", (x, pos), (x,), POINTWISE))
    assert predicted / real - 1 == pytest.approx(0, abs=0.05)


@pytest.mark.parametrize("name,d", [("gpt_124m_b8", 768), ("gpt_350m_b8", 1024)])
def test_mixed_dtype_add_runs_the_unrolled_kernel(name, d):
    """fp32 residual + bf16 branch -> fp32: torch's dynamic-casting unrolled kernel, 27.2 / 36.4 us
    in real training (2.3 TB/s of bytes moved); held out. The model, whose class is fitted on the
    sweep's bf16 -> fp32 casts (1.9 TB/s), reads +19% / +21%: the two sources disagree by that much,
    hence the bound. The streaming curve read -29% / -27%."""
    real = _kernel_us(_profile(name), "unrolled_elementwise_kernel<at::native::CUDAFunctor_add<float>")
    x, xb = _t([8, 1024, d]), _t([8, 1024, d], "bfloat16")
    predicted = _us(OpSignature("aten::add", "Tensor", (x, xb), (x,), POINTWISE))
    assert predicted / real - 1 == pytest.approx(0, abs=0.25)


def test_logits_upcast_and_its_gradient_cast():
    """GPT-124M's logits [8192, 50304]: per step one bf16 -> fp32 copy before the loss (unrolled
    kernel) and one fp32 -> bf16 copy of its gradient (vectorized bfloat16_copy_kernel); the
    profile holds both under one copy_ op. Held out: the pair within 5% (the streaming rate for
    both read -21%)."""
    (op,) = [o for o in _profile("gpt_124m_b8")["ops"]
             if o["op"] == "aten::copy_" and o["shapes"].startswith("[[8192, 50304]")]
    real_pair = op["self_device_us"] / (op["count"] / 2)
    lo, hi = _t([8192, 50304], "bfloat16"), _t([8192, 50304])
    up = OpSignature("aten::_to_copy", "default", (lo,), (hi,), frozenset({"core"}))
    down = OpSignature("aten::_to_copy", "default", (hi,), (lo,), frozenset({"core"}))
    assert (_us(up) + _us(down)) / real_pair - 1 == pytest.approx(0, abs=0.05)
    assert _us(up) > 1.3 * _us(down)  # same bytes; the unrolled kernel is the slow one


def test_slow_paths_do_not_speed_up_with_hbm():
    """Both slow paths are limited on the SM side (fitted.streaming_rate's rule: the unrolled cast
    at e < SM_BOUND_BELOW; the strided class in the "sm" form), so an H200 (same SMs and clock,
    1.43x the HBM bandwidth) runs them in the H100's time, while the vectorized fp32 -> bf16 cast
    speeds up by the bandwidth."""
    x, rstd, w = _t([8192, 4096]), _t([8192, 1]), _t([4096])
    lo = _t([8192, 4096], "bfloat16")
    strided = OpSignature("aten::mul", "Tensor", (x, rstd), (x,), POINTWISE)
    weighted = OpSignature("aten::mul", "Tensor", (x, w), (x,), POINTWISE)
    up = OpSignature("aten::_to_copy", "default", (lo,), (x,), frozenset({"core"}))
    down = OpSignature("aten::_to_copy", "default", (x,), (lo,), frozenset({"core"}))
    assert fitted.efficiency("unrolled_cast") < fitted.SM_BOUND_BELOW
    for sig in (strided, weighted, up):
        assert _us(sig, "h200") == pytest.approx(_us(sig, "h100"), rel=0.01), sig.short_name
    assert _us(down, "h100") / _us(down, "h200") == pytest.approx(4.32 / 3.015, rel=0.03)


def test_vectorized_ops_keep_the_streaming_curve():
    """Dense same-dtype operands (and one-element scalars) take torch's vectorized kernel: no slow
    path, the H100 sweep's elementwise curve (3.0 TB/s for a large add)."""
    x = _t([8192, 4096])
    one = _t([], "float32")
    add = OpSignature("aten::add", "Tensor", (x, x), (x,), POINTWISE)
    scaled = OpSignature("aten::mul", "Tensor", (x, one), (x,), POINTWISE)
    for sig in (add, scaled):
        k = AnalyticalEstimator(lookup_gpu("h100")).kernels(sig).kernels[0]
        assert k.name == "vectorized_elementwise_kernel"
        assert k.bytes / k.duration_ns * 1e-3 == pytest.approx(3.0, rel=0.05)  # TB/s
