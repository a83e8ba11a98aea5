"""Reductions, scans, sorting and selection: sum, mean, amax, var, norm, cumsum, sort, topk, ...

Reductions and scans stream their input once. Reducing a large input to a few values needs
several thread blocks per output and a final combine (a global semaphore pass in torch's
reduce_kernel): that costs a fixed extra. Sorting is modelled as CUB does it: an in-register
bitonic/radix sort per segment for short rows, else a onesweep radix sort with one read and
write of (key, index) pairs per 8-bit digit.
"""

from __future__ import annotations

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
    largest_tensor,
    single,
    streaming_kernel,
)
from phantora.ops import OpSignature, TensorMeta

# A reduction whose output is this many times smaller than its input splits each output over
# several blocks and pays a global combine step.
SPLIT_REDUCTION_RATIO = 64
SPLIT_REDUCTION_EXTRA_NS = 3_000
# Reducing the outer dims of a row-major tensor (bias gradients) strides across rows: H100
# profile of a GPT step's bias-gradient sums shows ~half the bandwidth of a contiguous sum.
COLUMN_REDUCTION_EFFICIENCY = 0.5
# Rows up to this length are sorted inside one block (bitonic / block radix sort).
SEGMENT_SORT_MAX = 4096
RADIX_BITS_PER_PASS = 8
INDEX_BYTES = 8  # sort/topk return int64 indices
# topk over rows this short runs sbtopk's per-row kernels (the H100 sweep's MoE routing shapes,
# 8-128 experts; fitted there as class "topk"); longer rows the radix select below.
TOPK_SHORT_ROW = 1024


def _biggest_input(sig: OpSignature) -> TensorMeta | None:
    return largest_tensor(input_tensors(sig))


def _is_column_reduction(x: TensorMeta | None, out: TensorMeta | None) -> bool:
    """Reducing outer dims and keeping the innermost one (bias gradients: [tokens, C] -> [C])."""
    if x is None or out is None or len(x.shape) < 2 or out.numel >= x.numel:
        return False
    return bool(out.shape) and out.shape[-1] == x.shape[-1] > 1


def reduction(sig: OpSignature, ctx: CostContext) -> OpCost:
    """Ops tagged `reduction` and the norms: one reduce_kernel over the input."""
    x = _biggest_input(sig)
    n_in = x.numel if x is not None else 0
    out = largest_tensor(sig.tensors_out())
    n_out = out.numel if out is not None else 1
    extra = SPLIT_REDUCTION_EXTRA_NS if n_in >= SPLIT_REDUCTION_RATIO * max(n_out, 1) and n_in > 65536 else 0.0
    efficiency = COLUMN_REDUCTION_EFFICIENCY if _is_column_reduction(x, out) else 1.0
    nbytes = bytes_read(sig) + bytes_written(sig)
    return single(streaming_kernel("reduce_kernel", ctx.gpu, nbytes, float(n_in), efficiency=efficiency,
                                   extra_ns=extra))


def two_pass_reduction(sig: OpSignature, ctx: CostContext) -> OpCost:
    """logsumexp, renorm, dist, allclose-like ops: a reduction, then a second pass over x."""
    x = _biggest_input(sig)
    first = reduction(sig, ctx).kernels[0]
    second = streaming_kernel("elementwise_kernel", ctx.gpu, footprint_bytes(x) + bytes_written(sig), float(x.numel))
    return OpCost((first, second))


def scan(sig: OpSignature, ctx: CostContext) -> OpCost:
    """cumsum, cumprod, logcumsumexp, cummax, cummin: one decoupled-lookback scan pass."""
    x = _biggest_input(sig)
    nbytes = bytes_read(sig) + bytes_written(sig)
    return single(streaming_kernel("tensor_kernel_scan_innermost_dim", ctx.gpu, nbytes, float(x.numel if x else 0)))


def _dim_size(x: TensorMeta, dim) -> int:
    if not x.shape:
        return 1
    return x.shape[(dim if isinstance(dim, int) else -1) % len(x.shape)]


def _radix_passes(dtype_bytes: int) -> int:
    return ceil_div(8 * dtype_bytes, RADIX_BITS_PER_PASS)


def sort_kernels(x: TensorMeta, segment: int, ctx: CostContext) -> tuple[Kernel, ...]:
    """Kernels to sort x's values with int64 indices along segments of `segment` elements."""
    pair_bytes = x.numel * (x.itemsize + INDEX_BYTES)
    if segment <= SEGMENT_SORT_MAX:
        return (streaming_kernel("radixSortKVInPlace", ctx.gpu, footprint_bytes(x) + pair_bytes, 10.0 * x.numel),)
    iota = streaming_kernel("fill_index_and_segment_kernel", ctx.gpu, x.numel * INDEX_BYTES)
    passes = tuple(
        streaming_kernel("DeviceSegmentedRadixSortKernel", ctx.gpu, 2 * pair_bytes, 4.0 * x.numel)
        for _ in range(_radix_passes(x.itemsize))
    )
    return (iota,) + passes


# How cub's onesweep radix sort of one segment splits its time (H100 sweep, argsort of 16k int64:
# onesweep 46.8 us, memset 13.6, histogram 3.1, exclusive sum 1.3).
ONESWEEP_SHARES = (("DeviceRadixSortHistogramKernel", 0.05), ("DeviceRadixSortExclusiveSumKernel", 0.02),
                   ("Memset", 0.21), ("DeviceRadixSortOnesweepKernel", 0.72))


def onesweep_sort_kernels(nbytes: float, ctx: CostContext) -> tuple[Kernel, ...]:
    """cub's onesweep radix sort of one segment of `nbytes` keys, timed by the sweep's class "sort"."""
    total = kernel_ns("sort", nbytes, 1, ctx.gpu)
    return tuple(Kernel(name, share * total, 0.0, nbytes if name.endswith("OnesweepKernel") else 0.0)
                 for name, share in ONESWEEP_SHARES)


def sort(sig: OpSignature, ctx: CostContext) -> OpCost:
    """sort(self, dim, descending) / sort.stable(self, *, stable, dim, descending), argsort.

    A sort of one long segment (MoE routing's argsort of expert ids) is cub's onesweep radix
    sort: histogram, scan, one pass per digit and a memset, whose time the H100 sweep shows is
    mostly fixed (argsort of 16k to 262k int64: 67-83 us; sweep_fit.py class "sort").
    """
    x = sig.args[0]
    dim = sig.args[2] if sig.overload in ("stable", "values_stable") else (sig.args[1] if len(sig.args) > 1 else -1)
    segment = _dim_size(x, dim)
    if segment == x.numel and segment > SEGMENT_SORT_MAX:
        return OpCost(onesweep_sort_kernels(float(footprint_bytes(x)), ctx))
    return OpCost(sort_kernels(x, segment, ctx))


def topk(sig: OpSignature, ctx: CostContext) -> OpCost:
    """topk(self, k, dim, largest, sorted): radix select (one read of x per 8-bit digit), then
    gather the k winners and sort them."""
    x, k = sig.args[0], sig.args[1]
    dim = sig.args[2] if len(sig.args) > 2 else -1
    if _dim_size(x, dim) <= TOPK_SHORT_ROW:
        # many short rows (MoE routing: top-k of 8-128 expert scores per token): sbtopk's
        # gatherTopK and a bitonic sort per row; H100 sweep, class "topk" (24 us for 8k x 8, 218
        # for 32k x 128 fp32: ~0.03 of streaming bandwidth beyond a fixed 21 us)
        nbytes = float(footprint_bytes(x))
        return OpCost((Kernel("gatherTopK", kernel_ns("topk", nbytes, 1, ctx.gpu) / 2, 0.0, nbytes),
                       Kernel("bitonicSortKVInPlace", kernel_ns("topk", nbytes, 1, ctx.gpu) / 2, 0.0, 0.0)))
    passes = _radix_passes(x.itemsize)
    select = tuple(
        streaming_kernel("radixFindKthValues", ctx.gpu, footprint_bytes(x), float(x.numel)) for _ in range(passes)
    )
    gather = streaming_kernel("gatherTopK", ctx.gpu, footprint_bytes(x) + bytes_written(sig))
    segment = k if isinstance(k, int) else _dim_size(x, dim)
    outs = sig.tensors_out()
    finish = sort_kernels(outs[0], segment, ctx) if outs and segment > 1 else ()
    return OpCost(select + (gather,) + finish)


def median_like(sig: OpSignature, ctx: CostContext) -> OpCost:
    """median, nanmedian, mode, kthvalue: a per-slice sort (or selection) of the input."""
    x = sig.args[0]
    dim = next((a for a in sig.args[1:] if isinstance(a, int) and not isinstance(a, bool)), -1)
    segment = x.numel if sig.overload == "default" else _dim_size(x, dim)
    return OpCost(sort_kernels(x, segment, ctx))


def unique(sig: OpSignature, ctx: CostContext) -> OpCost:
    """_unique, _unique2, unique_consecutive, unique_dim: sort, mark boundaries, scan, compact.

    The output size is data: the signature's outputs carry whatever bound the caller chose.
    """
    x = sig.args[0]
    consecutive = "consecutive" in sig.short_name
    kernels: tuple[Kernel, ...] = () if consecutive else sort_kernels(x, x.numel, ctx)
    mark = streaming_kernel("adjacent_difference_kernel", ctx.gpu, 2 * footprint_bytes(x))
    scan_k = streaming_kernel("DeviceScanKernel", ctx.gpu, 2 * x.numel * INDEX_BYTES)
    compact = streaming_kernel("DeviceSelectSweepKernel", ctx.gpu, footprint_bytes(x) + bytes_written(sig))
    return OpCost(kernels + (mark, scan_k, compact))


def histogram(sig: OpSignature, ctx: CostContext) -> OpCost:
    """bincount, histc, histogram, _histogramdd_*: zero the bins, then atomics over the input.

    bincount and histc follow the H100 sweep (sweep_fit.py classes "bincount", "histc"): mostly
    fixed time (bincount also reduces its input's min and max and copies them to the host:
    16-22 us for 16k-262k ids; histc 6.5-7.6 us).
    """
    if sig.short_name.rstrip("_") in ("bincount", "histc"):
        nbytes = float(bytes_read(sig))
        total = kernel_ns(sig.short_name.rstrip("_"), nbytes, 1, ctx.gpu)
        return OpCost((Kernel("FillFunctor", ctx.gpu.min_kernel_ns, 0.0, float(bytes_written(sig))),
                       Kernel("kernelHistogram1D", max(total - ctx.gpu.min_kernel_ns, 0.0), 0.0, nbytes)))
    zero = streaming_kernel("FillFunctor", ctx.gpu, bytes_written(sig))
    count = streaming_kernel("kernelHistogram1D", ctx.gpu, bytes_read(sig) + bytes_written(sig))
    return OpCost((zero, count))


def nonzero(sig: OpSignature, ctx: CostContext) -> OpCost:
    """nonzero, nonzero_static, masked_select, argwhere: count, (host reads the count), write.

    On a real GPU nonzero synchronizes the host to size its output; that wait is the engine's
    business (it sees the op name), not part of this GPU time.
    """
    x = _biggest_input(sig)
    if sig.short_name in ("nonzero", "nonzero_static", "argwhere"):
        # cub's select: reduce, scan, compact (H100 sweep, class "nonzero": 7.7-7.9 us for 8k-32k)
        nbytes = float(bytes_read(sig))
        total = kernel_ns("nonzero", nbytes, 1, ctx.gpu)
        return OpCost((Kernel("DeviceReduceKernel", total / 2, float(x.numel if x else 0), nbytes),
                       Kernel("DeviceSelectSweepKernel", total / 2, 0.0, float(bytes_written(sig)))))
    count = streaming_kernel("DeviceReduceKernel", ctx.gpu, bytes_read(sig), float(x.numel if x else 0))
    write = streaming_kernel("write_indices", ctx.gpu, bytes_read(sig) + bytes_written(sig))
    return OpCost((count, write))


def searchsorted(sig: OpSignature, ctx: CostContext) -> OpCost:
    """searchsorted / bucketize: a binary search per value; boundaries stay in cache."""
    return single(streaming_kernel("searchsorted_cuda_kernel", ctx.gpu, bytes_read(sig) + bytes_written(sig)))
