"""Normalization and softmax: layer norm, RMS norm, batch norm, group norm, weight norm, softmax.

All memory-bound; what matters is how many times each kernel streams its input and how many
kernels the op launches. Pass counts follow torch's CUDA kernels, checked against the H100
calibration points (layer_norm and softmax on rows x cols, bf16):
- layer norm / RMS norm forward: one kernel that reads each row twice (Welford statistics, then
  normalize) and writes it once: 2R + 1W fits the measured ~1.9 TB/s "1R + 1W" rate.
- softmax forward, by row length: up to 1024 columns one warp keeps a row in registers (1R + 1W);
  a row that fits in shared memory is read once, but the block-wide max and sum per row make
  the kernel latency-bound at ~2.3 elements/ns per SM whatever the dtype (H100: 32768x4096
  bf16 in 421 us, 16384x4096 bf16 in 215 us, 8192x8192 fp32 in ~280 us); longer rows are read
  three times (max, sum of exp, normalize-and-write: 8192x50304 fp32 in 2.18 ms).
- softmax backward reads (dy, y) once when a row fits in shared memory (8192x8192 fp32 in
  268 us, 3.0 TB/s), ~1.5 times otherwise (8192x50304 fp32: ~2.2 ms).
- backward ops of the norms launch a grad-input kernel plus a parameter-gradient reduction.
H100 times above: calibration points and torch.profiler kernel times (tests/data/groundtruth/h100_kernel_profile.json).
"""

from __future__ import annotations

from phantora.cost.roofline import (
    CostContext,
    Kernel,
    OpCost,
    bytes_written,
    footprint_bytes,
    memory_ns,
    single,
    streaming_kernel,
)
from phantora.ops import OpSignature, TensorMeta

PERSISTENT_SOFTMAX_MAX_COLS = 1024
# torch's cunn_SoftMax*Smem kernels keep a row in shared memory up to the default 48 KiB per block.
SOFTMAX_SMEM_ROW_BYTES = 48 * 1024
SOFTMAX_ELEMENTS_PER_NS_PER_SM = 2.3
FLOPS_PER_ELEMENT = 5.0  # mean, variance, normalize, scale, shift


def _nbytes(*ts: TensorMeta | None) -> float:
    return float(sum(footprint_bytes(t) for t in ts if t is not None))


# --- layer norm and RMS norm ----------------------------------------------------------------

def layer_norm(sig: OpSignature, ctx: CostContext) -> OpCost:
    """native_layer_norm(x, normalized_shape, w, b, eps) / _fused_rms_norm(x, shape, w, eps)."""
    x = sig.args[0]
    params = [a for a in sig.args[1:] if isinstance(a, TensorMeta)]
    nbytes = 2 * footprint_bytes(x) + _nbytes(*params) + bytes_written(sig)
    name = "vectorized_layer_norm_kernel" if sig.short_name == "native_layer_norm" else "vectorized_rms_norm_kernel"
    return single(streaming_kernel(name, ctx.gpu, nbytes, FLOPS_PER_ELEMENT * x.numel))


def layer_norm_backward(sig: OpSignature, ctx: CostContext) -> OpCost:
    """native_layer_norm_backward(dy, x, shape, mean, rstd, w, b, mask) and
    _fused_rms_norm_backward(dy, x, shape, rstd, w, mask).

    grad input: reads dy and x twice (row sums, then dx), writes dx. grad weight/bias: a
    column reduction over rows reading dy and x once more.
    """
    dy, x = sig.args[0], sig.args[1]
    mask = sig.args[-1] if isinstance(sig.args[-1], tuple) else (True, True, True)
    stats = [a for a in sig.args[2:-1] if isinstance(a, TensorMeta)]
    kernels = []
    if mask[0]:
        nbytes = 2 * (footprint_bytes(dy) + footprint_bytes(x)) + _nbytes(*stats) + footprint_bytes(x)
        kernels.append(streaming_kernel("layer_norm_grad_input_kernel", ctx.gpu, nbytes, 8.0 * x.numel))
    if any(mask[1:]):
        outs = sig.tensors_out()[1:]
        nbytes = footprint_bytes(dy) + footprint_bytes(x) + _nbytes(*stats) + _nbytes(*outs)
        kernels.append(streaming_kernel("GammaBetaBackwardCUDAKernel", ctx.gpu, nbytes, 4.0 * x.numel))
    return OpCost(tuple(kernels))


# --- batch norm -----------------------------------------------------------------------------

def _batch_norm_training(sig: OpSignature) -> bool:
    name = sig.short_name
    if "no_training" in name or "no_update" in name:
        return False
    if name == "_batch_norm_with_update" or name == "_batch_norm_with_update_functional":
        return True
    return next((a for a in sig.args if isinstance(a, bool)), True)


# torch runs training-mode batch norm through cuDNN (one fused kernel pair, near streaming
# bandwidth) unless the input is bf16 or fp16 with fp16 weights (at::_batch_norm_impl_index);
# autocast leaves BatchNorm's weights fp32, so fp16 autocast takes cuDNN and bf16 autocast
# takes torch's native kernels. On a channels_last input those are the *_channels_last kernels,
# which are much slower than streaming. H100 profile, ResNet-50 batch 128 bf16
# (shared/groundtruth/h100_resnet50_b128, 53 BatchNorms from 128x64x112^2 down to 128x512x7^2):
# - batch_norm_collect_statistics_channels_last: Welford updates (a division per element),
#   compute-bound at 2.3 elements/ns per SM (median over the 53 layers 2.26, 1.7-2.7):
#   290 us for 128x256x56^2, 0.7 TB/s where a streaming read would take 70 us;
# - transform_input and backward_elemt: 0.77 of streaming bandwidth (least squares 0.73 and 0.81);
# - backward_reduce: 0.65 of streaming bandwidth plus ~4.4 us beyond the ramp for its grid-wide
#   two-pass reduction (least squares over the 53 layers: 5.9 us fixed, 0.65).
# The fp16 cuDNN path keeps the streaming model: examples/cnn_train.py's cudnn_batch_norm at
# 128x64x128^2 fp16 takes 283 us for 805 MB (2.8 TB/s; tests/cost/test_conv_profile.py).
WELFORD_ELEMENTS_PER_NS_PER_SM = 2.3
CHANNELS_LAST_BN_BANDWIDTH_FRACTION = 0.77
CHANNELS_LAST_BN_REDUCE_BANDWIDTH_FRACTION = 0.65
CHANNELS_LAST_BN_REDUCE_EXTRA_NS = 4_400


def _batch_norm_uses_cudnn(x: TensorMeta, weight: TensorMeta | None) -> bool:
    """at::_batch_norm_impl_index's choice, on what the signature shows (dtypes, weight)."""
    if weight is None or x.dtype == "bfloat16" or weight.dtype == "bfloat16":
        return False
    return x.dtype != "float16" or weight.dtype == "float32"


def _is_channels_last(x: TensorMeta) -> bool:
    return len(x.shape) >= 4 and x.stride[1] == 1 and x.shape[1] > 1


def _native_channels_last(x: TensorMeta, sig: OpSignature) -> bool:
    if sig.short_name.startswith("cudnn_"):
        return False
    weight = sig.args[1] if len(sig.args) > 1 and isinstance(sig.args[1], TensorMeta) else None
    return _is_channels_last(x) and not _batch_norm_uses_cudnn(x, weight)


def _welford_kernel(name: str, x: TensorMeta, ctx: CostContext) -> Kernel:
    gpu = ctx.gpu
    compute = x.numel / (WELFORD_ELEMENTS_PER_NS_PER_SM * gpu.sm_count)
    memory = memory_ns(footprint_bytes(x), gpu) - gpu.kernel_ramp_ns
    return Kernel(name, gpu.kernel_ramp_ns + max(compute, memory), 3.0 * x.numel, footprint_bytes(x))


def batch_norm(sig: OpSignature, ctx: CostContext) -> OpCost:
    """native_batch_norm / _native_batch_norm_legit* / cudnn_batch_norm / _batch_norm_with_update.

    Training: a per-channel statistics kernel reading x, then an elementwise kernel reading x
    and writing y. Inference: only the elementwise kernel.
    """
    x = sig.args[0]
    y = sig.tensors_out()[0]
    kernels = []
    if _native_channels_last(x, sig):
        if _batch_norm_training(sig):
            kernels.append(_welford_kernel("batch_norm_collect_statistics_channels_last_kernel", x, ctx))
            running = sig.args[3] if len(sig.args) > 3 and isinstance(sig.args[3], TensorMeta) else None
            if running is not None:  # running mean/var update: its own small elementwise kernel
                kernels.append(streaming_kernel("unrolled_elementwise_kernel_for_multi_outputs", ctx.gpu,
                                                4.0 * footprint_bytes(running)))
        kernels.append(streaming_kernel("batch_norm_transform_input_channels_last_kernel", ctx.gpu,
                                        footprint_bytes(x) + footprint_bytes(y), 2.0 * x.numel,
                                        efficiency=CHANNELS_LAST_BN_BANDWIDTH_FRACTION))
        return OpCost(tuple(kernels))
    if _batch_norm_training(sig):
        kernels.append(streaming_kernel("batch_norm_collect_statistics_kernel", ctx.gpu, footprint_bytes(x),
                                        3.0 * x.numel))
    kernels.append(streaming_kernel("batch_norm_transform_input_kernel", ctx.gpu,
                                    footprint_bytes(x) + footprint_bytes(y), 2.0 * x.numel))
    return OpCost(tuple(kernels))


def batch_norm_backward(sig: OpSignature, ctx: CostContext) -> OpCost:
    """native_batch_norm_backward / cudnn_batch_norm_backward / batch_norm_backward: a
    per-channel reduction over (dy, x), then dx elementwise over (dy, x)."""
    dy, x = sig.args[0], sig.args[1]
    dy_x = footprint_bytes(dy) + footprint_bytes(x)
    elemt_bytes = footprint_bytes(dy) + 2 * footprint_bytes(x)
    weight = sig.args[2] if len(sig.args) > 2 and isinstance(sig.args[2], TensorMeta) else None
    if (not sig.short_name.startswith("cudnn_") and _is_channels_last(x)
            and not _batch_norm_uses_cudnn(x, weight)):
        reduce = streaming_kernel("batch_norm_backward_reduce_channels_last_kernel", ctx.gpu, dy_x, 4.0 * x.numel,
                                  efficiency=CHANNELS_LAST_BN_REDUCE_BANDWIDTH_FRACTION,
                                  extra_ns=CHANNELS_LAST_BN_REDUCE_EXTRA_NS)
        elemt = streaming_kernel("batch_norm_backward_elemt_channels_last_kernel", ctx.gpu, elemt_bytes,
                                 4.0 * x.numel, efficiency=CHANNELS_LAST_BN_BANDWIDTH_FRACTION)
        return OpCost((reduce, elemt))
    reduce = streaming_kernel("batch_norm_backward_reduce_kernel", ctx.gpu, dy_x, 4.0 * x.numel)
    elemt = streaming_kernel("batch_norm_backward_elemt_kernel", ctx.gpu, elemt_bytes, 4.0 * x.numel)
    return OpCost((reduce, elemt))


def sync_batch_norm_piece(sig: OpSignature, ctx: CostContext) -> OpCost:
    """batch_norm_stats / _elemt / _backward_reduce / _backward_elemt / gather_stats /
    update_stats (SyncBatchNorm's pieces): one kernel over what it reads and writes."""
    nbytes = _nbytes(*sig.tensors_in()) + bytes_written(sig)
    return single(streaming_kernel(sig.short_name + "_kernel", ctx.gpu, nbytes))


# --- group norm -----------------------------------------------------------------------------

def group_norm(sig: OpSignature, ctx: CostContext) -> OpCost:
    """native_group_norm: per-group moments (read x), then normalize (read x, write y)."""
    x = sig.args[0]
    y = sig.tensors_out()[0]
    moments = streaming_kernel("RowwiseMomentsCUDAKernel", ctx.gpu, footprint_bytes(x), 3.0 * x.numel)
    apply = streaming_kernel("GroupNormForwardCUDAKernel", ctx.gpu, footprint_bytes(x) + footprint_bytes(y),
                             2.0 * x.numel)
    return OpCost((moments, apply))


def group_norm_backward(sig: OpSignature, ctx: CostContext) -> OpCost:
    """native_group_norm_backward: internal sums over (dy, x), then dx; dgamma/dbeta are tiny."""
    dy, x = sig.args[0], sig.args[1]
    dy_x = footprint_bytes(dy) + footprint_bytes(x)
    sums = streaming_kernel("ComputeInternalGradientsCUDAKernel", ctx.gpu, dy_x, 2.0 * x.numel)
    dx = streaming_kernel("GroupNormBackwardCUDAKernel", ctx.gpu, dy_x + footprint_bytes(x), 4.0 * x.numel)
    return OpCost((sums, dx))


# --- weight norm ----------------------------------------------------------------------------

def weight_norm(sig: OpSignature, ctx: CostContext) -> OpCost:
    """_weight_norm_interface(v, g, dim) and its backward: a norm reduction, then a scale."""
    ins = sig.tensors_in()
    big = max(ins, key=lambda t: t.numel)
    norm = streaming_kernel("weight_norm_fwd_first_dim_kernel", ctx.gpu, footprint_bytes(big), 2.0 * big.numel)
    scale = streaming_kernel("elementwise_kernel", ctx.gpu, _nbytes(*ins) + bytes_written(sig), big.numel)
    return OpCost((norm, scale))


# --- softmax --------------------------------------------------------------------------------

def _softmax_dim_size(x: TensorMeta, dim) -> int:
    if not x.shape:
        return 1
    d = dim if isinstance(dim, int) else -1
    return x.shape[d % len(x.shape)]


def _softmax_rows_fit_smem(x: TensorMeta, cols: int) -> bool:
    return cols * x.itemsize <= SOFTMAX_SMEM_ROW_BYTES


def softmax(sig: OpSignature, ctx: CostContext) -> OpCost:
    """_softmax / _log_softmax / _safe_softmax / _masked_softmax (x, dim, ...)."""
    x = sig.args[0]
    dim = sig.args[2] if sig.short_name == "_masked_softmax" else sig.args[1]
    cols = _softmax_dim_size(x, dim)
    extra = _nbytes(*sig.tensors_in()[1:])  # _masked_softmax's mask
    written = bytes_written(sig)
    if cols <= PERSISTENT_SOFTMAX_MAX_COLS:
        nbytes = footprint_bytes(x) + extra + written
        return single(streaming_kernel("softmax_warp_forward", ctx.gpu, nbytes, 4.0 * x.numel))
    if _softmax_rows_fit_smem(x, cols):
        k = streaming_kernel("cunn_SoftMaxForwardSmem", ctx.gpu, footprint_bytes(x) + extra + written, 4.0 * x.numel)
        row_bound_ns = ctx.gpu.kernel_ramp_ns + x.numel / (SOFTMAX_ELEMENTS_PER_NS_PER_SM * ctx.gpu.sm_count)
        return single(Kernel(k.name, max(k.duration_ns, row_bound_ns), k.flops, k.bytes))
    nbytes = 3 * footprint_bytes(x) + extra + written
    return single(streaming_kernel("cunn_SoftMaxForward", ctx.gpu, nbytes, 4.0 * x.numel))


def softmax_backward(sig: OpSignature, ctx: CostContext) -> OpCost:
    """_softmax_backward_data / _log_softmax_backward_data / _masked_softmax_backward
    (dy, y, dim, ...): sum(dy * y) per row, then dx."""
    dy, y = sig.args[0], sig.args[1]
    dim = sig.args[3] if sig.short_name == "_masked_softmax_backward" else sig.args[2]
    cols = _softmax_dim_size(y, dim)
    reads = 1.0 if cols <= PERSISTENT_SOFTMAX_MAX_COLS or _softmax_rows_fit_smem(y, cols) else 1.5
    extra = _nbytes(*sig.tensors_in()[2:])
    nbytes = reads * (footprint_bytes(dy) + footprint_bytes(y)) + extra + bytes_written(sig)
    name = "softmax_warp_backward" if cols <= PERSISTENT_SOFTMAX_MAX_COLS else "cunn_SoftMaxBackward"
    return single(streaming_kernel(name, ctx.gpu, nbytes, 3.0 * y.numel))
