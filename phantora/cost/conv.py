"""Convolutions: convolution, _convolution, cudnn_convolution(_transpose), convolution_backward,
the slow_conv / depthwise fallbacks, conv_tbc.

cuDNN runs dense convolutions as implicit GEMMs:
    forward      M = N * out_spatial,  N = C_out / g,         K = C_in / g * kernel_volume
    grad input   M = N * in_spatial,   N = C_in / g,          K = C_out / g * kernel_volume
    grad weight  M = C_out / g,        N = C_in / g * kvol,   K = N * out_spatial
with g groups run as a batch, timed by the GEMM tile model (gemm.py) at CONV_EFFICIENCY of a
plain GEMM (address generation for the implicit im2col). fp32 convolutions use TF32 by
default (torch.backends.cudnn.allow_tf32). Tensor-core kernels want NHWC: an NCHW input costs
a transpose of the input and of the output. Depthwise convolutions (one input channel per
group) cannot use tensor cores and are memory/SIMT bound.

FLOPs follow torch.utils.flop_counter.conv_flop_count.
"""

from __future__ import annotations

from dataclasses import dataclass

from phantora.cost.gemm import GemmShape, gemm_kernel
from phantora.cost.roofline import (
    CostContext,
    Kernel,
    OpCost,
    footprint_bytes,
    prod,
    simt_ns,
    streaming_kernel,
    uses_tensor_cores,
    matmul_compute_type,
)
from phantora.ops import OpSignature, TensorMeta

CONV_EFFICIENCY = 0.85
DEPTHWISE_SIMT_EFFICIENCY = 0.3  # per-channel stencils: little reuse, many predicated loads


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


def _is_channels_last(t: TensorMeta) -> bool:
    return len(t.shape) >= 3 and t.stride[1] == 1 and t.shape[1] > 1


def _conv_gemm(shape: GemmShape, dtype: str, out_dtype: str, nbytes: float, ctx: CostContext, name: str) -> Kernel:
    k = gemm_kernel(shape, dtype, out_dtype, nbytes, ctx, tf32=ctx.cudnn_allow_tf32)
    ramp = ctx.gpu.kernel_ramp_ns
    return Kernel(name, ramp + (k.duration_ns - ramp) / CONV_EFFICIENCY, k.flops, k.bytes)


def _depthwise(shape: ConvShape, name: str, nbytes: float, ctx: CostContext) -> Kernel:
    k = streaming_kernel(name, ctx.gpu, nbytes)
    compute = simt_ns(shape.flops, ctx.gpu, efficiency=DEPTHWISE_SIMT_EFFICIENCY) + ctx.gpu.kernel_ramp_ns
    return Kernel(name, max(k.duration_ns, compute), shape.flops, nbytes)


def _layout_transposes(x: TensorMeta, out: TensorMeta, ctx: CostContext) -> tuple[Kernel, ...]:
    """NCHW tensors around a tensor-core conv: cuDNN transposes input and output to NHWC."""
    if _is_channels_last(x) or len(x.shape) < 4:
        return ()
    if not uses_tensor_cores(matmul_compute_type(x.dtype, True)):
        return ()
    return (streaming_kernel("nchwToNhwcKernel", ctx.gpu, 2.0 * footprint_bytes(x)),
            streaming_kernel("nhwcToNchwKernel", ctx.gpu, 2.0 * footprint_bytes(out)))


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
    nbytes = float(sum(footprint_bytes(t) for t in tensors) + footprint_bytes(out))
    if shape.is_depthwise:
        return OpCost((_depthwise(shape, "conv_depthwise2d_forward_kernel", nbytes, ctx),))
    name = "cudnn_convolution_fwd_implicit_gemm" if not shape.transposed else "cudnn_convolution_dgrad_implicit_gemm"
    main = _conv_gemm(shape.forward_gemm(), x.dtype, out.dtype, nbytes, ctx, name)
    return OpCost(_layout_transposes(x, out, ctx) + (main,))


def convolution_backward(sig: OpSignature, ctx: CostContext) -> OpCost:
    """convolution_backward(grad_out, input, weight, bias_sizes, stride, padding, dilation,
    transposed, output_padding, groups, output_mask) and the slow/depthwise backward ops."""
    tensors = [a for a in sig.args if isinstance(a, TensorMeta)]
    dy, x, w = tensors[0], tensors[1], tensors[2]
    mask = next((a for a in reversed(sig.args) if isinstance(a, tuple) and a and isinstance(a[0], bool)),
                (True, True, True))
    shape = conv_shape(x, w, dy, _is_transposed(sig))
    kernels: list[Kernel] = list(_layout_transposes(x, dy, ctx))
    if mask[0]:
        nbytes = float(footprint_bytes(dy) + footprint_bytes(w) + footprint_bytes(x))
        if shape.is_depthwise:
            kernels.append(_depthwise(shape, "conv_depthwise2d_backward_kernel", nbytes, ctx))
        else:
            kernels.append(_conv_gemm(shape.grad_input_gemm(), dy.dtype, x.dtype, nbytes, ctx,
                                      "cudnn_convolution_dgrad_implicit_gemm"))
    if len(mask) > 1 and mask[1]:
        nbytes = float(footprint_bytes(dy) + footprint_bytes(x) + footprint_bytes(w))
        if shape.is_depthwise:
            kernels.append(_depthwise(shape, "conv_depthwise2d_grad_weight_kernel", nbytes, ctx))
        else:
            kernels.append(_conv_gemm(shape.grad_weight_gemm(), dy.dtype, w.dtype, nbytes, ctx,
                                      "cudnn_convolution_wgrad_implicit_gemm"))
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
