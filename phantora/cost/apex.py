"""Apex's and Megatron's fused CUDA kernels (the apex:: ops of interpose/device/apex_kernels.py).

Each is costed as the kernel it is, with the rules of the families it belongs to:
- Megatron's fused softmaxes (csrc/megatron/scaled_*softmax*.h) are warp softmaxes: a row (up
  to 16,384 columns) lives in one warp's registers, so the input is read once and the output
  written once, as torch's softmax_warp_forward (normalization.py), scale and mask folded in.
  The causal kernel reads only the lower triangle of each [s, s] matrix (row i: i + 1 elements)
  and writes all of it (zeros above the diagonal); its backward likewise reads the lower
  triangles of the gradient and the probabilities and writes the whole gradient, in place.
  The padding mask (uint8/bool, [1 or b, 1, sq, sk]) is shared by the heads and counted once.
- fused_layer_norm_cuda's LayerNorm / RMSNorm: cuApplyLayerNorm reads each row twice (Welford
  statistics, then normalize) and writes it once, as torch's layer norm; backward is
  cuComputePartGradGammaBeta (dy and x once, fp32 partial sums over 16 row blocks),
  cuComputeGradGammaBeta (the partials to dgamma/dbeta) and cuComputeGradInput (dy and x twice,
  as torch's grad-input kernel).
- the persistent LayerNorm (fast_layer_norm's ln_fwd / ln_bwd) keeps each row in registers: one
  read of x and one write of z forward; backward one read of dz and x, dx written and per-CTA
  partial sums, then ln_bwd_finalize over the partials.
- wgrad_gemm_accum (fused_weight_gradient_mlp_cuda): one cuBLAS GEMM d_weight += d_output^T @ x
  with beta 1, timed by gemm.py (M = out features, N = in features, K = tokens) with the fp32 (or
  16-bit) d_weight both read and written.
- amp_C's multi-tensor ops: Apex's multi_tensor_apply, the launch rule torch's copies
  (optimizers.py: depth-dependent tensors per launch, 320 blocks) with the caller's chunk size,
  streaming what they read and write.
"""

from __future__ import annotations

from phantora.cost.gemm import GemmShape, gemm_kernel
from phantora.cost.normalization import FLOPS_PER_ELEMENT as NORM_FLOPS_PER_ELEMENT
from phantora.cost.optimizers import MAX_BLOCKS_PER_LAUNCH, multi_tensor_kernels
from phantora.cost.roofline import CostContext, OpCost, footprint_bytes, single, streaming_kernel
from phantora.ops import OpSignature, TensorMeta

SOFTMAX_FLOPS_PER_ELEMENT = 4.0  # scale, max, exp and sum, normalize (softmax forward in normalization.py)
SOFTMAX_BACKWARD_FLOPS_PER_ELEMENT = 3.0
# cuComputePartGradGammaBeta's row blocks (layer_norm_cuda_kernel.cu part_size)
LAYER_NORM_PART_SIZE = 16


def _bytes(*ts: object) -> float:
    return float(sum(footprint_bytes(t) for t in ts if isinstance(t, TensorMeta)))


def _lower_triangle_elements(x: TensorMeta) -> int:
    """Elements on and below the diagonal of each trailing [s, s] matrix."""
    s = x.shape[-1]
    return x.numel // (s * s) * s * (s + 1) // 2 if s else 0


# --- softmax -------------------------------------------------------------------------------------

def upper_triang_softmax(sig: OpSignature, ctx: CostContext) -> OpCost:
    """scaled_upper_triang_masked_softmax_forward(x [B, s, s]) and backward_(dy, y): the causal kernel."""
    x = sig.args[0]
    tri = _lower_triangle_elements(x)
    if sig.short_name.endswith("_backward_"):
        nbytes = 2.0 * tri * x.itemsize + footprint_bytes(x)
        return single(streaming_kernel("scaled_upper_triang_masked_softmax_warp_backward", ctx.gpu, nbytes,
                                       SOFTMAX_BACKWARD_FLOPS_PER_ELEMENT * tri))
    nbytes = float(tri * x.itemsize) + _bytes(*sig.tensors_out())
    return single(streaming_kernel("scaled_upper_triang_masked_softmax_warp_forward", ctx.gpu, nbytes,
                                   SOFTMAX_FLOPS_PER_ELEMENT * tri))


def scaled_softmax(sig: OpSignature, ctx: CostContext) -> OpCost:
    """scaled_masked_softmax_forward(x, mask) / scaled_softmax_forward(x) and their backwards
    (dy, y): one warp-softmax kernel over [b, np, sq, sk]."""
    x = sig.args[0]
    name = sig.short_name
    if "backward" in name:
        written = footprint_bytes(x) if name.endswith("_") else _bytes(*sig.tensors_out())  # in place: dy
        nbytes = _bytes(sig.args[0], sig.args[1]) + written
        kernel = "scaled_masked_softmax_warp_backward"
        return single(streaming_kernel(kernel, ctx.gpu, nbytes, SOFTMAX_BACKWARD_FLOPS_PER_ELEMENT * x.numel))
    mask = sig.args[1] if isinstance(sig.args[1], TensorMeta) else None
    nbytes = _bytes(x, mask) + _bytes(*sig.tensors_out())
    kernel = "scaled_masked_softmax_warp_forward" if mask is not None else "scaled_softmax_warp_forward"
    return single(streaming_kernel(kernel, ctx.gpu, nbytes, SOFTMAX_FLOPS_PER_ELEMENT * x.numel))


# --- layer norm ----------------------------------------------------------------------------------

def fused_layer_norm(sig: OpSignature, ctx: CostContext) -> OpCost:
    """fused_layer_norm(input, shape, gamma, beta, eps, rms, mixed): cuApplyLayerNorm / cuApplyRMSNorm."""
    x, gamma, beta, rms = sig.args[0], sig.args[2], sig.args[3], sig.args[5]
    nbytes = 2.0 * footprint_bytes(x) + _bytes(gamma, beta) + _bytes(*sig.tensors_out())
    name = "cuApplyRMSNorm" if rms else "cuApplyLayerNorm"
    return single(streaming_kernel(name, ctx.gpu, nbytes, NORM_FLOPS_PER_ELEMENT * x.numel))


def fused_layer_norm_backward(sig: OpSignature, ctx: CostContext) -> OpCost:
    """fused_layer_norm_backward(dout, mean, invvar, x_or_y, shape, gamma, beta, ...): with
    gamma, the partial and final parameter-gradient kernels; always the grad-input kernel."""
    dy, mean, invvar, x, gamma, beta, rms = (sig.args[i] for i in (0, 1, 2, 3, 5, 6, 9))
    stats = _bytes(mean, invvar)
    outs = sig.tensors_out()
    kernels = []
    if isinstance(gamma, TensorMeta):
        n2 = gamma.numel
        parts = (1 if rms else 2) * LAYER_NORM_PART_SIZE * n2 * 4.0
        kernels.append(streaming_kernel("cuComputePartGradGammaBeta", ctx.gpu,
                                        _bytes(dy, x) + stats + parts, 4.0 * x.numel))
        kernels.append(streaming_kernel("cuComputeGradGammaBeta", ctx.gpu, parts + _bytes(*outs[1:]),
                                        float(parts / 4.0)))
    nbytes = 2.0 * _bytes(dy, x) + stats + _bytes(gamma, beta if not rms else None) + _bytes(outs[0])
    kernels.append(streaming_kernel("cuComputeGradInput", ctx.gpu, nbytes, 8.0 * x.numel))
    return OpCost(tuple(kernels))


def fast_layer_norm(sig: OpSignature, ctx: CostContext) -> OpCost:
    """fast_layer_norm_fwd(x, gamma, beta) / _bwd(dz, x_or_z, mu, rsigma, gamma, beta): the
    persistent LayerNorm, each row read once."""
    if sig.short_name == "fast_layer_norm_fwd":
        x = sig.args[0]
        nbytes = _bytes(x, sig.args[1], sig.args[2]) + _bytes(*sig.tensors_out())
        return single(streaming_kernel("ln_fwd_kernel", ctx.gpu, nbytes, NORM_FLOPS_PER_ELEMENT * x.numel))
    dz, x, mu, rsigma, gamma, beta = sig.args[:6]
    dx, dgamma, dbeta, dgamma_part, dbeta_part = sig.tensors_out()
    parts = _bytes(dgamma_part, dbeta_part)
    main = streaming_kernel("ln_bwd_kernel", ctx.gpu, _bytes(dz, x, mu, rsigma, gamma, beta, dx) + parts,
                            8.0 * x.numel)
    finalize = streaming_kernel("ln_bwd_finalize_kernel", ctx.gpu, parts + _bytes(dgamma, dbeta), parts / 4.0)
    return OpCost((main, finalize))


# --- weight gradient into main_grad --------------------------------------------------------------

def wgrad_gemm_accum(sig: OpSignature, ctx: CostContext) -> OpCost:
    """wgrad_gemm_accum(input [..., K_in], d_output [..., N_out], d_weight [N_out, K_in]):
    d_weight += d_output^T @ input, one GEMM over all tokens accumulating into d_weight."""
    x, dy, dw = sig.args[0], sig.args[1], sig.args[2]
    tokens = x.numel // x.shape[-1] if x.shape and x.shape[-1] else 0
    shape = GemmShape(dw.shape[0], dw.shape[1], tokens)
    nbytes = _bytes(x, dy) + 2.0 * footprint_bytes(dw)
    return single(gemm_kernel(shape, x.dtype, dw.dtype, nbytes, ctx))


# --- amp_C multi-tensor ops ----------------------------------------------------------------------

def _list(a: object) -> list[TensorMeta]:
    return [t for t in a if isinstance(t, TensorMeta)] if isinstance(a, tuple) else []


def multi_tensor(sig: OpSignature, ctx: CostContext) -> OpCost:
    """multi_tensor_scale(chunk, noop, src, dst, scale), multi_tensor_axpby(chunk, noop, x, y,
    out, a, b, check) and multi_tensor_l2norm(chunk, noop, tensors, per_tensor): one
    multi_tensor_apply launch per chunk set, streaming the lists; l2norm adds the cleanup kernel
    that reduces the per-block partial norms."""
    chunk = int(sig.args[0])
    name = sig.short_name
    if name == "multi_tensor_l2norm":
        tensors = _list(sig.args[2])
        numels = [t.numel for t in tensors]
        kernels = multi_tensor_kernels("multi_tensor_apply_kernel<L2NormFunctor>", numels, 1, _bytes(*tensors), 2.0,
                                       ctx, chunk_elements=chunk)
        per_tensor = bool(sig.args[3])
        partials = 4.0 * (MAX_BLOCKS_PER_LAUNCH + (len(tensors) if per_tensor else 0))
        return OpCost(kernels + (streaming_kernel("cleanup", ctx.gpu, partials + _bytes(*sig.tensors_out())),))
    lists = [_list(a) for a in sig.args[2:] if isinstance(a, tuple)]
    functor, flops = ("ScaleFunctor", 1.0) if name == "multi_tensor_scale" else ("AxpbyFunctor", 3.0)
    nbytes = sum(_bytes(*lst) for lst in lists)
    return OpCost(multi_tensor_kernels(f"multi_tensor_apply_kernel<{functor}>", [t.numel for t in lists[0]],
                                       len(lists), nbytes, flops, ctx, chunk_elements=chunk))

