"""Ops that move data with little arithmetic: materialized views (*_copy), flips, rolls,
repeats, padding, pooling, upsampling, and the backward ops that scatter a gradient into zeros
(select_backward, slice_backward, *_scatter).

Each is one memory-bound kernel over the bytes it reads and writes, plus a zero fill of the
destination where the op first clears it.
"""

from __future__ import annotations

from phantora.cost.roofline import (
    CostContext,
    Kernel,
    OpCost,
    bytes_read,
    bytes_written,
    footprint_bytes,
    input_tensors,
    single,
    sm_rate_per_ns,
    streaming_kernel,
)
from phantora.ops import OpSignature, TensorMeta


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


# Max pooling visits every (output, window tap) pair: the forward loads each tap of each window,
# the backward walks, for each input position, the windows that contain it. Overlapping windows
# (3x3 stride 2) make that 2.25 loads per input element, served mostly from L1/L2, so the
# kernels are bound by the taps, not HBM. H100 profile, ResNet-50 stem (shared/groundtruth/
# h100_resnet50_b128: 128x64x112^2 bf16 channels_last, 3x3/2 -> 56^2, 231M taps):
# max_pool_forward_nhwc 433 us (4.05 taps/ns per SM; streaming its 462 MB would take 155 us),
# max_pool_backward_nhwc 913 us (1.92 taps/ns per SM) after a 63 us zero fill. One point each:
# fitted, not validated; the NCHW kernels are assumed to walk the same taps. Stated per clock
# (the H100's boost clock is 1.98 GHz) so that they carry to another GPU by SMs x clock.
MAX_POOL_FORWARD_TAPS_PER_CLK_PER_SM = 4.05 / 1.98
MAX_POOL_BACKWARD_TAPS_PER_CLK_PER_SM = 1.92 / 1.98


def _window_taps(out: TensorMeta, sig: OpSignature, at: int) -> float:
    """Output elements times window volume; the kernel_size argument sits at index `at`."""
    ksize = sig.args[at] if len(sig.args) > at and isinstance(sig.args[at], tuple) else ()
    dims = len(out.shape) - 2
    kvol = 1
    for v in (ksize * dims if len(ksize) == 1 else ksize)[:dims]:
        kvol *= max(int(v), 1)
    return float(out.numel * kvol)


def _tap_bound(name: str, ctx: CostContext, nbytes: float, taps: float, taps_per_clk_per_sm: float) -> Kernel:
    k = streaming_kernel(name, ctx.gpu, nbytes)
    tap_ns = ctx.gpu.kernel_ramp_ns + taps / sm_rate_per_ns(ctx.gpu, taps_per_clk_per_sm)
    return Kernel(name, max(k.duration_ns, tap_ns), 0.0, nbytes)


def max_pool(sig: OpSignature, ctx: CostContext) -> OpCost:
    """max_pool{2,3}d_with_indices(self, kernel_size, stride, padding, dilation, ceil_mode)."""
    out = sig.tensors_out()[0]
    nbytes = float(bytes_read(sig) + bytes_written(sig))
    return single(_tap_bound("max_pool_forward_kernel", ctx, nbytes, _window_taps(out, sig, 1),
                             MAX_POOL_FORWARD_TAPS_PER_CLK_PER_SM))


def max_pool_backward(sig: OpSignature, ctx: CostContext) -> OpCost:
    """max_pool{2,3}d_with_indices_backward(grad_output, self, kernel_size, ..., indices): zero
    grad_input, then gather each input's gradient from the windows that hold it."""
    grad_out = sig.args[0]
    written = bytes_written(sig)
    zero = streaming_kernel("FillFunctor", ctx.gpu, written)
    scatter = _tap_bound("max_pool_backward_kernel", ctx, float(bytes_read(sig) + written),
                         _window_taps(grad_out, sig, 2), MAX_POOL_BACKWARD_TAPS_PER_CLK_PER_SM)
    return OpCost((zero, scatter))


# --- FSDP2's copy ops (torch.ops.fsdp, _fsdp_collectives.py): the copies around its collectives

def _tensor_list_bytes(arg: object) -> int:
    return sum(footprint_bytes(t) for t in arg if isinstance(t, TensorMeta)) if isinstance(arg, tuple) else 0


def fsdp_all_gather_copy_in(sig: OpSignature, ctx: CostContext) -> OpCost:
    """(all_gather_inputs, all_gather_output, ...): a _foreach_copy_ of this rank's shards into
    its slice of the all-gather buffer."""
    nbytes = _tensor_list_bytes(sig.args[0])
    return single(streaming_kernel("multi_tensor_apply_kernel<copy>", ctx.gpu, 2 * nbytes))


def fsdp_split_with_sizes_copy(sig: OpSignature, ctx: CostContext) -> OpCost:
    """(all_gather_output, split_sizes, dim, out=[...]): one kernel copying the gathered buffer
    out into each unsharded parameter."""
    src = sig.args[0]
    nbytes = footprint_bytes(src) if isinstance(src, TensorMeta) else 0
    return single(streaming_kernel("split_with_sizes_copy_out_contiguous_no_cast_kernel", ctx.gpu, 2 * nbytes))


def fsdp_chunk_cat(sig: OpSignature, ctx: CostContext) -> OpCost:
    """(gradients, dim, num_chunks, out=...): _chunk_cat of the unsharded gradients into the
    reduce-scatter input, padded to world-size chunks."""
    out = sig.args[3] if len(sig.args) > 3 else None  # the keyword `out`, in schema order
    written = footprint_bytes(out) if isinstance(out, TensorMeta) else _tensor_list_bytes(sig.args[0])
    return single(streaming_kernel("chunk_cat_cuda_kernel", ctx.gpu, _tensor_list_bytes(sig.args[0]) + written))
