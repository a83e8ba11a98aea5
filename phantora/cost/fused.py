"""Kernels torch.compile generates (Inductor's Triton kernels), as interpose/compile/compiled_kernels.py
reports them: signature `triton::<kernel name>` with args (tensors read, tensors written,
elements processed, the aten ops fused in, Inductor's kernel kind).

A fused pointwise, reduction or normalization kernel streams the buffers that enter and leave it
once through HBM (what it fused stays in registers) and does one FLOP per element per fused op:
timed by the same bandwidth-by-size curve as the eager elementwise kernels it replaces
(roofline.elementwise_kernel: the curve fitted to the H100 kernel sweep's 120 elementwise
kernels, with its L2 term for small working sets), or the SIMT roofline where slower. Inductor templates (a GEMM with its epilogue
under max-autotune) are not modelled apart yet: they are timed as streaming kernels. The
flex-attention template is timed by the flex-attention model (attention.flex_template_kernel)
over the blocks its BlockMask visits.

Triton kernels the program launches itself (`triton_user::<function name>`,
interpose/compile/user_kernels.py) are timed apart (`user_triton_kernel`): bandwidth-bound over
their tensor arguments, no FLOPs.
"""

from __future__ import annotations

from phantora.cost import attention
from phantora.cost.roofline import (CostContext, OpCost, elementwise_kernel, footprint_bytes, single,
                                    streaming_kernel)
from phantora.ops import OpSignature, TensorMeta


def fused_bytes(sig: OpSignature) -> int:
    """Bytes the kernel moves: each buffer read once and each buffer written once."""
    reads, writes = sig.args[0], sig.args[1]
    return sum(footprint_bytes(t) for t in reads) + sum(footprint_bytes(t) for t in writes)


# Fused ops that only re-index (no arithmetic): they cost no FLOPs in the fused kernel.
_VIEWS = frozenset({"view", "_unsafe_view", "reshape", "t", "transpose", "permute", "expand", "unsqueeze",
                    "squeeze", "slice", "select", "as_strided", "alias", "clone", "_to_copy", "copy",
                    "split", "split_with_sizes", "cat", "constant_pad_nd", "full", "zeros", "ones"})


def fused_flops(sig: OpSignature) -> float:
    """One FLOP per element processed per fused op that computes (views and copies excluded)."""
    elements, ops = sig.args[2], sig.args[3]
    computing = [op for op in ops if op.rsplit(".", 1)[-1] not in _VIEWS]
    return float(elements) * max(1, len(computing))


def _compute_type(sig: OpSignature) -> str:
    tensors = [t for group in sig.args[:2] for t in group if isinstance(t, TensorMeta)]
    return "fp64" if any(t.dtype in ("float64", "complex128") for t in tensors) else "fp32"


def triton_kernel(sig: OpSignature, ctx: CostContext) -> OpCost:
    name = sig.name.split("::", 1)[-1]
    if len(sig.args) > 5 and isinstance(sig.args[5], tuple):
        # flex attention's template: (q, k, v, kv_num_blocks, kv block size, visited, backward)
        q, k, v, counts, kv_block, visited, backward = sig.args[5]
        return single(attention.flex_template_kernel(name, q, k, v, counts, kv_block, visited,
                                                     float(fused_bytes(sig)), bool(backward), ctx))
    return single(elementwise_kernel(name, ctx.gpu, float(fused_bytes(sig)), fused_flops(sig),
                                     compute_type=_compute_type(sig)))


def user_triton_kernel(sig: OpSignature, ctx: CostContext) -> OpCost:
    """A Triton kernel the program launched itself (`kernel[grid](...)`,
    interpose/compile/user_kernels.py): signature `triton_user::<jit function name>` with args
    (tensors read, tensors written, elements, (), "user"). Timed as bandwidth-bound over the
    bytes it reads and writes, with no FLOPs: right for the fused pointwise, normalization and
    gather kernels such code mostly is (SwiGLU, RMSNorm, RoPE, cross-entropy), a lower bound for
    compute-heavy ones. A GEMM-like user kernel (tl.dot in a K loop) is not recognised; it would
    be costed here from its launch (grid, BLOCK sizes, the operands' shapes) by the GEMM model."""
    name = sig.name.split("::", 1)[-1]
    return single(streaming_kernel(name, ctx.gpu, float(fused_bytes(sig)), 0.0, compute_type=_compute_type(sig)))
