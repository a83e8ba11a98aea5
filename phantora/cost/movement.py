"""Ops that move data with little arithmetic: materialized views (*_copy), flips, rolls,
repeats, padding, pooling, upsampling, and the backward ops that scatter a gradient into zeros
(select_backward, slice_backward, *_scatter).

Each is one memory-bound kernel over the bytes it reads and writes, plus a zero fill of the
destination where the op first clears it.
"""

from __future__ import annotations

from phantora.cost.roofline import (
    CostContext,
    OpCost,
    bytes_read,
    bytes_written,
    footprint_bytes,
    input_tensors,
    single,
    streaming_kernel,
)
from phantora.ops import OpSignature


def copy_like(sig: OpSignature, ctx: CostContext) -> OpCost:
    """Read the inputs once, write the outputs once."""
    name = f"{sig.short_name.removesuffix('_')}_kernel"
    return single(streaming_kernel(name, ctx.gpu, bytes_read(sig) + bytes_written(sig)))


def scatter_into_zeros(sig: OpSignature, ctx: CostContext) -> OpCost:
    """select_backward / slice_backward / diagonal_backward / unfold_backward (grad, sizes, ...):
    zero the full-size gradient, then copy the incoming gradient into its slice."""
    written = bytes_written(sig)
    grad = input_tensors(sig)[0]
    zero = streaming_kernel("FillFunctor", ctx.gpu, written)
    copy = streaming_kernel("elementwise_kernel<copy>", ctx.gpu, 2 * footprint_bytes(grad))
    return OpCost((zero, copy))


def scatter_into_copy(sig: OpSignature, ctx: CostContext) -> OpCost:
    """slice_scatter / select_scatter / diagonal_scatter / as_strided_scatter (self, src, ...):
    clone self, then copy src into the slice."""
    ins = input_tensors(sig)
    clone = streaming_kernel("vectorized_elementwise_kernel<copy>", ctx.gpu, 2 * footprint_bytes(ins[0]))
    src = ins[1] if len(ins) > 1 else ins[0]
    copy = streaming_kernel("elementwise_kernel<copy>", ctx.gpu, 2 * footprint_bytes(src))
    return OpCost((clone, copy))


def pool_backward(sig: OpSignature, ctx: CostContext) -> OpCost:
    """max_pool*_with_indices_backward, fractional/adaptive max pool backward, interpolating
    upsample backward: zero grad_input, then accumulate grad_output into it."""
    written = bytes_written(sig)
    zero = streaming_kernel("FillFunctor", ctx.gpu, written)
    scatter = streaming_kernel(f"{sig.short_name}_kernel", ctx.gpu, bytes_read(sig) + written)
    return OpCost((zero, scatter))
