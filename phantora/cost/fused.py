"""Kernels torch.compile generates (Inductor's Triton kernels), as interpose/compiled_kernels.py
reports them: signature `triton::<kernel name>` with args (tensors read, tensors written,
elements processed, the aten ops fused in, Inductor's kernel kind).

A fused pointwise, reduction or normalization kernel streams the buffers that enter and leave it
once through HBM (what it fused stays in registers) and does one FLOP per element per fused op:
the same memory and SIMT rooflines, ramp and efficiency as the eager pointwise and reduction
kernels it replaces (roofline.streaming_kernel). Inductor templates (a GEMM with its epilogue
under max-autotune) are timed like the GEMM: their FLOPs are the product's.
"""

from __future__ import annotations

from phantora.cost.roofline import CostContext, OpCost, footprint_bytes, single, streaming_kernel
from phantora.ops import OpSignature, TensorMeta


def fused_bytes(sig: OpSignature) -> int:
    """Bytes the kernel moves: each buffer read once and each buffer written once."""
    reads, writes = sig.args[0], sig.args[1]
    return sum(footprint_bytes(t) for t in reads) + sum(footprint_bytes(t) for t in writes)


def fused_flops(sig: OpSignature) -> float:
    elements, ops = sig.args[2], sig.args[3]
    return float(elements) * max(1, len(ops))


def _compute_type(sig: OpSignature) -> str:
    tensors = [t for group in sig.args[:2] for t in group if isinstance(t, TensorMeta)]
    return "fp64" if any(t.dtype in ("float64", "complex128") for t in tensors) else "fp32"


def triton_kernel(sig: OpSignature, ctx: CostContext) -> OpCost:
    name = sig.name.split("::", 1)[-1]
    return single(streaming_kernel(name, ctx.gpu, float(fused_bytes(sig)), fused_flops(sig),
                                   compute_type=_compute_type(sig)))
