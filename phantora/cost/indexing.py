"""Embedding, gather/scatter, advanced indexing, masked ops, cat and stack.

Gathers read their indices plus the rows they select and write the result: bytes of the
indices + twice the output. Scatters read indices and source and write the source's volume
into the destination; an out-of-place scatter first clones its destination. Accumulating
scatters that must be deterministic (index_put_ with accumulate, embedding backward) sort the
indices first.
"""

from __future__ import annotations


from phantora.cost.reductions import onesweep_sort_kernels, sort_kernels
from phantora.cost.fitted import kernel_ns
from phantora.cost.roofline import (
    CostContext,
    Kernel,
    OpCost,
    bytes_read,
    bytes_written,
    ceil_div,
    elementwise_kernel,
    footprint_bytes,
    input_tensors,
    single,
    streaming_kernel,
)
from phantora.ops import OpSignature, TensorMeta

INDEX_BYTES = 8
# embedding_dense_backward_cuda takes a sort-free kernel up to this many indices (ATen source,
# Embedding.cu: num_indices <= 3072 and not scale_grad_by_freq).
EMBEDDING_DIRECT_MAX_INDICES = 3072
# That kernel (embedding_backward_feature_kernel) runs a block of 32 x 32 threads per 32 features;
# each block walks the indices 32 rows at a time, and each such chunk is two dependent memory round
# trips (load the rows' gradient; then the warp leading each group of equal indices adds into its
# row of grad_weight), so its time is chunks x a latency, nearly whatever the width. Per chunk,
# with grad_weight's rows in L2: 0.89 us, the median of the H100 profiles' position embeddings
# (tests/data/groundtruth/examples: 512 and 1,024 ids, widths 512-1,024, fp32: 0.87-0.91 us);
# held out, the lent H200's (0.87-0.91 us). With rows in HBM: 1.88 us, from the lent H200's one
# profile of a table far larger than L2 (Llama 8B-shaped, 2,048 ids into 128,256 x 4,096 bf16:
# 116.5 us a call); between the two, by the share of the table L2 holds.
FEATURE_CHUNK_ROWS = 32
FEATURE_CHUNK_L2_NS = 890.0
FEATURE_CHUNK_HBM_NS = 1880.0
# The small kernels of the embedding backward's segment pipeline (H100 sweep kernel lists).
EMBEDDING_PIPELINE_KERNELS = ("arange_cuda_out", "DeviceCompactInitKernel", "DeviceUniqueByKeySweepKernel",
                              "DeviceScanInitKernel", "DeviceScanKernel", "krn_partials_per_segment",
                              "compute_num_of_partial_segments", "krn_partial_segment_offset")
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

    torch's deterministic path: zero the weight gradient, radix-sort the indices, find segment
    boundaries (a handful of small cub and segment kernels), sum each segment's gradient rows into
    partials (compute_grad_weight) and add them into the weight gradient (sum_and_scatter). Timed by
    the H100 sweep's curves (sweep_fit.py; 8192 ids into 32000x2048 .. 128256x4096 fp32): the sort
    as class "sort" (cub's onesweep: ~65 us whatever the size), the small kernels as
    "embedding_pipeline" (~15 us), the two segment kernels as "embedding_segments" (their time
    follows the gradient's bytes at ~0.27 TB/s together, not the number of weight rows). A
    gradient with broadcast strides (the backward of a `.sum()`) is made contiguous first. Up to
    3072 indices torch skips the sort (embedding_backward_feature_kernel, feature_kernel_ns). Held
    out: an H100 profile of 8192 ids into 50304x768 fp32 (tests/data/groundtruth/h100_kernel_profile.json)
    took 248.5 us, modelled 250.5; the GPT examples' real profiles (tests/data/groundtruth/examples,
    self time, so without the zero fill): token embeddings of 8192 ids 199-213 us (modelled +0..+7%;
    the model before the sweep -2..-3%), of 4096 ids 106-131 us (+19..+33%; before +36, -21%).
    Position embeddings of 512-1024 ids (the sort-free kernel) 14.5-29 us: -2..+2% (fitted; by the
    segment kernels' curve +47..+135%).
    """
    grad_out = sig.args[0]
    indices = next(t for t in sig.tensors_in()[1:] if _is_index(t))
    grad_weight = sig.tensors_out()[0]
    n = indices.numel
    dense_grad = float(grad_out.numel * grad_out.itemsize)
    kernels = [elementwise_kernel("FillFunctor", ctx.gpu, float(footprint_bytes(grad_weight)))]
    if footprint_bytes(grad_out) < dense_grad:  # broadcast: contiguous() writes it out
        kernels.append(elementwise_kernel("elementwise_kernel<direct_copy>", ctx.gpu, 2 * dense_grad))
    if n <= EMBEDDING_DIRECT_MAX_INDICES:
        kernels.append(Kernel("embedding_backward_feature_kernel", feature_kernel_ns(n, grad_weight, ctx),
                              float(grad_out.numel), dense_grad))
        return OpCost(tuple(kernels))
    index_bytes = float(n * INDEX_BYTES)
    kernels += onesweep_sort_kernels(index_bytes, ctx)
    pipeline = kernel_ns("embedding_pipeline", index_bytes, 1, ctx.gpu)
    kernels += [Kernel(name, pipeline / len(EMBEDDING_PIPELINE_KERNELS), 0.0, 0.0) for name in EMBEDDING_PIPELINE_KERNELS]
    segments = kernel_ns("embedding_segments", dense_grad, 1, ctx.gpu)
    kernels.append(Kernel("compute_grad_weight", segments / 2, float(grad_out.numel), dense_grad))
    kernels.append(Kernel("sum_and_scatter", segments / 2, float(grad_out.numel), dense_grad))
    return OpCost(tuple(kernels))


def feature_kernel_ns(n: int, grad_weight: TensorMeta, ctx: CostContext) -> float:
    """torch's embedding_backward_feature_kernel for n indices into grad_weight [rows, width]:
    ceil(n / 32) chunks a block, at the latency of grad_weight rows in L2 or in HBM (by the share
    of the table L2 holds), in as many waves as its width / 32 blocks of 1,024 threads need at two
    blocks an SM."""
    width = grad_weight.shape[-1] if grad_weight.shape else 1
    table = float(footprint_bytes(grad_weight))
    in_l2 = min(1.0, ctx.gpu.l2_cache_bytes / table) if table else 1.0
    per_chunk = FEATURE_CHUNK_HBM_NS - (FEATURE_CHUNK_HBM_NS - FEATURE_CHUNK_L2_NS) * in_l2
    waves = ceil_div(ceil_div(width, 32), 2 * ctx.gpu.sm_count)
    return ceil_div(n, FEATURE_CHUNK_ROWS) * per_chunk * waves


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
