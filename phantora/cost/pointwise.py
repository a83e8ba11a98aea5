"""Elementwise ops, fills and factories, and random number generation.

All of these stream their operands once through HBM: time is the memory roofline of bytes read
plus bytes written (broadcast inputs counted once), with a SIMT compute roofline that only
matters for fp64 or very arithmetic-heavy functions. Pointwise ops and fills follow the
elementwise curve fitted to the H100 kernel sweep (roofline.elementwise_kernel: small working
sets are partly served from L2).
"""

from __future__ import annotations

from phantora.cost.fitted import kernel_ns
from phantora.cost.roofline import (
    CostContext,
    Kernel,
    OpCost,
    bytes_read,
    bytes_written,
    elementwise_kernel,
    fill_kernel,
    footprint_bytes,
    input_tensors,
    largest_tensor,
    single,
    streaming_kernel,
)
from phantora.ops import OpSignature, TensorMeta

# Philox counter-based RNG costs ~10 integer ops per 4 random numbers plus the transform
# (Box-Muller for normal): RNG kernels reach ~80% of a plain fill's bandwidth.
RNG_EFFICIENCY = 0.8
# Elementwise FLOPs counted per output element (torch.utils.flop_counter counts none; we count
# one so that traces show where arithmetic happens without pretending to precision).
FLOPS_PER_ELEMENT = 1.0


def _elements(sig: OpSignature) -> int:
    outs = sig.tensors_out()
    t = largest_tensor(outs) or largest_tensor(input_tensors(sig))
    return t.numel if t is not None else 0


def _compute_type(sig: OpSignature) -> str:
    return "fp64" if any(t.dtype in ("float64", "complex128") for t in sig.tensors_out()) else "fp32"


def is_dense(t: TensorMeta) -> bool:
    """Non-overlapping and dense: contiguous in some order of its dims (channels_last is)."""
    expected = 1
    for stride, size in sorted((st, sz) for sz, st in zip(t.shape, t.stride) if sz != 1):
        if stride != expected:
            return False
        expected *= size
    return True


def _is_vectorizable(sig: OpSignature) -> bool:
    """torch's vectorized_elementwise_kernel needs dense operands laid out like the output (TensorIterator
    walks a channels_last tensor as a contiguous one: the H100 profile of examples/cnn_train.py runs its
    NHWC relu, add and threshold_backward in vectorized_elementwise_kernel)."""
    outs = sig.tensors_out()
    if not outs:
        return False
    out = outs[0]
    if not is_dense(out):
        return False
    return all(t.numel == 1 or _same_layout(t, out) for t in input_tensors(sig) + outs)


def _same_layout(a: TensorMeta, b: TensorMeta) -> bool:
    return a.shape == b.shape and all(sa == sb for sz, sa, sb in zip(a.shape, a.stride, b.stride) if sz != 1)


def elementwise_kernel_name(sig: OpSignature) -> str:
    return "vectorized_elementwise_kernel" if _is_vectorizable(sig) else "elementwise_kernel"


def _is_16bit_gelu(sig: OpSignature) -> bool:
    """GELU and its backward on bf16/fp16: slower than plain streaming (H100 sweep, class "gelu")."""
    outs = sig.tensors_out()
    return sig.short_name in ("gelu", "gelu_", "gelu_backward") and bool(outs) and outs[0].itemsize == 2


def operand_bytes(operands: list[TensorMeta], elements: int) -> float:
    """Bytes the SMs load and store when every operand is walked at the output's element count (a
    broadcast operand as if expanded); one-element operands are kernel arguments."""
    return float(sum(elements * t.itemsize for t in operands if t.numel > 1))


FLOATING = frozenset({"float32", "bfloat16", "float16", "float64"})


def _casts_dynamically(sig: OpSignature) -> bool:
    """torch's TensorIterator casts operand by operand when an input's dtype is not the output's
    (a mixed-dtype op such as an fp32 residual plus a bf16 branch under autocast)."""
    outs = sig.tensors_out()
    if not outs or outs[0].dtype not in FLOATING:
        return False
    # only floating operands: a bool mask or integer index is an argument the functor takes as is
    return any(t.numel > 1 and t.dtype in FLOATING and t.dtype != outs[0].dtype for t in input_tensors(sig))


def slow_path_ns(sig: OpSignature, nbytes: float, ctx: CostContext) -> float:
    """The floor torch's non-vectorized paths put under an elementwise kernel (0 when it takes the
    vectorized one), from the curves fitted to the H100 sweep (sweep_fit.py): the generic
    elementwise_kernel (a broadcast or non-dense operand) pays for every operand element it loads
    (class "elementwise_strided", an SM-side cost, 3.5 TB/s of operand bytes on the H100 and H200),
    and the dynamic-casting unrolled kernel runs at 0.66 of the streaming rate (class
    "unrolled_cast", SM-bound by fitted.streaming_rate's rule)."""
    outs = sig.tensors_out()
    if not outs or outs[0].numel <= 1 or outs[0].dtype not in FLOATING:  # measured on floating ops only
        return 0.0
    ns = 0.0
    if not _is_vectorizable(sig):
        ns = kernel_ns("elementwise_strided", operand_bytes(input_tensors(sig) + outs, outs[0].numel), 1, ctx.gpu)
    if _casts_dynamically(sig):
        ns = max(ns, kernel_ns("unrolled_cast", nbytes, 1, ctx.gpu))
    return ns


def pointwise(sig: OpSignature, ctx: CostContext) -> OpCost:
    """Ops tagged `pointwise` (add, mul, gelu, where, *_backward of activations, ...)."""
    n = _elements(sig)
    nbytes = bytes_read(sig) + bytes_written(sig)
    k = elementwise_kernel(elementwise_kernel_name(sig), ctx.gpu, nbytes, FLOPS_PER_ELEMENT * n,
                           compute_type=_compute_type(sig),
                           curve="gelu" if _is_16bit_gelu(sig) else "elementwise")
    slow = slow_path_ns(sig, nbytes, ctx)
    if slow > k.duration_ns:
        name = k.name if not _is_vectorizable(sig) else "unrolled_elementwise_kernel"
        k = Kernel(name, slow, k.flops, k.bytes)
    return single(k)


def fill(sig: OpSignature, ctx: CostContext) -> OpCost:
    """fill_, zero_, zeros, ones, full, *_like, arange, eye, ...: write the output once.

    In-place fills return their `self`, which is written, not read.
    """
    nbytes = bytes_written(sig)
    written = sig.tensors_out()
    if not written:  # e.g. an in-place op returning nothing: the first arg is written
        written = sig.tensors_in()[:1]
        nbytes = footprint_bytes(written[0]) if written else 0
    itemsize = written[0].itemsize if written else 4
    return single(fill_kernel("vectorized_elementwise_kernel<FillFunctor>", ctx.gpu, nbytes, itemsize))


def rng(sig: OpSignature, ctx: CostContext) -> OpCost:
    """normal_, uniform_, bernoulli_, random_, randn, rand, randint, exponential_, ...

    Inputs besides the written tensor (bernoulli's probability tensor) are read once.
    """
    written = bytes_written(sig)
    ins = input_tensors(sig)
    if sig.short_name.endswith("_"):  # in-place: self is written, not read
        ins = ins[1:]
    read = sum(footprint_bytes(t) for t in ins)
    n = _elements(sig)
    k = streaming_kernel("distribution_elementwise_grid_stride_kernel", ctx.gpu, written + read,
                         FLOPS_PER_ELEMENT * n, efficiency=RNG_EFFICIENCY)
    return single(k)


def dropout(sig: OpSignature, ctx: CostContext) -> OpCost:
    """native_dropout(x, p, train) -> (y, mask): read x, write y and a bool mask, with RNG."""
    nbytes = bytes_read(sig) + bytes_written(sig)
    k = streaming_kernel("fused_dropout_kernel_vec", ctx.gpu, nbytes, FLOPS_PER_ELEMENT * _elements(sig),
                         efficiency=RNG_EFFICIENCY)
    return single(k)


def randperm(sig: OpSignature, ctx: CostContext) -> OpCost:
    """randperm(n): random keys, then a radix sort of (key, index) pairs (~4 passes)."""
    out = sig.tensors_out()[0]
    pair_bytes = out.numel * (4 + out.itemsize)
    keys = streaming_kernel("distribution_elementwise_grid_stride_kernel", ctx.gpu, out.numel * 4)
    sort_passes = tuple(
        streaming_kernel("DeviceRadixSortOnesweepKernel", ctx.gpu, 2 * pair_bytes) for _ in range(4)
    )
    return OpCost((keys,) + sort_passes)


def cast(sig: OpSignature, ctx: CostContext, name: str = "unrolled_elementwise_kernel<direct_copy>") -> OpCost:
    """A dtype or layout conversion on one device: read the source, write the destination."""
    nbytes = bytes_read(sig) + bytes_written(sig)
    return single(streaming_kernel(name, ctx.gpu, nbytes))


def tiny_kernel(sig: OpSignature, ctx: CostContext) -> OpCost:
    """Device kernels on a few scalars (_assert_async, _amp_update_scale_): one minimum kernel."""
    return single(Kernel(sig.short_name, 0.0, 0.0, float(bytes_read(sig) + bytes_written(sig))))
