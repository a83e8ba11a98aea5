"""Convolutions: convolution, _convolution, cudnn_convolution(_transpose), convolution_backward,
the slow_conv / depthwise fallbacks, conv_tbc.

cuDNN runs dense convolutions as implicit GEMMs:
    forward      M = N * out_spatial,  N = C_out / g,         K = C_in / g * kernel_volume
    grad input   M = N * in_spatial,   N = C_in / g,          K = C_out / g * kernel_volume
    grad weight  M = C_out / g,        N = C_in / g * kvol,   K = N * out_spatial
with g groups run as a batch, timed by the GEMM tile model (gemm.py) plus a fixed cost per
cuDNN kernel (CUDNN_KERNEL_FIXED_NS). fp32 convolutions use TF32 by default
(torch.backends.cudnn.allow_tf32). Tensor-core kernels want NHWC: an NCHW input costs a
transpose of the input and of the output. Depthwise convolutions (one input channel per group)
cannot use tensor cores and are memory/SIMT bound; so, nearly, are convolutions whose input
channels do not fill a 16-byte vector (an RGB stem).

Evidence: torch.profiler on a real H100 (cuDNN 9, torch 2.11, fp16 channels_last) of
examples/cnn_train.py at batch 128 x 128^2 and batch 64 x 64^2,
tests/data/groundtruth/examples/profile_cnn_*.json; tests/cost/test_conv_profile.py holds the
per-op times quoted below.

FLOPs follow torch.utils.flop_counter.conv_flop_count.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from phantora.cost.fitted import kernel_ns
from phantora.cost.gemm import OPERAND_STREAMING_EFFICIENCY, GemmShape, gemm_compute_ns, gemm_kernel, other_gemm_gpu
from phantora.cost.roofline import (
    CostContext,
    Kernel,
    OpCost,
    footprint_bytes,
    memory_ns,
    peak_flops,
    prod,
    streaming_kernel,
    uses_tensor_cores,
    matmul_compute_type,
)
from phantora.ops import OpSignature, TensorMeta

# The main loop of cuDNN's implicit GEMMs runs at the GEMM model's rate: no im2col penalty (the
# model once took 15% off for address generation). Profile, batch 128: the 3x3 convs with
# 128-512 channels sustain 690-790 TFLOP/s forward and 680-770 forward+backward, at or above
# the GEMM model's own ceiling (0.78 x 989 = 771).
#
# Each cuDNN conv kernel costs more than its bytes and FLOPs, beyond the plain kernel ramp,
# helpers included (the profile shows a workspace-init kernel before every split-K weight
# gradient, split-K reductions and memsets: 19 + 9 + ~80 of them per step at batch 128). Fitted (least squares on relative error, main loop as above) to the 19
# convolution ops of the batch-64 profile, where it matters: 7.9 us per kernel, 8 used. Held
# out, the batch-128 ops come out +1.6% in total per step (median |error| 5.8%); its smallest
# kernels show the same cost (1x1 stride-2 forwards: 26.7 us real for ~18 us of traffic).
CUDNN_KERNEL_FIXED_NS = 8_000
# Tensor-core conv kernels load input channels in 16-byte vectors. A conv with fewer channel
# bytes per group than that (RGB input: 3 fp16 channels, 6 bytes per pixel) runs gather kernels
# instead (sm80_xmma_fprop_implicit_gemm_indexed_wo_smem forward; an NCHW SIMT sgemm or a
# CUTLASS kernel for the weight gradient, after an nhwcAddPaddingKernel), memory-bound well
# below streaming bandwidth. Profile, 3->64 channels 3x3 forward: 265.3 us for 281 MB at batch
# 128 (1.06 TB/s, 35% of what a streaming kernel reaches; with the fixed cost on top the model
# gives +3%), and, held out, 35.9 us for 35 MB at batch 64 (0.98 TB/s; model +14%). The weight gradients are slower still and not at one rate (502.7 us at
# batch 128, 297.6 at batch 64: a different algorithm at each size); timed at the same rate
# they remain underestimated.
VECTOR_BYTES = 16
UNALIGNED_CONV_BANDWIDTH_FRACTION = 0.35
# The same gather forward is also compute-bound once the window is large: ResNet-50's 7x7
# stride-2 RGB stem (shared/groundtruth/h100_resnet50_b128, 128x3x224^2 bf16 -> 64x112^2,
# 15.1 GFLOP) runs a CUTLASS Ampere-style fprop (cutlass_tensorop_bf16_s16816fprop_optimized,
# channels padded to 8) in 777 us: 19.4 TFLOP/s of useful work, 3.9% of the bf16 dense peak,
# where its 244 MB would stream in 232 us at the gather bandwidth above. The examples' 3x3 RGB
# stems stay bandwidth-bound at that rate (3.6 GFLOP: 186 us of compute under 265 us measured).
UNALIGNED_CONV_PEAK_FRACTION = 0.039


@dataclass(frozen=True, slots=True)
class ConvShape:
    batch: int
    c_in: int
    c_out: int
    groups: int
    in_spatial: tuple[int, ...]
    out_spatial: tuple[int, ...]
    kernel: tuple[int, ...]
    transposed: bool

    @property
    def kernel_volume(self) -> int:
        return prod(self.kernel)

    @property
    def flops(self) -> float:
        """torch.utils.flop_counter.conv_flop_count: 2 * N * spatial * kvol * C_out * C_in / g."""
        spatial = prod(self.in_spatial if self.transposed else self.out_spatial)
        return 2.0 * self.batch * spatial * self.kernel_volume * self.c_out * self.c_in / self.groups

    @property
    def is_depthwise(self) -> bool:
        return self.groups > 1 and self.groups == self.c_in and self.c_out // self.groups <= 4

    def forward_gemm(self) -> GemmShape:
        g = self.groups
        if self.transposed:  # a transposed conv is the data gradient of a conv
            m = self.batch * prod(self.in_spatial)
            return GemmShape(m, self.c_out // g * self.kernel_volume, self.c_in // g, g)
        return GemmShape(self.batch * prod(self.out_spatial), self.c_out // g, self.c_in // g * self.kernel_volume, g)

    def grad_input_gemm(self) -> GemmShape:
        """Same FLOPs as the forward (flop_counter's conv_backward_flop): cuDNN's dgrad walks
        the output positions for a strided conv, the input positions for a transposed one."""
        g = self.groups
        spatial = prod(self.in_spatial if self.transposed else self.out_spatial)
        return GemmShape(self.batch * spatial, self.c_in // g, self.c_out // g * self.kernel_volume, g)

    def grad_input_phase_gemms(self, stride: tuple[int, ...]) -> list[GemmShape]:
        """The data gradient of a strided conv as cuDNN computes it (its
        dgrad_implicit_gemm_indexed ... strided kernels): one implicit GEMM per phase of the
        input (positions equal modulo the stride), over the kernel taps that reach that phase.
        A 3x3 stride-2 conv's four phases take 4, 2, 2 and 1 taps; a 1x1 stride-2 conv's take
        1, 0, 0 and 0 (those only write zeros). Same FLOPs as one GEMM, but each phase pays its
        own tile prologue and epilogue on a shorter K."""
        g = self.groups
        per_dim = []  # per spatial dim: (rows, taps) of each phase
        for n_in, k, s in zip(self.in_spatial, self.kernel, stride):
            per_dim.append([(-(-(n_in - r) // s), len(range(r, k, s))) for r in range(s)])
        gemms = []
        for phase in _product(per_dim):
            rows, taps = prod(r for r, _ in phase), prod(t for _, t in phase)
            gemms.append(GemmShape(self.batch * rows, self.c_in // g, self.c_out // g * taps, g))
        return gemms

    def grad_weight_gemm(self) -> GemmShape:
        g = self.groups
        spatial = prod(self.in_spatial if self.transposed else self.out_spatial)
        return GemmShape(self.c_out // g, self.c_in // g * self.kernel_volume, self.batch * spatial, g)


def conv_shape(x: TensorMeta, w: TensorMeta, out: TensorMeta, transposed: bool) -> ConvShape:
    """From input [N, C_in, *in], weight and output [N, C_out, *out].

    Weight is [C_out, C_in / g, *k] for a conv and [C_in, C_out / g, *k] when transposed.
    """
    c_in, c_out = x.shape[1], out.shape[1]
    if transposed:
        groups = max(1, c_out // max(w.shape[1], 1))
    else:
        groups = max(1, c_in // max(w.shape[1], 1))
    return ConvShape(x.shape[0], c_in, c_out, groups, tuple(x.shape[2:]), tuple(out.shape[2:]),
                     tuple(w.shape[2:]), transposed)


def _product(per_dim: list[list[tuple[int, int]]]) -> list[tuple[tuple[int, int], ...]]:
    out: list[tuple[tuple[int, int], ...]] = [()]
    for options in per_dim:
        out = [prev + (o,) for prev in out for o in options]
    return out


def conv_stride(sig: OpSignature, shape: ConvShape) -> tuple[int, ...]:
    """The stride argument of convolution(_backward); else inferred from the spatial sizes."""
    at = 4 if "backward" in sig.short_name else 3
    if sig.short_name in ("convolution", "_convolution", "convolution_backward") and len(sig.args) > at:
        stride = sig.args[at]
        if isinstance(stride, tuple) and len(stride) == len(shape.kernel) and all(isinstance(v, int) for v in stride):
            return tuple(max(1, v) for v in stride)
    return tuple(max(1, round(i / o)) if o else 1 for i, o in zip(shape.in_spatial, shape.out_spatial))


def sampled_input_fraction(shape: ConvShape) -> float:
    """Fraction of the input a convolution's forward reads: a kernel smaller than its stride (a
    1x1 conv with stride 2) skips the rows and columns between its taps. Profile: the 1x1
    stride-2 forwards take 26.7 and 49.9 us at batch 128, 9.9 and 11.5 at batch 64, -12..+9% from
    a model reading the sampled quarter (reading it all would put them 35-60% above)."""
    if shape.transposed:
        return 1.0
    frac = 1.0
    for n_in, n_out, k in zip(shape.in_spatial, shape.out_spatial, shape.kernel):
        if n_in > 0:
            frac *= min(1.0, n_out * k / n_in)
    return frac


def _is_channels_last(t: TensorMeta) -> bool:
    return len(t.shape) >= 3 and t.stride[1] == 1 and t.shape[1] > 1


def has_unaligned_channels(shape: ConvShape, x: TensorMeta) -> bool:
    """Input channels per group that do not fill the 16-byte vectors tensor-core kernels load."""
    if shape.is_depthwise or not uses_tensor_cores(matmul_compute_type(x.dtype, True)):
        return False
    return (shape.c_in // shape.groups) * x.itemsize % VECTOR_BYTES != 0


def _conv_gemm(shape: GemmShape, dtype: str, out_dtype: str, nbytes: float, ctx: CostContext, name: str,
               unaligned: bool = False, gather_compute: bool = False) -> Kernel:
    """One cuDNN implicit-GEMM kernel: the GEMM model's time without its ramp, plus the fixed
    cost of a cuDNN kernel; a gather kernel's slower memory roofline for unaligned channels
    (and, for the forward, its low compute rate)."""
    conv_ctx = replace(ctx, gpu=other_gemm_gpu(ctx.gpu))  # cuDNN's kernels: GPUSpec.other_gemm_efficiency
    k = gemm_kernel(shape, dtype, out_dtype, nbytes, conv_ctx, tf32=ctx.cudnn_allow_tf32)
    work = k.duration_ns - ctx.gpu.kernel_ramp_ns
    if unaligned:
        work = max(work, memory_ns(nbytes, ctx.gpu, UNALIGNED_CONV_BANDWIDTH_FRACTION) - ctx.gpu.kernel_ramp_ns)
        if gather_compute:
            rate = peak_flops(ctx.gpu, matmul_compute_type(dtype, ctx.cudnn_allow_tf32)) * UNALIGNED_CONV_PEAK_FRACTION
            work = max(work, shape.flops / rate * 1e9)
    return Kernel(name, CUDNN_KERNEL_FIXED_NS + work, k.flops, k.bytes)


def _strided_dgrad(shape: ConvShape, stride: tuple[int, ...], dtype: str, nbytes: float, ctx: CostContext,
                   unaligned: bool) -> Kernel:
    """One cuDNN kernel running the phase GEMMs of a strided conv's data gradient."""
    gpu = ctx.gpu
    phases = shape.grad_input_phase_gemms(stride)
    compute_type = matmul_compute_type(dtype, ctx.cudnn_allow_tf32)
    conv_gpu = other_gemm_gpu(gpu)  # cuDNN's kernels: GPUSpec.other_gemm_efficiency
    compute = sum(gemm_compute_ns(ph, compute_type, conv_gpu) for ph in phases)
    fraction = UNALIGNED_CONV_BANDWIDTH_FRACTION if unaligned else OPERAND_STREAMING_EFFICIENCY
    memory = memory_ns(nbytes, gpu, fraction) - gpu.kernel_ramp_ns
    return Kernel("cudnn_convolution_dgrad_implicit_gemm_strided", CUDNN_KERNEL_FIXED_NS + max(compute, memory),
                  shape.flops, nbytes)


def _channel_padding(x: TensorMeta, shape: ConvShape, ctx: CostContext) -> Kernel:
    """nhwcAddPaddingKernel: copies the input with its channels padded to a 16-byte vector."""
    per_vector = VECTOR_BYTES // max(x.itemsize, 1)
    padded = -(-shape.c_in // per_vector) * per_vector
    return streaming_kernel("nhwcAddPaddingKernel", ctx.gpu, footprint_bytes(x) * (1 + padded / shape.c_in))


def _depthwise(shape: ConvShape, kind: str, x: TensorMeta, dy: TensorMeta, ctx: CostContext) -> Kernel:
    """A depthwise kernel (kind: "fwd", "dgrad", "wgrad"), by the curves fitted to the H100 sweep
    (sweep_fit.py, classes dw_*). NCHW runs torch's conv_depthwise2d_* stencils, FLOP-bound at 1.6-2.7%
    of the fp32 SIMT rate (64x32x112^2 bf16: forward 253 us, backward 442, weight gradient 546);
    channels_last runs cuDNN's NHWC kernels at 0.35-0.6 of streaming bandwidth."""
    kvol = shape.kernel_volume
    nbytes = float(footprint_bytes(x) + footprint_bytes(dy))
    if _is_channels_last(x):
        names = {"fwd": "conv2d_c1_k1_nhwc_specialized", "dgrad": "dgrad2d_c1_k1_nhwc_specialized",
                 "wgrad": "wgrad2d_c1_k1_nhwc"}
        return Kernel(names[kind], kernel_ns(f"dw_nhwc_{kind}", nbytes, shape.c_in, ctx.gpu), shape.flops, nbytes)
    names = {"fwd": "conv_depthwise2d_forward_kernel", "dgrad": "conv_depthwise2d_backward_kernel",
             "wgrad": "conv_depthwise2d_grad_weight_kernel"}
    # per output (forward, weight gradient) or per input element (data gradient): one multiply-add per tap
    flops = 2.0 * kvol * (x.numel if kind == "dgrad" else dy.numel)
    return Kernel(names[kind], kernel_ns(f"dw_nchw_{kind}", flops, shape.c_in, ctx.gpu), shape.flops, nbytes)


def _is_gemm_1x1(shape: ConvShape, sig: OpSignature) -> bool:
    """A 1x1, stride-1, unpadded conv: on NCHW cuDNN runs it as plain GEMMs, no layout conversion
    (H100 sweep: 1x1 NCHW bf16 convs launch nvjet/CUTLASS GEMMs and no nchwToNhwc)."""
    if shape.kernel_volume != 1 or shape.transposed or shape.in_spatial != shape.out_spatial:
        return False
    return all(s == 1 for s in conv_stride(sig, shape))


def _layout_transposes(x: TensorMeta, outs: tuple[TensorMeta, ...], backs: tuple[TensorMeta, ...],
                       ctx: CostContext) -> tuple[Kernel, ...]:
    """NCHW tensors around a tensor-core conv: cuDNN converts the operands it reads to NHWC
    (`outs`: nchwToNhwcKernel) and what it writes back to NCHW (`backs`: nhwcToNchwKernel), each
    read and written once, at the fraction of bandwidth fitted to the H100 sweep (sweep_fit.py,
    classes nchw_to_nhwc and nhwc_to_nchw; 0.34 and 0.43 of streaming: 64x64x56^2 bf16 3x3
    forward+backward spends 162 us in them against 126 us in the convolutions)."""
    if _is_channels_last(x) or len(x.shape) < 4:
        return ()
    if not uses_tensor_cores(matmul_compute_type(x.dtype, True)):
        return ()
    def convert(name: str, cls: str, t: TensorMeta) -> Kernel:
        nbytes = 2.0 * footprint_bytes(t)
        if t.itemsize != 2:  # the sweep timed bf16 only: other dtypes keep the streaming rate
            return streaming_kernel(name, ctx.gpu, nbytes)
        return Kernel(name, kernel_ns(cls, nbytes, 1, ctx.gpu), 0.0, nbytes)

    to_nhwc = [convert("nchwToNhwcKernel", "nchw_to_nhwc", t) for t in outs]
    to_nchw = [convert("nhwcToNchwKernel", "nhwc_to_nchw", t) for t in backs]
    return tuple(to_nhwc + to_nchw)


def _is_transposed(sig: OpSignature) -> bool:
    if "transpose" in sig.short_name:
        return True
    if sig.short_name in ("convolution", "_convolution", "convolution_overrideable",
                          "convolution_backward", "convolution_backward_overrideable"):
        flag_at = 7 if "backward" in sig.short_name else 6
        return bool(sig.args[flag_at]) if len(sig.args) > flag_at else False
    return False


def convolution(sig: OpSignature, ctx: CostContext) -> OpCost:
    """Forward convolution of any flavour: input, weight (and bias) are the first tensors."""
    if sig.short_name == "conv_tbc":
        return conv_tbc(sig, ctx)
    tensors = [a for a in sig.args if isinstance(a, TensorMeta)]
    x, w = tensors[0], tensors[1]
    out = sig.tensors_out()[0]
    shape = conv_shape(x, w, out, _is_transposed(sig))
    nbytes = float(sampled_input_fraction(shape) * footprint_bytes(x)
                   + sum(footprint_bytes(t) for t in tensors[1:]) + footprint_bytes(out))
    if shape.is_depthwise:
        return OpCost((_depthwise(shape, "fwd", x, out, ctx),))
    name = "cudnn_convolution_fwd_implicit_gemm" if not shape.transposed else "cudnn_convolution_dgrad_implicit_gemm"
    unaligned = has_unaligned_channels(shape, x)
    main = _conv_gemm(shape.forward_gemm(), x.dtype, out.dtype, nbytes, ctx, name,
                      unaligned=unaligned, gather_compute=unaligned)
    transposes = () if _is_gemm_1x1(shape, sig) else _layout_transposes(x, (x,), (out,), ctx)
    return OpCost(transposes + (main,))


def convolution_backward(sig: OpSignature, ctx: CostContext) -> OpCost:
    """convolution_backward(grad_out, input, weight, bias_sizes, stride, padding, dilation,
    transposed, output_padding, groups, output_mask) and the slow/depthwise backward ops."""
    tensors = [a for a in sig.args if isinstance(a, TensorMeta)]
    dy, x, w = tensors[0], tensors[1], tensors[2]
    mask = next((a for a in reversed(sig.args) if isinstance(a, tuple) and a and isinstance(a[0], bool)),
                (True, True, True))
    shape = conv_shape(x, w, dy, _is_transposed(sig))
    unaligned = has_unaligned_channels(shape, x)
    kernels: list[Kernel] = []
    if not shape.is_depthwise and not _is_gemm_1x1(shape, sig):
        kernels += _layout_transposes(x, (x, dy), (x,) if mask[0] else (), ctx)
    if mask[0]:
        nbytes = float(footprint_bytes(dy) + footprint_bytes(w) + footprint_bytes(x))
        stride = conv_stride(sig, shape)
        if shape.is_depthwise:
            kernels.append(_depthwise(shape, "dgrad", x, dy, ctx))
        elif not shape.transposed and any(s > 1 for s in stride):
            kernels.append(_strided_dgrad(shape, stride, dy.dtype, nbytes, ctx, unaligned))
        else:
            kernels.append(_conv_gemm(shape.grad_input_gemm(), dy.dtype, x.dtype, nbytes, ctx,
                                      "cudnn_convolution_dgrad_implicit_gemm", unaligned))
    if len(mask) > 1 and mask[1]:
        # The weight gradient reads the whole input even where a 1x1 stride-2 forward skips 3/4 of
        # it (profile, backward of the three 1x1 stride-2 convs at both batch sizes: 14-31% above
        # a model reading the sampled quarter, -7..+8% from one reading all of it, bar one at -20%).
        nbytes = float(footprint_bytes(dy) + footprint_bytes(x) + footprint_bytes(w))
        if shape.is_depthwise:
            kernels.append(_depthwise(shape, "wgrad", x, dy, ctx))
        else:
            if unaligned:
                kernels.append(_channel_padding(x, shape, ctx))
            kernels.append(_conv_gemm(shape.grad_weight_gemm(), dy.dtype, w.dtype, nbytes, ctx,
                                      "cudnn_convolution_wgrad_implicit_gemm", unaligned))
    if len(mask) > 2 and mask[2]:
        kernels.append(streaming_kernel("reduce_kernel", ctx.gpu, float(footprint_bytes(dy)), float(dy.numel)))
    return OpCost(tuple(kernels))


def conv_tbc(sig: OpSignature, ctx: CostContext) -> OpCost:
    """conv_tbc(input [T, B, C_in], weight [k, C_in, C_out], bias, pad): one GEMM per tap."""
    x, w = sig.args[0], sig.args[1]
    out = sig.tensors_out()[0]
    k, c_in, c_out = w.shape
    shape = GemmShape(out.shape[0] * out.shape[1], c_out, c_in, k)
    nbytes = float(footprint_bytes(x) + footprint_bytes(w) + footprint_bytes(out))
    return OpCost((gemm_kernel(shape, x.dtype, out.dtype, nbytes, ctx),))
