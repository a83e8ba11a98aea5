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

from phantora.cost.fitted import kernel_ns
from phantora.cost.roofline import (
    CostContext,
    Kernel,
    OpCost,
    bytes_written,
    footprint_bytes,
    single,
    sm_rate_per_ns,
    streaming_kernel,
)
from phantora.ops import OpSignature, TensorMeta

PERSISTENT_SOFTMAX_MAX_COLS = 1024
# torch's cunn_SoftMax*Smem kernels keep a row in shared memory up to the default 48 KiB per block.
SOFTMAX_SMEM_ROW_BYTES = 48 * 1024
# Elements per clock per SM of a softmax row kept in shared memory (measured on the H100 as 2.3 per ns
# per SM at its 1.98 GHz boost clock); SM-bound, so it carries by SMs x clock (roofline.sm_rate_per_ns).
SOFTMAX_ELEMENTS_PER_CLK_PER_SM = 2.3 / 1.98
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
# takes torch's native kernels, which are much slower than streaming. Their times follow the
# curves fitted to the H100 kernel sweep (sweep_fit.py, classes bn_nchw_* and bn_nhwc_*: six
# shapes from 64x32x112^2 to 64x960x7^2, each layout): time = ramp + bytes x (1 / (e x HBM rate) +
# 1 / (C x b x one SM's rate)) + C x c / SMs. NCHW: one block per channel, so few channels are
# slow (statistics b = 0.10, backward 0.15 of an SM's rate per channel). Channels_last: near
# streaming for the elementwise kernels, the Welford statistics at ~0.23 of bandwidth.
# (The earlier constants, from the ResNet-50 bf16 profile in shared/groundtruth, agree with the
# channels_last fits at its sizes: Welford statistics 0.7 TB/s, elementwise 0.77 of streaming.)
# The fp16 cuDNN path keeps the streaming model: examples/cnn_train.py's cudnn_batch_norm at
# 128x64x128^2 fp16 takes 283 us for 805 MB (2.8 TB/s; tests/cost/test_conv_profile.py).


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


def _native_nchw(x: TensorMeta, sig: OpSignature) -> bool:
    """torch's own NCHW kernels (batch_norm_collect_statistics_kernel, ...): not cuDNN's."""
    if sig.short_name.startswith("cudnn_") or len(x.shape) < 3 or _is_channels_last(x):
        return False
    weight = sig.args[1] if len(sig.args) > 1 and isinstance(sig.args[1], TensorMeta) else None
    return not _batch_norm_uses_cudnn(x, weight)


def _native_bn_kernel(cls: str, name: str, nbytes: float, x: TensorMeta, flops: float, ctx: CostContext) -> Kernel:
    """One of torch's native BatchNorm kernels, timed by its curve fitted to the H100 sweep
    (fitted.py; sweep_fit.py's bn_* classes: time against bytes and channels)."""
    channels = x.shape[1] if len(x.shape) > 1 else 1
    return Kernel(name, kernel_ns(cls, nbytes, channels, ctx.gpu), flops, nbytes)


def batch_norm(sig: OpSignature, ctx: CostContext) -> OpCost:
    """native_batch_norm / _native_batch_norm_legit* / cudnn_batch_norm / _batch_norm_with_update.

    Training: a per-channel statistics kernel reading x, then an elementwise kernel reading x
    and writing y. Inference: only the elementwise kernel. torch's native kernels (bf16 input, or
    fp16 with fp16 weights) follow the curves fitted to the H100 sweep, NCHW and channels_last
    apart: the NCHW ones give each channel one block, so few channels run far below bandwidth
    (64x32x112^2 bf16: statistics 679 us, 0.08 TB/s); cuDNN's (fp32, fp16 autocast) stream.
    """
    x = sig.args[0]
    y = sig.tensors_out()[0]
    kernels = []
    xb, yb = footprint_bytes(x), footprint_bytes(y)
    if _native_channels_last(x, sig):
        if _batch_norm_training(sig):
            kernels.append(_native_bn_kernel("bn_nhwc_stats", "batch_norm_collect_statistics_channels_last_kernel",
                                             xb, x, 3.0 * x.numel, ctx))
            running = sig.args[3] if len(sig.args) > 3 and isinstance(sig.args[3], TensorMeta) else None
            if running is not None:  # running mean/var update: its own small elementwise kernel
                kernels.append(streaming_kernel("unrolled_elementwise_kernel_for_multi_outputs", ctx.gpu,
                                                4.0 * footprint_bytes(running)))
        kernels.append(_native_bn_kernel("bn_nhwc_transform", "batch_norm_transform_input_channels_last_kernel",
                                         xb + yb, x, 2.0 * x.numel, ctx))
        return OpCost(tuple(kernels))
    if _native_nchw(x, sig):
        if _batch_norm_training(sig):
            kernels.append(_native_bn_kernel("bn_nchw_stats", "batch_norm_collect_statistics_kernel", xb, x,
                                             3.0 * x.numel, ctx))
        kernels.append(_native_bn_kernel("bn_nchw_transform", "batch_norm_transform_input_kernel", xb + yb, x,
                                         2.0 * x.numel, ctx))
        return OpCost(tuple(kernels))
    if _batch_norm_training(sig):
        kernels.append(streaming_kernel("batch_norm_collect_statistics_kernel", ctx.gpu, xb, 3.0 * x.numel))
    kernels.append(streaming_kernel("batch_norm_transform_input_kernel", ctx.gpu, xb + yb, 2.0 * x.numel))
    return OpCost(tuple(kernels))


def batch_norm_backward(sig: OpSignature, ctx: CostContext) -> OpCost:
    """native_batch_norm_backward / cudnn_batch_norm_backward / batch_norm_backward: a
    per-channel reduction over (dy, x), then dx elementwise over (dy, x). torch's native NCHW
    backward is one kernel doing both (one block per channel: the slowest BatchNorm kernel in the
    H100 sweep, 1384 us for 64x32x112^2 bf16 where streaming its 77 MB takes 26 us)."""
    dy, x = sig.args[0], sig.args[1]
    dy_x = footprint_bytes(dy) + footprint_bytes(x)
    elemt_bytes = footprint_bytes(dy) + 2 * footprint_bytes(x)
    weight = sig.args[2] if len(sig.args) > 2 and isinstance(sig.args[2], TensorMeta) else None
    native = not sig.short_name.startswith("cudnn_") and not _batch_norm_uses_cudnn(x, weight)
    if native and _is_channels_last(x):
        reduce = _native_bn_kernel("bn_nhwc_bwd_reduce", "batch_norm_backward_reduce_channels_last_kernel", dy_x,
                                   x, 4.0 * x.numel, ctx)
        elemt = _native_bn_kernel("bn_nhwc_bwd_elemt", "batch_norm_backward_elemt_channels_last_kernel",
                                  elemt_bytes, x, 4.0 * x.numel, ctx)
        return OpCost((reduce, elemt))
    if native and len(x.shape) >= 3:
        return OpCost((_native_bn_kernel("bn_nchw_backward", "batch_norm_backward_kernel", elemt_bytes, x,
                                         8.0 * x.numel, ctx),))
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
        row_bound_ns = ctx.gpu.kernel_ramp_ns + x.numel / sm_rate_per_ns(ctx.gpu, SOFTMAX_ELEMENTS_PER_CLK_PER_SM)
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
