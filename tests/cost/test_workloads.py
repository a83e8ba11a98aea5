"""Whole training steps, captured as real signatures: every op is known and the breakdown is
what an H100 profile of such a step looks like (matrix math first, views free)."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from torch.utils.flop_counter import flop_registry

from .workloads import SignatureRecorder, sig_on_cuda
from phantora.cost import COMPUTE, NO_GPU_WORK
from phantora.cost.families import classify


def breakdown(estimator, sigs) -> Counter:
    per_family: Counter = Counter()
    for s in sigs:
        fam = classify(s.name, s.tags)
        per_family[fam.name if fam else "unknown"] += estimator.estimate(s).duration_ns
    return per_family


@pytest.mark.parametrize("workload", ["gpt_fused_sigs", "gpt_foreach_sigs", "cnn_sigs"])
def test_every_captured_op_is_known(request, estimator, workload):
    sigs = request.getfixturevalue(workload)
    assert len(sigs) > 200
    unknown = sorted({s.full_name for s in sigs if not estimator.estimate(s).known})
    assert not unknown


@pytest.mark.parametrize("workload", ["gpt_fused_sigs", "gpt_foreach_sigs", "cnn_sigs"])
def test_views_and_allocations_cost_nothing_on_the_gpu(request, estimator, workload):
    for s in request.getfixturevalue(workload):
        fam = classify(s.name, s.tags)
        e = estimator.estimate(s)
        if fam.name in ("view", "allocation", "host"):
            assert e.kind == NO_GPU_WORK and e.kernels == 0 and e.duration_ns == 0
            assert 0 < e.host_ns < 3_000
        elif e.kind == COMPUTE:
            assert e.kernels >= 1 and e.duration_ns >= estimator.gpu.min_kernel_ns


def test_gpt_step_is_dominated_by_matrix_math(estimator, gpt_fused_sigs):
    per_family = breakdown(estimator, gpt_fused_sigs)
    total = sum(per_family.values())
    matrix = per_family["gemm"] + per_family["attention"]
    assert matrix > 0.4 * total, per_family
    assert per_family["gemm"] == max(per_family.values())
    # a 2-layer d=1024 GPT step on 8x1024 tokens: a few ms on an H100, not us and not seconds
    assert 3e6 < total < 20e6


def test_gpt_step_uses_the_fused_and_foreach_optimizers(estimator, gpt_fused_sigs, gpt_foreach_sigs):
    fused = [s for s in gpt_fused_sigs if s.short_name == "_fused_adamw_"]
    assert len(fused) == 1
    e = estimator.estimate(fused[0])
    params = fused[0].args[0]
    param_bytes = sum(t.nbytes for t in params)
    # params and both moments read and written, grads read: 7 passes over fp32 parameters
    assert e.bytes == pytest.approx(7 * param_bytes, rel=0.01)
    assert e.kernels >= 1
    foreach_ops = {s.short_name for s in gpt_foreach_sigs if s.short_name.startswith("_foreach_")}
    assert {"_foreach_mul_", "_foreach_addcmul_", "_foreach_lerp_"} & foreach_ops


def test_cnn_step_is_dominated_by_convolutions(estimator, cnn_sigs):
    per_family = breakdown(estimator, cnn_sigs)
    assert per_family["conv"] == max(per_family.values()), per_family


def test_flops_match_torch_flop_counter():
    """FLOPs of GEMMs, convolutions and (non-causal) attention equal torch.utils.flop_counter's."""
    from phantora.cost.analytical import AnalyticalEstimator
    from phantora.hardware import lookup_gpu
    from torch._subclasses.fake_tensor import FakeTensorMode

    est = AnalyticalEstimator(lookup_gpu("h100"))

    class FlopRecorder(SignatureRecorder):
        def __init__(self):
            super().__init__()
            self.flops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            out = func(*args, **kwargs)
            from interpose.ops.signature import signature_of
            packet = func._overloadpacket
            if packet in flop_registry:
                self.signatures.append(signature_of(func, args, kwargs, out))
                self.flops.append(flop_registry[packet](*args, **kwargs, out_val=out))
            return out

    rec = FlopRecorder()
    with FakeTensorMode():
        with rec:
            x = torch.randn(4, 64, 32, 32, requires_grad=True)
            w = torch.randn(128, 64, 3, 3, requires_grad=True)
            y = torch.nn.functional.conv2d(x, w, stride=2, padding=1)
            wt = torch.randn(128, 32, 4, 4, requires_grad=True)
            z = torch.nn.functional.conv_transpose2d(y, wt, stride=2, padding=1)
            a, b = torch.randn(256, 512, requires_grad=True), torch.randn(512, 384, requires_grad=True)
            m = a @ b
            q = torch.randn(2, 8, 256, 64, requires_grad=True)
            att = torch.ops.aten._scaled_dot_product_flash_attention(q, q, q, 0.0, False)[0]
            (z.sum() + m.sum() + att.sum()).backward()
    assert len(rec.signatures) >= 8
    for sig, flops in zip(rec.signatures, rec.flops):
        assert est.estimate(sig_on_cuda(sig)).flops == pytest.approx(flops, rel=1e-6), sig.full_name
