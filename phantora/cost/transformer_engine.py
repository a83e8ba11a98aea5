"""Transformer Engine's kernels: the `nvte::` ops of phantora's TE extension stand-in.

interpose/device/transformer_engine/ops.py issues one op per call of TE's core library (the
schemas there). They are timed with the models of the kernels they are, on the same shapes:

- nvte::cublas_gemm is a cuBLASLt GEMM: the GEMM model of phantora/cost/gemm.py (tile waves at
  the GPU's peak for the operands' dtype, FP8 at the FP8 rate; memory roofline), with TE's shape
  rule (the extension's getGemmOutputShape: A [.., K] read transposed when `transa`, B [.., K]
  when not `transb`, D = op(B) op(A)^T) and its epilogue's bytes (bias read or dbias written, the
  pre-GELU output written or read, D read back when accumulating); beside userbuffers'
  communication kernels, on the SMs they leave (`sm_margin`).
- nvte::layernorm_fwd / rmsnorm_fwd are TE's fused norm kernels: costed as torch's layer norm
  kernel (normalization.py: the row read twice, written once; the params; mu and rsigma).
- nvte::layernorm_bwd / rmsnorm_bwd: TE's tuned backward keeps a row's dz and x in registers, so
  dz, x and the statistics are read once and dx written once; its per-CTA fp32 partial sums of
  dgamma (and dbeta), one row per SM, are reduced by a second, finalize kernel.
- nvte::activation / activation_bwd: elementwise kernels streaming their tensors (and the bias
  gradient's column sums, fused in TE's dbias_d* kernels, written once).
- nvte::fused_attn_fwd / fused_attn_bwd: cuDNN's fused attention, timed as torch's cuDNN SDPA
  kernels (attention.py) on the shape the extension read from TE's layout.
- nvte::router_fwd / router_bwd / aux_loss_fwd / aux_loss_bwd: TE's fused MoE router and
  load-balancing loss, streaming kernels over the [tokens, experts] logits and what they write.
- nvte::softmax_fwd / softmax_bwd: TE's (Megatron's) warp softmax kernels keep a row in registers:
  the scores (and the mask) read once and the probabilities written once; backward reads dy and
  y once and writes dx.
"""

from __future__ import annotations

from dataclasses import replace

from phantora.cost.attention import AttentionCall, AttentionShape, backend_attention_cost, with_window
from phantora.cost.gemm import (OPERAND_STREAMING_EFFICIENCY, GemmShape, gemm_kernel, gemm_kernel_name,
                                grouped_gemm_compute_ns)
from phantora.cost.normalization import FLOPS_PER_ELEMENT as NORM_FLOPS_PER_ELEMENT
from phantora.cost.optimizers import multi_tensor_kernels
from phantora.cost.roofline import (CostContext, Kernel, OpCost, footprint_bytes, matmul_compute_type, memory_ns,
                                    single, streaming_kernel)
from phantora.ops import OpSignature, TensorMeta

# Arithmetic per element of the activations (a GELU's tanh approximation is ~8 operations; the
# gated ones add the product with the gate). The kernels are memory-bound; this only sets FLOPs.
ACTIVATION_FLOPS = 8.0
ACTIVATION_BWD_FLOPS = 12.0


def _bytes(*ts: object) -> float:
    return float(sum(footprint_bytes(t) for t in ts if isinstance(t, TensorMeta)))


def _flat2d(shape: tuple[int, ...]) -> tuple[int, int]:
    rows = 1
    for s in shape[:-1]:
        rows *= s
    return rows, (shape[-1] if shape else 1)


def gemm_shape(a: TensorMeta, transa: bool, b: TensorMeta, transb: bool) -> GemmShape:
    """(M, N, K) of D[M, N] = op(B)[M, K] @ op(A)[K, N]^T, row-major, in TE's convention."""
    a0, a1 = _flat2d(a.shape)
    b0, b1 = _flat2d(b.shape)
    n, k = (a0, a1) if transa else (a1, a0)
    m = b1 if transb else b0
    return GemmShape(m, n, k)


def cublas_gemm(sig: OpSignature, ctx: CostContext) -> OpCost:
    """nvte::cublas_gemm(A, transa, B, transb, D, bias, aux, A_scale_inv, B_scale_inv, workspace,
    accumulate, grad, gelu, sm_margin): with sm_margin, on that many SMs fewer (cuBLASLt's
    math_sm_count, beside userbuffers' communication kernels)."""
    a, transa, b, transb, d, bias, aux, a_scale, b_scale = sig.args[:9]
    accumulate = bool(sig.args[10])
    sm_margin = int(sig.args[13]) if len(sig.args) > 13 else 0
    if sm_margin:
        ctx = replace(ctx, gpu=replace(ctx.gpu, sm_count=max(1, ctx.gpu.sm_count - sm_margin)))
    shape = gemm_shape(a, bool(transa), b, bool(transb))
    nbytes = _bytes(a, b, d, bias, aux, a_scale, b_scale) + (_bytes(d) if accumulate else 0.0)
    return single(gemm_kernel(shape, a.dtype, d.dtype, nbytes, ctx, dtype_b=b.dtype))


def norm_fwd(sig: OpSignature, ctx: CostContext) -> OpCost:
    """nvte::layernorm_fwd(x, gamma, beta, z, mu, rsigma, ..) / rmsnorm_fwd(x, gamma, z, rsigma, ..)."""
    x = sig.args[0]
    tensors = [t for t in sig.args[1:] if isinstance(t, TensorMeta)]
    nbytes = 2.0 * footprint_bytes(x) + _bytes(*tensors)
    layer = sig.short_name == "layernorm_fwd"
    name = "transformer_engine::normalization::ln_fwd_tuned_kernel" if layer else \
        "transformer_engine::normalization::rmsnorm_fwd_tuned_kernel"
    return single(streaming_kernel(name, ctx.gpu, nbytes, NORM_FLOPS_PER_ELEMENT * x.numel))


def norm_bwd(sig: OpSignature, ctx: CostContext) -> OpCost:
    """nvte::layernorm_bwd(dz, x, mu, rsigma, gamma, dx, dgamma, dbeta, ..) /
    rmsnorm_bwd(dz, x, rsigma, gamma, dx, dgamma, ..)."""
    layer = sig.short_name == "layernorm_bwd"
    tensors = [t for t in sig.args if isinstance(t, TensorMeta)]
    grads = tensors[-2:] if layer else tensors[-1:]  # dgamma (, dbeta)
    dz, x = tensors[0], tensors[1]
    _, hidden = _flat2d(x.shape)
    partials = float(ctx.gpu.sm_count * hidden * 4 * len(grads))  # fp32 partial sums, one row per CTA
    main_bytes = _bytes(*tensors[:-len(grads)]) + partials  # dz, x, stats, gamma read; dx written
    prefix = "transformer_engine::normalization::" + ("ln" if layer else "rmsnorm")
    main = streaming_kernel(f"{prefix}_bwd_tuned_kernel", ctx.gpu, main_bytes, 8.0 * x.numel)
    finalize = streaming_kernel(f"{prefix}_bwd_finalize_tuned_kernel", ctx.gpu, partials + _bytes(*grads),
                                float(ctx.gpu.sm_count * hidden * len(grads)))
    del dz
    return OpCost((main, finalize))


def activation(sig: OpSignature, ctx: CostContext) -> OpCost:
    """nvte::activation(x, y, kind)."""
    x, y, kind = sig.args[0], sig.args[1], sig.args[2]
    return single(streaming_kernel(f"transformer_engine::{kind}_kernel", ctx.gpu, _bytes(x, y),
                                   ACTIVATION_FLOPS * x.numel))


def activation_bwd(sig: OpSignature, ctx: CostContext) -> OpCost:
    """nvte::activation_bwd(dy, x, dx, dbias, kind)."""
    dy, x, dx, dbias, kind = sig.args[:5]
    name = f"transformer_engine::d{kind}_kernel" if dbias is None else f"transformer_engine::dbias_d{kind}_kernel"
    return single(streaming_kernel(name, ctx.gpu, _bytes(dy, x, dx, dbias), ACTIVATION_BWD_FLOPS * x.numel))


SOFTMAX_FLOPS = 5.0  # scale, max, exp, sum, divide per element (memory-bound; sets FLOPs only)


def softmax_fwd(sig: OpSignature, ctx: CostContext) -> OpCost:
    """nvte::softmax_fwd(x, mask, y, scale, kind)."""
    x, mask, y, _, kind = sig.args[:5]
    return single(streaming_kernel(f"{kind}_softmax_warp_forward", ctx.gpu, _bytes(x, mask, y),
                                   SOFTMAX_FLOPS * x.numel))


def softmax_bwd(sig: OpSignature, ctx: CostContext) -> OpCost:
    """nvte::softmax_bwd(dy, y, dx, scale, kind)."""
    dy, y, dx, _, kind = sig.args[:5]
    return single(streaming_kernel(f"{kind}_softmax_warp_backward", ctx.gpu, _bytes(dy, y, dx),
                                   3.0 * dy.numel))


# --- FP8 per-tensor scaling ----------------------------------------------------------------------


def _fused_quantize_kernel(base: str, x: TensorMeta, dy: object, dbias: object, act: object,
                           flops_per_element: float, nbytes: float, ctx: CostContext) -> Kernel:
    """A quantizing kernel named as TE names its fusions: with an activation (`act`; its backward
    when dy is given) and the bias gradient. Its FLOPs are the activation's per element when
    fused, else `flops_per_element` (the scaling and cast)."""
    if act:
        base += f"_fused_d{act}" if isinstance(dy, TensorMeta) else f"_fused_{act}"
    if isinstance(dbias, TensorMeta):
        base += "_dbias"
    per_element = (ACTIVATION_BWD_FLOPS if isinstance(dy, TensorMeta) else ACTIVATION_FLOPS) if act else flops_per_element
    return streaming_kernel(f"transformer_engine::{base}_kernel", ctx.gpu, nbytes, per_element * x.numel)


def cast_transpose(sig: OpSignature, ctx: CostContext) -> OpCost:
    """nvte::cast_transpose(x, dy, scale, amax, scale_inv, data, transpose, dbias, act): TE's cast
    (data only), cast_transpose (both) and their fusions with an activation (act; its backward when
    dy is given) and the bias gradient: x (and dy) read once, each FP8 output written once."""
    x, dy, scale, amax, scale_inv, data, transpose, dbias, act = sig.args[:9]
    nbytes = _bytes(x, dy, scale, amax, scale_inv, data, transpose, dbias)
    both = isinstance(data, TensorMeta) and isinstance(transpose, TensorMeta)
    base = "cast_transpose" if both else ("transpose" if isinstance(transpose, TensorMeta) else "cast")
    return single(_fused_quantize_kernel(base, x, dy, dbias, act, 2.0, nbytes, ctx))


def compute_amax(sig: OpSignature, ctx: CostContext) -> OpCost:
    """nvte::compute_amax(x, amax): one read of x (current scaling)."""
    x, amax = sig.args[:2]
    return single(streaming_kernel("transformer_engine::amax_kernel", ctx.gpu, _bytes(x, amax), float(x.numel)))


def compute_scale(sig: OpSignature, ctx: CostContext) -> OpCost:
    """nvte::compute_scale(amax, scale, scale_inv): a one-thread kernel (launch-bound)."""
    return single(streaming_kernel("transformer_engine::compute_scale_from_amax_kernel", ctx.gpu,
                                   _bytes(*sig.args[:3]), 4.0))


def fp8_transpose(sig: OpSignature, ctx: CostContext) -> OpCost:
    """nvte::fp8_transpose(x, out): FP8 data read once, its transpose written once."""
    x, out = sig.args[:2]
    return single(streaming_kernel("transformer_engine::transpose_kernel", ctx.gpu, _bytes(x, out)))


def dequantize(sig: OpSignature, ctx: CostContext) -> OpCost:
    """nvte::dequantize(x, scale_inv, out)."""
    x, scale_inv, out = sig.args[:3]
    return single(streaming_kernel("transformer_engine::dequantize_kernel", ctx.gpu, _bytes(x, scale_inv, out),
                                   float(x.numel)))


def amax_and_scale_update(sig: OpSignature, ctx: CostContext) -> OpCost:
    """nvte::amax_and_scale_update(buffer, amax_histories, scales): the delayed-scaling recipe's one
    kernel: the reduced amaxes read, each history read and written (rolled), each scale written."""
    buffer, histories, scales = sig.args[:3]
    nbytes = _bytes(buffer) + 2.0 * _bytes(*histories) + 2.0 * _bytes(*scales)
    return single(streaming_kernel("transformer_engine::delayed_scaling::kernel", ctx.gpu, nbytes,
                                   float(sum(h.numel for h in histories))))


def rope(sig: OpSignature, ctx: CostContext) -> OpCost:
    """nvte::rope(x, freqs, y, backward): x and the fp32 freqs read once, y written once."""
    x, freqs, y, backward = sig.args[:4]
    name = "transformer_engine::fused_rope_backward_kernel" if backward else "transformer_engine::fused_rope_forward_kernel"
    return single(streaming_kernel(name, ctx.gpu, _bytes(x, freqs, y), 4.0 * x.numel))


# Arithmetic per logit of the fused router: the score function (an exp or a sigmoid), the
# top-k's comparisons and the normalisation of the chosen probabilities
ROUTER_FLOPS_PER_ELEMENT = 8.0


def router(sig: OpSignature, ctx: CostContext) -> OpCost:
    """nvte::router_fwd / router_bwd: TE's fused router kernels, one CTA per few tokens keeping a
    token's logits in registers: every tensor read or written once."""
    kind = sig.args[-1]
    tensors = [t for t in sig.args if isinstance(t, TensorMeta)]
    backward = sig.short_name == "router_bwd"
    stem = "fused_topk_with_score_function" if kind == "topk" else "fused_score_for_moe_aux_loss"
    name = f"transformer_engine::{stem}_{'backward' if backward else 'forward'}_kernel"
    logits = tensors[-1] if backward else tensors[0]
    return single(streaming_kernel(name, ctx.gpu, _bytes(*tensors), ROUTER_FLOPS_PER_ELEMENT * logits.numel))


def aux_loss(sig: OpSignature, ctx: CostContext) -> OpCost:
    """nvte::aux_loss_fwd / aux_loss_bwd: the load-balancing loss, a reduction over the
    probabilities (forward) or their gradient written (backward)."""
    tensors = [t for t in sig.args if isinstance(t, TensorMeta)]
    backward = sig.short_name == "aux_loss_bwd"
    probs = tensors[-1] if backward else tensors[0]
    name = f"transformer_engine::fused_moe_aux_loss_{'backward' if backward else 'forward'}_kernel"
    return single(streaming_kernel(name, ctx.gpu, _bytes(*tensors), 2.0 * probs.numel))


def fused_attn(sig: OpSignature, ctx: CostContext) -> OpCost:
    """nvte::fused_attn_fwd / _bwd: cuDNN's fused flash attention, timed as torch's cuDNN SDPA
    kernels on the same shape (attention.py: the main loop over (query block, key block) pairs,
    backward's dO.O row sums and dQ conversion). Read and written: q, k, v, the bias, o and the
    statistics (backward also do, dq, dk, dv, dbias); not the workspace, which the dq accumulation
    inside the main loop stands for."""
    backward = sig.name == "nvte::fused_attn_bwd"
    tensors = [t for t in sig.args[:10 if backward else 6] if isinstance(t, TensorMeta)]
    batch, heads, seq_q, seq_kv, d_qk, d_v, causal, left, right = sig.args[11 if backward else 6:]
    shape = with_window(AttentionShape(batch, heads, seq_q, seq_kv, d_qk, d_v, bool(causal)), left, right)
    return backend_attention_cost(AttentionCall("cudnn", shape, sig.args[0].dtype, tuple(tensors), backward), ctx)


def multi_tensor_scale(sig: OpSignature, ctx: CostContext) -> OpCost:
    """nvte::multi_tensor_scale(noop, src, dst, scale): multi_tensor_apply over 2 lists, each
    source read and each destination written once."""
    src, dst = list(sig.args[1]), list(sig.args[2])
    return OpCost(multi_tensor_kernels("multi_tensor_apply_kernel<ScaleFunctor>", [t.numel for t in src], 2,
                                       _bytes(*src, *dst), 1.0, ctx))


def multi_tensor_compute_scale(sig: OpSignature, ctx: CostContext) -> OpCost:
    """nvte::multi_tensor_compute_scale(noop, amaxes, scales, scale_invs): multi_tensor_apply over
    3 lists of one-element tensors (launch-bound)."""
    amaxes, scales, scale_invs = (list(a) for a in sig.args[1:4])
    return OpCost(multi_tensor_kernels("multi_tensor_apply_kernel<ComputeScaleAndScaleInvFunctor>",
                                       [t.numel for t in amaxes], 3, _bytes(*amaxes, *scales, *scale_invs), 4.0,
                                       ctx))


def multi_tensor_l2norm(sig: OpSignature, ctx: CostContext) -> OpCost:
    """nvte::multi_tensor_l2norm(noop, tensors, partials, norm, partials_per_tensor, norm_per_tensor):
    multi_tensor_apply over 1 list (each tensor read once into per-block partial sums), then the
    cleanup kernel reducing the partials into the norm(s)."""
    tensors = list(sig.args[1])
    partials, norm, partials_pt, norm_pt = sig.args[2:6]
    kernels = multi_tensor_kernels("multi_tensor_apply_kernel<L2NormFunctor>", [t.numel for t in tensors], 1,
                                   _bytes(*tensors, partials, partials_pt), 2.0, ctx)
    cleanup = streaming_kernel("cleanup", ctx.gpu, _bytes(partials, norm, partials_pt, norm_pt),
                               float(partials.numel + partials_pt.numel))
    return OpCost((*kernels, cleanup)) if kernels else OpCost(())


def grouped_gemm(sig: OpSignature, ctx: CostContext) -> OpCost:
    """nvte::grouped_gemm(A[], transa, B[], transb, D[], bias[], accumulate, grad): the core library
    runs the group's cuBLAS GEMMs on its compute streams (4), so they overlap on the GPU; timed as
    one grouped kernel over every group's tiles (gemm.grouped_gemm_compute_ns, as torch's grouped
    GEMM: a group smaller than a tile costs a tile), at least the memory time of all operands."""
    a_list, transa, b_list, transb, d_list, bias_list, accumulate = sig.args[:7]
    problems = [gemm_shape(a, bool(transa), b, bool(transb)) for a, b in zip(a_list, b_list)]
    if not problems:
        return OpCost(())
    gpu = ctx.gpu
    compute_type = matmul_compute_type(a_list[0].dtype, ctx.allow_tf32)
    nbytes = _bytes(*a_list, *b_list, *d_list, *bias_list) + (_bytes(*d_list) if accumulate else 0.0)
    flops = sum(p.flops for p in problems)
    compute = grouped_gemm_compute_ns(problems, compute_type, gpu)
    memory = memory_ns(nbytes, gpu, OPERAND_STREAMING_EFFICIENCY) - gpu.kernel_ramp_ns
    name = gemm_kernel_name(gpu, compute_type, d_list[0].dtype, (a_list[0].dtype, b_list[0].dtype)) + \
        f" (multi-stream x{len(problems)})"
    return single(Kernel(name, max(compute, memory) + gpu.kernel_ramp_ns, flops, nbytes))


def quantize_blocks(sig: OpSignature, ctx: CostContext) -> OpCost:
    """nvte::quantize_blocks(x, dy, rowwise, rowwise_scale_inv, columnwise, columnwise_scale_inv,
    dbias, act, recipe): one pass over x (and dy), each requested FP8 copy and its block scales
    written once (MXFP8: E8M0, one byte per 32 elements; block scaling: fp32 per 128 or 128x128)."""
    x, dy, rowwise, rowwise_scale, columnwise, columnwise_scale, dbias, act, recipe = sig.args[:9]
    nbytes = _bytes(x, dy, rowwise, rowwise_scale, columnwise, columnwise_scale, dbias)
    both = isinstance(rowwise, TensorMeta) and isinstance(columnwise, TensorMeta)
    base = ("quantize_mxfp8" if recipe == "mxfp8" else f"quantize_fp8_{recipe}") + ("_rowwise_colwise" if both else "")
    return single(_fused_quantize_kernel(base, x, dy, dbias, act, 3.0, nbytes, ctx))
