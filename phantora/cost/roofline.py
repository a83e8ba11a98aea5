"""The building blocks every op family uses: a kernel, an op's cost, and the roofline pieces.

A family model (gemm.py, pointwise.py, ...) turns one OpSignature into an OpCost: the list of
kernels the op launches on a real GPU, each with its FLOPs, bytes and duration. Durations come
from two rooflines:

    memory time   = kernel ramp + bytes / (HBM bandwidth * achieved fraction)
    compute time  = FLOPs / (peak rate for the compute type * achieved fraction)

and every kernel lasts at least the GPU's minimum kernel duration.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from phantora.cost.estimate import COMPUTE
from phantora.cost.fitted import efficiency, kernel_ns, streaming_rate
from phantora.hardware import GPUSpec
from phantora.ops import OpSignature, TensorMeta


@dataclass(frozen=True, slots=True)
class Kernel:
    """One GPU kernel (or DMA copy) an op launches."""

    name: str
    duration_ns: float
    flops: float = 0.0
    bytes: float = 0.0


@dataclass(frozen=True, slots=True)
class OpCost:
    """Everything an op does on the GPU: its kernels, back to back, and what kind of work."""

    kernels: tuple[Kernel, ...]
    kind: str = COMPUTE


@dataclass(frozen=True, slots=True)
class CostContext:
    """What a family model may look at besides the signature: the GPU and torch's settings."""

    gpu: GPUSpec
    # torch.backends.cuda.matmul.allow_tf32 (off by default since torch 1.12): fp32 matmuls
    # run on tensor cores as TF32 only when it is on.
    allow_tf32: bool = False
    # torch.backends.cudnn.allow_tf32 (ON by default): fp32 convolutions use TF32.
    cudnn_allow_tf32: bool = True


# Tags a signature carries when the user's program changed torch's fp32 math settings from their
# defaults at the time of the call (interpose/ops/signature.py adds them to ops with fp32 tensors):
# torch.backends.cuda.matmul.allow_tf32 = True (or set_float32_matmul_precision("high"/"medium"))
# and torch.backends.cudnn.allow_tf32 = False. A signature without them follows the estimator's
# CostContext (torch's defaults unless the estimator was built otherwise).
TF32_MATMUL_TAG = "tf32_matmul"
NO_TF32_CUDNN_TAG = "no_tf32_cudnn"


def context_for(ctx: CostContext, tags: frozenset[str]) -> CostContext:
    """The CostContext one call runs under: the settings its signature's tags record."""
    allow_tf32 = ctx.allow_tf32 or TF32_MATMUL_TAG in tags
    cudnn_allow_tf32 = ctx.cudnn_allow_tf32 and NO_TF32_CUDNN_TAG not in tags
    if (allow_tf32, cudnn_allow_tf32) == (ctx.allow_tf32, ctx.cudnn_allow_tf32):
        return ctx
    return CostContext(ctx.gpu, allow_tf32=allow_tf32, cudnn_allow_tf32=cudnn_allow_tf32)


# --- compute types -------------------------------------------------------------------------

# dtype name -> key of GPUSpec.peak_flops for matrix math in that dtype.
_MATMUL_COMPUTE_TYPE = {
    "float64": "fp64", "float32": "fp32", "float16": "fp16", "bfloat16": "bf16",
    "float8_e4m3fn": "fp8", "float8_e5m2": "fp8", "float8_e4m3fnuz": "fp8",
    "float8_e5m2fnuz": "fp8", "int8": "int8", "uint8": "int8",
}


def matmul_compute_type(dtype: str, tf32: bool) -> str:
    """The peak_flops key a matrix product on `dtype` inputs runs at ("fp32" unless TF32 is on)."""
    ct = _MATMUL_COMPUTE_TYPE.get(dtype, "fp32")
    if ct == "fp32" and tf32:
        return "tf32"
    return ct


def peak_flops(gpu: GPUSpec, compute_type: str) -> float:
    """Dense peak FLOP/s for a compute type, falling back along fp8 -> bf16 -> fp32."""
    for key in (compute_type, "bf16" if compute_type in ("fp8", "int8") else "", "fp32"):
        if key and key in gpu.peak_flops:
            return gpu.peak_flops[key]
    return 1e12  # a GPU entry without peaks: deliberately slow rather than free


def uses_tensor_cores(compute_type: str) -> bool:
    return compute_type in ("bf16", "fp16", "tf32", "fp8", "int8", "fp64")


# --- bytes ---------------------------------------------------------------------------------

def footprint_bytes(t: TensorMeta) -> int:
    """Bytes a kernel actually touches for this view: broadcast (stride 0) dims count once."""
    n = 1
    for size, stride in zip(t.shape, t.stride):
        if stride != 0:
            n *= size
    return n * t.itemsize if t.numel else 0


def input_tensors(sig: OpSignature) -> list[TensorMeta]:
    """Tensors the op reads: its tensor arguments minus `out=` buffers (written, not read)."""
    ins = sig.tensors_in()
    if "out" in sig.tags:
        n_out = len(sig.tensors_out())
        if n_out:
            ins = ins[: len(ins) - n_out]
    return ins


def bytes_read(sig: OpSignature) -> int:
    return sum(footprint_bytes(t) for t in input_tensors(sig))


def bytes_written(sig: OpSignature) -> int:
    return sum(footprint_bytes(t) for t in sig.tensors_out())


def largest_tensor(tensors: list[TensorMeta]) -> TensorMeta | None:
    return max(tensors, key=lambda t: t.numel, default=None)


# --- time ----------------------------------------------------------------------------------

def memory_ns(nbytes: float, gpu: GPUSpec, efficiency: float = 1.0) -> float:
    """Time to stream `nbytes` through HBM, ramp included (the achieved-bandwidth curve).
    `efficiency` is a fraction of the H100's streaming rate, carried to `gpu` by the one rule of
    fitted.streaming_rate: of the achieved HBM bandwidth from SM_BOUND_BELOW up, of the SMs'
    streaming rate below it."""
    return gpu.kernel_ramp_ns + nbytes / streaming_rate(gpu, efficiency) * 1e9


def sm_rate_per_ns(gpu: GPUSpec, per_clk_per_sm: float) -> float:
    """Items per ns of a kernel bound by its SMs (issue, shared memory, one row or window per
    thread), at `per_clk_per_sm` items per clock per SM: SMs x boost clock x that. The H100-measured
    rates of such kernels are stated per clock so that they carry to another GPU by SMs x clock, as
    the SM-bound rule of fitted.streaming_rate does for bytes."""
    return per_clk_per_sm * gpu.sm_count * gpu.boost_clock_mhz * 1e-3


def simt_ns(flops: float, gpu: GPUSpec, compute_type: str = "fp32", efficiency: float = 0.7) -> float:
    """Time for non-tensor-core arithmetic (elementwise math, reductions, depthwise conv)."""
    rate = gpu.peak_flops.get("fp64" if compute_type == "fp64" else "fp32", 1e12) * efficiency
    return flops / rate * 1e9


def streaming_kernel(
    name: str,
    gpu: GPUSpec,
    nbytes: float,
    flops: float = 0.0,
    efficiency: float = 1.0,
    compute_type: str = "fp32",
    extra_ns: float = 0.0,
) -> Kernel:
    """A memory-bound kernel: the slower of its memory and (SIMT) compute rooflines."""
    ns = max(memory_ns(nbytes, gpu, efficiency), gpu.kernel_ramp_ns + simt_ns(flops, gpu, compute_type))
    return Kernel(name, ns + extra_ns, flops, nbytes)


def elementwise_kernel(name: str, gpu: GPUSpec, nbytes: float, flops: float = 0.0,
                       compute_type: str = "fp32", curve: str = "elementwise") -> Kernel:
    """A bandwidth-bound elementwise kernel (torch's eager pointwise ops and fills, Inductor's fused
    kernels) on the elementwise curve fitted to the H100 kernel sweep (fitted.py, class
    "elementwise": ramp + bytes x (1 - h exp(-bytes / L2 size)) / (e x achieved HBM bandwidth), 120
    fill/add/activation kernels from 6 MB to 400 MB; a set well inside L2 moves up to ~half its
    bytes without HBM traffic), or its SIMT roofline where that is slower. `curve` "gelu": the same
    curve at GELU's lower rate (its erf runs in fp32)."""
    ns = max(kernel_ns(curve, nbytes, 1, gpu), gpu.kernel_ramp_ns + simt_ns(flops, gpu, compute_type))
    return Kernel(name, ns, flops, nbytes)


# torch's vectorized fill (FillFunctor, 16-byte stores) writes at most this many elements per
# clock per SM, whatever the DRAM allows. The H100 and H200 sweeps' bf16 fills of 16-34M elements
# take the same time on both GPUs (H200 / H100 1.00; 20.7 us for 33.5M), 5.4 elements per clock
# per SM (median of 48; 4.8-5.8) once the elementwise curve's L2 share and ramp are taken off;
# fp32 fills, at 4 bytes an element, stay below it and run at the DRAM's rate (H200 / H100 0.70-0.72).
FILL_ELEMENTS_PER_CLK = 5.4


def fill_kernel(name: str, gpu: GPUSpec, nbytes: float, itemsize: int) -> Kernel:
    """A fill of `nbytes` of `itemsize`-byte elements: the elementwise curve, its bytes moved at
    the slower of the curve's DRAM rate and the SMs' (FILL_ELEMENTS_PER_CLK x itemsize per clock
    per SM): bf16 fills are SM-bound on an H200 and near the limit on an H100."""
    k = elementwise_kernel(name, gpu, nbytes)
    dram = streaming_rate(gpu, efficiency("elementwise"))
    sm = sm_rate_per_ns(gpu, FILL_ELEMENTS_PER_CLK * max(itemsize, 1)) * 1e9
    if sm >= dram:
        return k
    ramp = gpu.kernel_ramp_ns
    return Kernel(name, ramp + (k.duration_ns - ramp) * dram / sm, k.flops, k.bytes)


def clamp_to_min(k: Kernel, gpu: GPUSpec) -> Kernel:
    if k.duration_ns >= gpu.min_kernel_ns:
        return k
    return Kernel(k.name, gpu.min_kernel_ns, k.flops, k.bytes)


def single(k: Kernel, kind: str = COMPUTE) -> OpCost:
    return OpCost((k,), kind)


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def prod(xs) -> int:
    return math.prod(int(x) for x in xs)
