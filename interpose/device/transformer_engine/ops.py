"""The kernels of Transformer Engine's core library as torch ops (namespace `nvte`).

Each op stands for one call of the core library's C API that TE's extension makes
(nvte_cublas_gemm_v2, nvte_layernorm_fwd, ...). They write their results into tensors the caller
allocated, as the C API does (the extension allocates with at::empty first, and so does
extension.py, so the memory model sees the same buffers), and return nothing: their fake
kernels have nothing to do. The observer reports them like any op and
phantora/cost/transformer_engine.py times them (phantora/cost/families.py QUALIFIED_FAMILIES).
"""

from __future__ import annotations

from typing import Any

import torch

NAMESPACE = "nvte"

SCHEMAS = (
    # D = op(B) @ op(A) in TE's (cuBLAS column-major) convention: A [.., K] with transa, B [.., K]
    # without transb, D [.., N]; bias is read (forward) or written (grad: dbias epilogue);
    # aux is the pre-GELU output (forward, gelu) or its input (grad, dgelu epilogue).
    # sm_margin: SMs left to communication kernels running beside it (cuBLASLt's math_sm_count is
    # the GPU's SMs less this; userbuffers' pipelined and bulk overlaps)
    "cublas_gemm(Tensor A, bool transa, Tensor B, bool transb, Tensor(a!) D, Tensor(b!)? bias, "
    "Tensor(c!)? aux, Tensor? A_scale_inv, Tensor? B_scale_inv, Tensor(d!) workspace, bool accumulate, "
    "bool grad, bool gelu, int sm_margin=0) -> ()",
    "layernorm_fwd(Tensor x, Tensor gamma, Tensor? beta, Tensor(a!) z, Tensor(b!) mu, Tensor(c!) rsigma, "
    "float eps, bool zero_centered_gamma) -> ()",
    "rmsnorm_fwd(Tensor x, Tensor gamma, Tensor(a!) z, Tensor(b!) rsigma, float eps, "
    "bool zero_centered_gamma) -> ()",
    "layernorm_bwd(Tensor dz, Tensor x, Tensor mu, Tensor rsigma, Tensor gamma, Tensor(a!) dx, "
    "Tensor(b!) dgamma, Tensor(c!) dbeta, bool zero_centered_gamma) -> ()",
    "rmsnorm_bwd(Tensor dz, Tensor x, Tensor rsigma, Tensor gamma, Tensor(a!) dx, Tensor(b!) dgamma, "
    "bool zero_centered_gamma) -> ()",
    # an activation (gelu, swiglu, ...; gated ones halve the last dimension) and its backward, with
    # the bias gradient fused in (dbias_d*) when dbias is given
    "activation(Tensor x, Tensor(a!) y, str kind) -> ()",
    "activation_bwd(Tensor dy, Tensor x, Tensor(a!) dx, Tensor(b!)? dbias, str kind) -> ()",
    # the scaled (masked) softmax kernels of unfused attention, kind: scaled, scaled_masked,
    # scaled_upper_triang_masked, scaled_aligned_causal_masked
    "softmax_fwd(Tensor x, Tensor? mask, Tensor(a!) y, float scale, str kind) -> ()",
    "softmax_bwd(Tensor dy, Tensor y, Tensor(a!) dx, float scale, str kind) -> ()",
    # FP8 per-tensor scaling: x cast to FP8 with `scale` (rowwise data and/or its transpose), amax
    # of x written (delayed scaling: into the quantizer's amax; current scaling computes it first,
    # nvte::compute_amax), scale_inv written; `dbias` given: the column sums of x too (bgrad_quantize);
    # `act` names an activation (or its backward, with dy) fused before the cast
    "cast_transpose(Tensor x, Tensor? dy, Tensor scale, Tensor(a!)? amax, Tensor(b!) scale_inv, Tensor(c!)? data, "
    "Tensor(d!)? transpose, Tensor(e!)? dbias, str act) -> ()",
    "compute_amax(Tensor x, Tensor(a!) amax) -> ()",
    # block-scaled FP8: x cast in blocks with a scale per block, along rows (rowwise data and scales)
    # and/or along columns (columnwise; stored transposed for FP8 block scaling), optionally fused
    # with an activation (its backward with dy) and the bias gradient. recipe: "mxfp8" (blocks of
    # 32, E8M0 scales), "block1d" / "block2d" (1x128 / 128x128 blocks, fp32 scales)
    "quantize_blocks(Tensor x, Tensor? dy, Tensor(a!)? rowwise, Tensor(b!)? rowwise_scale_inv, "
    "Tensor(c!)? columnwise, Tensor(d!)? columnwise_scale_inv, Tensor(e!)? dbias, str act, str recipe) -> ()",
    "compute_scale(Tensor amax, Tensor(a!) scale, Tensor(b!) scale_inv) -> ()",
    # an FP8 tensor's transpose (fp8_transpose) or its conversion back to high precision
    "fp8_transpose(Tensor x, Tensor(a!) out) -> ()",
    "dequantize(Tensor x, Tensor scale_inv, Tensor(a!) out) -> ()",
    # the delayed-scaling recipe's update: each amax history rolled with the reduced amax, each
    # scale recomputed (one multi-tensor kernel)
    "amax_and_scale_update(Tensor amax_reduction_buffer, Tensor(a!)[] amax_histories, Tensor(b!)[] scales) -> ()",
    # cuDNN's fused attention (the F16_arbitrary_seqlen sub-backend): q, k, v (and a post-scale
    # bias) read, o and the fp32 softmax statistics written; backward reads q, k, v, o, do and the
    # statistics and writes dq, dk, dv (and dbias) through its workspace. The shape the kernels
    # work on is given as the extension read it from the layout: batch (THD: sequences), query
    # heads, the (mean) query and key lengths, the head dimensions, whether the mask is causal, and
    # the sliding window's reach to the left and right of the diagonal (-1: unbounded).
    "fused_attn_fwd(Tensor q, Tensor k, Tensor v, Tensor? bias, Tensor(a!) o, Tensor(b!) stats, int batch, "
    "int heads, int seq_q, int seq_kv, int head_dim_qk, int head_dim_v, bool causal, int window_left, "
    "int window_right) -> ()",
    "fused_attn_bwd(Tensor q, Tensor k, Tensor v, Tensor o, Tensor do, Tensor stats, Tensor(a!) dq, Tensor(b!) dk, "
    "Tensor(c!) dv, Tensor(d!)? dbias, Tensor(e!) workspace, int batch, int heads, int seq_q, int seq_kv, "
    "int head_dim_qk, int head_dim_v, bool causal, int window_left, int window_right) -> ()",
    # rotary position embedding applied to x (or its gradient, backward) with fp32 freqs [s, 1, 1, d]
    "rope(Tensor x, Tensor freqs, Tensor(a!) y, bool backward) -> ()",
    # multi-tensor apply kernels (chunks of every tensor of the lists in a few launches): dst = src *
    # scale with a non-finite check into noop; the L2 norm of a list (partial sums per chunk, then a
    # cleanup kernel into norm, and per tensor when asked)
    "multi_tensor_scale(Tensor(a!) noop, Tensor[] src, Tensor(b!)[] dst, Tensor? scale) -> ()",
    # multi_tensor_compute_scale_and_scale_inv: each amax read, its scale and scale_inv written
    "multi_tensor_compute_scale(Tensor(a!) noop, Tensor[] amaxes, Tensor(b!)[] scales, Tensor(c!)[] scale_invs) -> ()",
    "multi_tensor_l2norm(Tensor(a!) noop, Tensor[] tensors, Tensor(b!) partials, Tensor(c!) norm, "
    "Tensor(d!) partials_per_tensor, Tensor(e!) norm_per_tensor) -> ()",
    # the fused MoE router (router.py): kind "topk" reads the logits (and the expert bias) and
    # writes the probabilities, the routing map (or dense indices) and the fp32 intermediate; kind
    # "aux_scores" the same for the auxiliary loss's scores; backward reads the routing map (topk),
    # the intermediate and the gradient, and writes the logits' gradient
    "router_fwd(Tensor logits, Tensor? expert_bias, Tensor(a!) probs, Tensor(b!) routing, Tensor(c!) intermediate, "
    "str kind) -> ()",
    "router_bwd(Tensor? routing, Tensor intermediate, Tensor grad, Tensor(a!) grad_logits, str kind) -> ()",
    # the auxiliary load-balancing loss: the probabilities and the tokens per expert read, the
    # scalar loss and two fp32 constants written; backward writes the probabilities' gradient
    "aux_loss_fwd(Tensor probs, Tensor tokens_per_expert, Tensor(a!) aux_loss, Tensor(b!) const_buf) -> ()",
    "aux_loss_bwd(Tensor const_buf, Tensor tokens_per_expert, Tensor grad_aux_loss, Tensor(a!) grad_probs) -> ()",
    # the GEMMs of a group (GroupedLinear: one per expert), each as cublas_gemm's D_i = op(B_i) op(A_i)^T,
    # run by the core library on its compute streams (nvte_multi_stream_cublas_gemm); bias_i read, or
    # written (grad)
    "grouped_gemm(Tensor[] A, bool transa, Tensor[] B, bool transb, Tensor(a!)[] D, Tensor(b!)[] bias, "
    "bool accumulate, bool grad) -> ()",
)

_lib: Any = None


def define_ops() -> None:
    global _lib
    if _lib is not None:
        return
    _lib = torch.library.Library(NAMESPACE, "DEF")

    def nothing(*args: Any) -> None:
        return None

    for schema in SCHEMAS:
        _lib.define(schema)
        name = schema.split("(", 1)[0]
        # the kernels write through data pointers; no real implementation ever runs
        _lib.impl(name, nothing, "CompositeExplicitAutograd")
        torch.library.register_fake(f"{NAMESPACE}::{name}", nothing, lib=_lib)
