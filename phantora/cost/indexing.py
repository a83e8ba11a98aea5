"""Embedding, gather/scatter, advanced indexing, masked ops, cat and stack.

Gathers read their indices plus the rows they select and write the result: bytes of the
indices + twice the output. Scatters read indices and source and write the source's volume
into the destination; an out-of-place scatter first clones its destination. Accumulating
scatters that must be deterministic (index_put_ with accumulate, embedding backward) sort the
indices first.
"""

from __future__ import annotations

import math

from phantora.cost.reductions import sort_kernels
from phantora.cost.fitted import kernel_ns
from phantora.cost.roofline import (
    CostContext,
    Kernel,
    OpCost,
    bytes_read,
    bytes_written,
    ceil_div,
    footprint_bytes,
    input_tensors,
    single,
    streaming_kernel,
)
from phantora.ops import OpSignature, TensorMeta

INDEX_BYTES = 8
EMBEDDING_BACKWARD_PIPELINE_NS = 45_000
EMBEDDING_BACKWARD_NS_PER_WEIGHT = 2.1
# torch's CatArrayBatchedCopy copies up to this many inputs per launch.
CAT_INPUTS_PER_KERNEL = 128


def _is_index(t: TensorMeta) -> bool:
    return t.dtype in ("int64", "int32", "int16", "int8", "uint8", "bool")


def _index_bytes(sig: OpSignature) -> float:
    return float(sum(footprint_bytes(t) for t in input_tensors(sig) if _is_index(t)))


def _is_inplace(sig: OpSignature) -> bool:
    return sig.short_name.endswith("_") or "out" in sig.tags


# --- gathers --------------------------------------------------------------------------------

def gather(sig: OpSignature, ctx: CostContext) -> OpCost:
    """embedding, index.Tensor, _unsafe_index, index_select, gather, take, _embedding_bag fwd:
    read the indices and the selected elements, write the output."""
    written = bytes_written(sig)
    nbytes = _index_bytes(sig) + 2 * written
    name = "indexSelectLargeIndex" if sig.short_name in ("embedding", "index_select") else "index_elementwise_kernel"
    return single(streaming_kernel(name, ctx.gpu, nbytes))


def embedding_bag(sig: OpSignature, ctx: CostContext) -> OpCost:
    """_embedding_bag(weight, indices, offsets, ...): gather rows and reduce them per bag."""
    weight, indices = sig.args[0], sig.args[1]
    row_bytes = footprint_bytes(weight) / max(weight.shape[0], 1)
    nbytes = footprint_bytes(indices) + indices.numel * row_bytes + bytes_written(sig)
    return single(streaming_kernel("EmbeddingBag_updateOutputKernel", ctx.gpu, nbytes))


def embedding_backward(sig: OpSignature, ctx: CostContext) -> OpCost:
    """embedding_dense_backward(grad_out, indices, num_weights, padding_idx, scale_by_freq) and
    the _embedding_bag backward ops.

    torch's deterministic path: zero the weight gradient, radix-sort the indices (only the bits
    that num_weights needs), find segment boundaries, sum each segment's gradient rows into
    partials, and add the partials into the weight gradient. The sort and segment kernels run
    few blocks with serial loops, so their time barely depends on bytes: a fixed pipeline cost
    plus a little per weight row, fitted to H100 profiles (8192 indices into 50304x768 fp32:
    248 us, zero fill ~50 us of it; into 8192x1024 and 1024x1024: 231 us together).
    """
    grad_out = sig.args[0]
    indices = next(t for t in sig.tensors_in()[1:] if _is_index(t))
    grad_weight = sig.tensors_out()[0]
    num_weights = grad_weight.shape[0] if grad_weight.shape else 1
    n = indices.numel
    bits = max(1, math.ceil(math.log2(max(num_weights, 2))))
    sort_names = ["DeviceRadixSortHistogramKernel"] + ["DeviceRadixSortOnesweepKernel"] * ceil_div(bits, 8)
    segment_names = ["krn_partials_per_segment", "krn_partial_segment_offset", "compute_grad_weight",
                     "sum_and_scatter"]
    pipeline_ns = EMBEDDING_BACKWARD_PIPELINE_NS / (len(sort_names) + len(segment_names))
    zero = streaming_kernel("FillFunctor", ctx.gpu, footprint_bytes(grad_weight))
    sort = tuple(streaming_kernel(name, ctx.gpu, 2 * n * 2 * INDEX_BYTES, extra_ns=pipeline_ns)
                 for name in sort_names)
    grad_bytes = footprint_bytes(grad_out)
    segments = tuple(
        streaming_kernel(name, ctx.gpu, 2 * grad_bytes if "grad" in name or "scatter" in name else 2 * n * INDEX_BYTES,
                         extra_ns=pipeline_ns + (EMBEDDING_BACKWARD_NS_PER_WEIGHT * num_weights
                                                 if name == "krn_partial_segment_offset" else 0.0))
        for name in segment_names
    )
    return OpCost((zero,) + sort + segments)


# --- scatters -------------------------------------------------------------------------------

def _clone_destination(sig: OpSignature, ctx: CostContext) -> tuple[Kernel, ...]:
    """Out-of-place scatters (index_put, scatter, index_add, ...) copy `self` first."""
    if _is_inplace(sig):
        return ()
    dest = sig.args[0]
    if not isinstance(dest, TensorMeta):
        return ()
    return (streaming_kernel("vectorized_elementwise_kernel<copy>", ctx.gpu, 2 * footprint_bytes(dest)),)


def _source_bytes(sig: OpSignature) -> float:
    """Bytes of the non-index tensors after the destination (values / src); 0 for fills."""
    ins = input_tensors(sig)[1:]
    return float(sum(footprint_bytes(t) for t in ins if not _is_index(t)))


def scatter(sig: OpSignature, ctx: CostContext) -> OpCost:
    """scatter(_), scatter_add(_), scatter_reduce(_), index_add(_), index_copy(_), index_fill(_),
    index_reduce(_), put(_), _unsafe_masked_index_put_accumulate: read indices and source,
    write the source's volume into the destination."""
    src = _source_bytes(sig)
    index = _index_bytes(sig)
    if src == 0:  # index_fill: the write volume is what the index selects along the row
        src = index
    base = sig.short_name.rstrip("_")
    if base in ("index_add", "scatter_add"):
        # accumulating with atomics (read-modify-write of the destination rows): H100 sweep,
        # sweep_fit.py classes "index_add" (indexFuncLargeIndex, 0.24 of streaming bandwidth
        # over 3x the source bytes) and "scatter_add" (0.52)
        k = Kernel("indexFuncLargeIndex" if base == "index_add" else "scatter_gather_elementwise_kernel",
                   kernel_ns(base, 3.0 * src, 1, ctx.gpu), 0.0, index + 3.0 * src)
        return OpCost(_clone_destination(sig, ctx) + (k,))
    k = streaming_kernel("scatter_gather_elementwise_kernel", ctx.gpu, index + 2 * src)
    return OpCost(_clone_destination(sig, ctx) + (k,))


def index_put(sig: OpSignature, ctx: CostContext) -> OpCost:
    """index_put(_)(self, indices, values, accumulate) / _index_put_impl_ / _unsafe_index_put.

    accumulate=True takes the deterministic sort-based path (index_put_with_sort_kernel).
    """
    accumulate = next((a for a in sig.args[3:] if isinstance(a, bool)), False)
    values = sig.args[2] if len(sig.args) > 2 and isinstance(sig.args[2], TensorMeta) else None
    index_tensors = [t for t in (sig.args[1] if isinstance(sig.args[1], tuple) else ()) if isinstance(t, TensorMeta)]
    n_index = max((t.numel for t in index_tensors), default=0)
    index = float(sum(footprint_bytes(t) for t in index_tensors))
    src = float(footprint_bytes(values)) if values is not None else 0.0
    # values broadcast over the indexed positions: write volume follows the indices
    written = max(src, n_index * (values.itemsize if values is not None else 4))
    kernels: tuple[Kernel, ...] = _clone_destination(sig, ctx)
    if accumulate and index_tensors:
        kernels += sort_kernels(index_tensors[0], index_tensors[0].numel, ctx)
        name = "indexing_backward_kernel"
    else:
        name = "index_put_kernel"
    kernels += (streaming_kernel(name, ctx.gpu, index + src + written),)
    return OpCost(kernels)


def masked_scatter(sig: OpSignature, ctx: CostContext) -> OpCost:
    """masked_scatter(_)(self, mask, source): prefix sum over the mask, then the scatter."""
    mask = next(t for t in sig.tensors_in()[1:] if t.dtype == "bool")
    scan = streaming_kernel("DeviceScanKernel", ctx.gpu, footprint_bytes(mask) + mask.numel * INDEX_BYTES)
    dest = sig.args[0]
    write = streaming_kernel("masked_scatter_kernel", ctx.gpu,
                             footprint_bytes(mask) + mask.numel * INDEX_BYTES + 2 * footprint_bytes(dest))
    return OpCost(_clone_destination(sig, ctx) + (scan, write))


# --- cat / stack ----------------------------------------------------------------------------

def cat(sig: OpSignature, ctx: CostContext) -> OpCost:
    """cat / stack / _stack / _chunk_cat (tensors, dim): read every input, write the output,
    in batches of up to CAT_INPUTS_PER_KERNEL inputs per launch."""
    inputs = [t for t in sig.args[0] if isinstance(t, TensorMeta)] if isinstance(sig.args[0], tuple) else []
    inputs = [t for t in inputs if t.numel]
    written = bytes_written(sig)
    launches = max(1, ceil_div(len(inputs), CAT_INPUTS_PER_KERNEL))
    total = float(sum(footprint_bytes(t) for t in inputs) + written)
    per_launch = total / launches
    return OpCost(tuple(streaming_kernel("CatArrayBatchedCopy", ctx.gpu, per_launch) for _ in range(launches)))


def generic_memory(sig: OpSignature, ctx: CostContext) -> OpCost:
    """One memory-bound kernel over everything the op reads and writes."""
    return single(streaming_kernel(sig.short_name + "_kernel", ctx.gpu, bytes_read(sig) + bytes_written(sig)))
