"""Apex's and Megatron's fused CUDA kernels (interpose/device/apex_kernels.py, phantora/cost/apex.py).

The stand-in modules' functions return (or write) what Apex's do, with the shapes and dtypes of
Apex's sources (csrc/megatron/*.cpp, csrc/layer_norm_cuda.cpp, apex/contrib/csrc/layer_norm/
ln_api.cpp, csrc/amp_C_frontend.cpp), checked here on meta tensors; each kernel's bytes and FLOPs
are counted by hand from what the CUDA kernel reads and writes, and memory-bound kernels last
the ramp plus those bytes at the GPU's achieved HBM bandwidth.
"""

from __future__ import annotations

import math

import pytest
import torch

from interpose.device import apex_kernels
from phantora.cost.families import QUALIFIED_FAMILIES, classify
from phantora.cost.gemm import GemmShape, gemm_kernel
from phantora.cost.roofline import CostContext
from phantora.ops import OpSignature
from tests.cost.tensors import cuda_tensor

BF16 = "bfloat16"


def module(name: str):
    return apex_kernels.stand_in_module(name)


def meta(*shape: int, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    return torch.empty(shape, dtype=dtype, device="meta")


def sig(op: str, args: tuple, outputs: tuple = ()) -> OpSignature:
    return OpSignature(f"apex::{op}", "default", args, outputs, frozenset())


def streaming_ns(nbytes: float, h100) -> float:
    """A memory-bound kernel's time: its ramp, then its bytes at the achieved HBM bandwidth."""
    return h100.kernel_ramp_ns + nbytes / h100.achieved_memory_bandwidth * 1e9


# --- the stand-in modules: shapes, dtypes, checks ------------------------------------------------

def test_every_op_is_timed_by_a_modelled_family() -> None:
    apex_kernels.define_ops()
    ops = [s.split("(", 1)[0] for s in apex_kernels._SCHEMAS]
    for op in ops:
        family = classify(f"apex::{op}")
        assert family is not None and family.modelled and family.model is not None, op
        assert getattr(torch.ops.apex, op) is not None
    assert {n for n in QUALIFIED_FAMILIES if n.startswith("apex::")} == {f"apex::{op}" for op in ops}


def test_causal_softmax_returns_probabilities_and_its_backward_works_in_place() -> None:
    m = module("scaled_upper_triang_masked_softmax_cuda")
    x = meta(8, 256, 256)
    y = m.forward(x, torch.tensor([0.125])[0])  # Megatron passes the scale as scale_t[0]
    assert (y.shape, y.dtype) == ((8, 256, 256), torch.bfloat16)
    dy = meta(8, 256, 256)
    assert m.backward(dy, y, 0.125) is dy  # bwd_cuda writes the gradient into output_grads
    with pytest.raises(RuntimeError, match="expected 3D tensor"):
        m.forward(meta(2, 4, 256, 256), 1.0)
    with pytest.raises(RuntimeError, match="Only fp16 and bf16"):
        m.forward(meta(8, 256, 256, dtype=torch.float32), 1.0)


def test_masked_and_plain_softmax() -> None:
    masked, plain = module("scaled_masked_softmax_cuda"), module("scaled_softmax_cuda")
    x, mask = meta(2, 4, 128, 128), meta(1, 1, 128, 128, dtype=torch.bool)
    y = masked.forward(x, mask, 1.0)
    assert (y.shape, y.dtype) == ((2, 4, 128, 128), torch.bfloat16)
    dy = meta(2, 4, 128, 128)
    dx = masked.backward(dy, y, 1.0)
    assert dx.shape == (2, 4, 128, 128) and dx is not dy  # bwd_cuda allocates input_grads
    with pytest.raises(RuntimeError, match="mask"):
        masked.forward(x, meta(1, 1, 64, 128, dtype=torch.bool), 1.0)
    assert plain.forward(x, 1.0).shape == (2, 4, 128, 128)
    assert plain.backward(dy, y, 1.0) is dy  # in place, as Apex's scaled_softmax bwd


@pytest.mark.parametrize("sk, rows", [(16, 16), (64, 8), (128, 8), (256, 4), (2048, 4), (4096, 4)])
def test_batch_per_block_as_the_kernel_launches(sk: int, rows: int) -> None:
    # 128-thread blocks of warps of min(next_pow2(sk), 32) lanes, two rows per warp up to 128 columns
    assert module("scaled_masked_softmax_cuda").get_batch_per_block(sk, sk, 2, 4) == rows


def test_fused_layer_norm_variants() -> None:
    ln = module("fused_layer_norm_cuda")
    x, w, b = meta(4, 2, 512), meta(512), meta(512)
    out, mean, invvar = ln.forward_affine(x, (512,), w, b, 1e-5)
    assert (out.shape, out.dtype) == ((4, 2, 512), torch.bfloat16)
    assert (mean.shape, mean.dtype, invvar.shape, invvar.dtype) == ((8,), torch.float32, (8,), torch.float32)
    dx, dw, db = ln.backward_affine(x, mean, invvar, x, (512,), w, b, 1e-5, False)
    assert (dx.shape, dw.shape, db.shape) == ((4, 2, 512), (512,), (512,))
    out32, _, _ = ln.forward_affine_mixed_dtypes(x, (512,), meta(512, dtype=torch.float32),
                                                 meta(512, dtype=torch.float32), 1e-5)
    assert out32.dtype == torch.float32  # the weights' dtype
    y, rinv = ln.rms_forward_affine(x, (512,), w, 1e-5)
    assert (y.shape, rinv.shape) == ((4, 2, 512), (8,))
    dx, dw = ln.rms_backward_affine(x, rinv, x, (512,), w, 1e-5, False)
    assert (dx.shape, dw.shape) == ((4, 2, 512), (512,))
    assert ln.backward(x, mean, invvar, x, (512,), 1e-5, False).shape == (4, 2, 512)


def test_persistent_layer_norm() -> None:
    fln = module("fast_layer_norm")
    x, g, b = meta(8, 1024), meta(1024), meta(1024)
    z, mu, rs = fln.ln_fwd(x, g, b, 1e-5)
    assert (z.shape, z.dtype, mu.shape, mu.dtype, rs.dtype) == ((8, 1024), torch.bfloat16, (8,), torch.float32,
                                                                torch.float32)
    dx, dg, db, dg_part, db_part = fln.ln_bwd(z, x, mu, rs, g, b, False)
    assert (dx.shape, dg.shape, db.shape) == ((8, 1024), (1024,), (1024,))
    # per-CTA-column fp32 partial sums, one CTA per SM (132 on the H100 when the device is unknown)
    assert (dg_part.shape, dg_part.dtype, db_part.shape) == ((132, 1024), torch.float32, (132, 1024))


def test_wgrad_checks_main_grad_dtype() -> None:
    fw = module("fused_weight_gradient_mlp_cuda")
    x, dy = meta(256, 2, 512), meta(256, 2, 1024)
    fw.wgrad_gemm_accum_fp32(x, dy, meta(1024, 512, dtype=torch.float32))
    fw.wgrad_gemm_accum_fp16(x, dy, meta(1024, 512))
    with pytest.raises(RuntimeError, match="d_weight of dtype torch.bfloat16"):
        fw.wgrad_gemm_accum_fp32(x, dy, meta(1024, 512))
    with pytest.raises(RuntimeError, match="d_weight"):
        fw.wgrad_gemm_accum_fp32(x, dy, meta(512, 1024, dtype=torch.float32))


def test_amp_c() -> None:
    amp = module("amp_C")
    noop = meta(1, dtype=torch.int32)
    tensors = [meta(1024, 512, dtype=torch.float32), meta(512, dtype=torch.float32)]
    norm, per_tensor = amp.multi_tensor_l2norm(65536, noop, [tensors], False)
    assert (norm.shape, norm.dtype, per_tensor.shape) == ((1,), torch.float32, (0,))
    assert amp.multi_tensor_l2norm(65536, noop, [tensors], True)[1].shape == (2,)
    amp.multi_tensor_scale(65536, noop, [tensors, tensors], 0.5)
    assert amp.multi_tensor_adam.__module__ == "interpose.device.cuda_extensions"
    with pytest.raises(NotImplementedError, match="amp_C.multi_tensor_lamb .*no cost model"):
        amp.multi_tensor_lamb()


# --- the cost of each kernel ---------------------------------------------------------------------

def test_causal_softmax_reads_the_lower_triangle_and_writes_everything(estimator, h100) -> None:
    b, s = 32, 4096  # 32 heads x micro-batch 1, sequence 4096: a 7B layer's scores
    x = cuda_tensor((b, s, s), BF16)
    tri = b * s * (s + 1) // 2
    fwd = estimator.estimate(sig("scaled_upper_triang_masked_softmax_forward", (x, 0.125), (x,)))
    assert fwd.kernel_name == "scaled_upper_triang_masked_softmax_warp_forward" and fwd.kernels == 1
    assert fwd.bytes == 2 * tri + 2 * b * s * s
    assert fwd.flops == 4 * tri
    assert fwd.duration_ns == pytest.approx(streaming_ns(fwd.bytes, h100), abs=1)
    bwd = estimator.estimate(sig("scaled_upper_triang_masked_softmax_backward_", (x, x, 0.125)))
    assert bwd.bytes == 2 * 2 * tri + 2 * b * s * s  # dy and y's triangles read, dx written in place
    assert bwd.duration_ns == pytest.approx(streaming_ns(bwd.bytes, h100), abs=1)


def test_padding_masked_softmax_reads_its_mask_once(estimator) -> None:
    x, mask = cuda_tensor((2, 16, 2048, 2048), BF16), cuda_tensor((2, 1, 2048, 2048), "bool")
    fwd = estimator.estimate(sig("scaled_masked_softmax_forward", (x, mask, 1.0), (x,)))
    assert fwd.bytes == 2 * x.numel + mask.numel + 2 * x.numel
    bwd = estimator.estimate(sig("scaled_masked_softmax_backward", (x, x, 1.0), (x,)))
    assert bwd.bytes == 3 * 2 * x.numel
    plain = estimator.estimate(sig("scaled_softmax_backward_", (x, x, 1.0)))
    assert plain.bytes == bwd.bytes  # in place: dy read and written


def test_layer_norms(estimator) -> None:
    rows, h = 8192, 4096
    x, w, stats = cuda_tensor((rows, h), BF16), cuda_tensor((h,), BF16), cuda_tensor((rows,))
    fused = estimator.estimate(sig("fused_layer_norm", (x, [h], w, w, 1e-5, False, False), (x, stats, stats)))
    # cuApplyLayerNorm: x read twice, y written, gamma and beta, fp32 mean and invvar
    assert fused.bytes == 2 * 2 * rows * h + 2 * 2 * h + 2 * rows * h + 2 * 4 * rows
    grads = (x, w, w)
    back = estimator.kernels(sig("fused_layer_norm_backward",
                                 (x, stats, stats, x, [h], w, w, 1e-5, False, False), grads))
    assert [k.name for k in back.kernels] == ["cuComputePartGradGammaBeta", "cuComputeGradGammaBeta",
                                              "cuComputeGradInput"]
    parts = 2 * 16 * h * 4  # fp32 partial dgamma and dbeta over 16 row blocks
    assert back.kernels[0].bytes == 2 * 2 * rows * h + 2 * 4 * rows + parts
    assert back.kernels[2].bytes == 2 * 2 * 2 * rows * h + 2 * 4 * rows + 2 * 2 * h + 2 * rows * h
    # the persistent kernel reads each row once
    fast = estimator.estimate(sig("fast_layer_norm_fwd", (x, w, w, 1e-5), (x, stats, stats)))
    assert fast.bytes == fused.bytes - 2 * rows * h
    assert fast.duration_ns < fused.duration_ns
    part = cuda_tensor((132, h))
    fast_back = estimator.kernels(sig("fast_layer_norm_bwd", (x, x, stats, stats, w, w, False),
                                      (x, w, w, part, part)))
    assert [k.name for k in fast_back.kernels] == ["ln_bwd_kernel", "ln_bwd_finalize_kernel"]
    assert fast_back.kernels[0].bytes == 3 * 2 * rows * h + 2 * 4 * rows + 2 * 2 * h + 2 * 132 * h * 4


def test_wgrad_is_one_gemm_accumulating_into_fp32_main_grad(estimator, h100) -> None:
    tokens, k_in, n_out = 8192, 4096, 12288  # a 7B layer's QKV projection, micro-batch 2 x 4096
    x, dy = cuda_tensor((4096, 2, k_in), BF16), cuda_tensor((4096, 2, n_out), BF16)
    main_grad = cuda_tensor((n_out, k_in))
    e = estimator.estimate(sig("wgrad_gemm_accum", (x, dy, main_grad)))
    assert e.kernels == 1 and e.kernel_name == "sm90_xmma_gemm_bf16bf16_f32f32"
    assert e.flops == 2 * tokens * k_in * n_out
    assert e.bytes == 2 * tokens * (k_in + n_out) + 2 * 4 * n_out * k_in  # main_grad read and written
    expected = gemm_kernel(GemmShape(n_out, k_in, tokens), BF16, "float32", e.bytes, CostContext(h100))
    assert e.duration_ns == round(expected.duration_ns)
    # compute-bound: within 30% of the GEMM's FLOPs at the bf16 dense peak x GEMM efficiency
    assert e.duration_ns < 1.3 * e.flops / (h100.peak_flops["bf16"] * h100.gemm_efficiency) * 1e9


def test_amp_c_multi_tensor_ops(estimator) -> None:
    grads = tuple(cuda_tensor((4096, 4096)) for _ in range(8)) + (cuda_tensor((4096,)),)
    n = sum(t.numel for t in grads)
    noop = cuda_tensor((1,), "int32")
    chunk = 2048 * 32  # apex.multi_tensor_apply's multi_tensor_applier
    # each 16 Mi-element tensor is 256 chunks: 2049 blocks of at most 320 per launch
    launches = math.ceil((8 * 256 + 1) / 320)
    norm = estimator.kernels(sig("multi_tensor_l2norm", (chunk, noop, grads, False),
                                 (cuda_tensor((1,)), cuda_tensor((0,)))))
    assert len(norm.kernels) == launches + 1 and norm.kernels[-1].name == "cleanup"
    assert sum(k.bytes for k in norm.kernels[:-1]) == 4 * n
    scale = estimator.kernels(sig("multi_tensor_scale", (chunk, noop, grads, grads, 0.5)))
    assert len(scale.kernels) == launches and sum(k.bytes for k in scale.kernels) == 2 * 4 * n
    # a smaller chunk size means more blocks: 4x the blocks of 16,384 elements
    small = estimator.kernels(sig("multi_tensor_scale", (chunk // 4, noop, grads, grads, 0.5)))
    assert len(small.kernels) == math.ceil((8 * 1024 + 1) / 320)
