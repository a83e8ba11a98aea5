"""Copies between host and device and within or across devices: copy_, _to_copy, clone,
_copy_from, lift_fresh_copy, _local_scalar_dense (.item()).

Direction decides the engine that runs the copy (KernelEstimate.kind):
- host -> device (COPY_H2D) and device -> host (COPY_D2H) go over PCIe by DMA: from pinned
  host memory at GPUSpec.pinned_copy_bandwidth, from pageable memory (staged by the driver
  through a pinned bounce buffer) at the slower pageable_copy_bandwidth;
- same device (COPY_D2D when it is a plain memcpy of identical layout and dtype; otherwise a
  copy kernel, COMPUTE) reads and writes HBM;
- different devices (peer copy) is routed through `peer_copy`, the one place the network model
  will take over (NVLink / PCIe peer paths).
A copy that also changes dtype across devices copies first, then converts on the destination.
"""

from __future__ import annotations

from dataclasses import dataclass

from phantora.cost.estimate import COMPUTE, COPY_D2D, COPY_D2H, COPY_H2D
from phantora.cost.fitted import kernel_ns
from phantora.cost.pointwise import FLOATING, cast, is_dense, operand_bytes
from phantora.cost.roofline import (
    CostContext,
    Kernel,
    OpCost,
    footprint_bytes,
    memory_ns,
    streaming_kernel,
)
from phantora.ops import OpSignature, TensorMeta

# DMA setup and completion of one cudaMemcpyAsync, beyond bytes / bandwidth.
COPY_LATENCY_NS = 2_500


@dataclass(frozen=True, slots=True)
class CopyEndpoints:
    src: TensorMeta
    dst: TensorMeta

    @property
    def is_peer(self) -> bool:
        return self.src.is_cuda and self.dst.is_cuda and self.src.device_index != self.dst.device_index


def copy_endpoints(sig: OpSignature) -> CopyEndpoints | None:
    """Source and destination of a copy op, or None when the op is not one (e.g. copy_.int)."""
    name = sig.short_name
    outs = sig.tensors_out()
    args = sig.args
    if name == "copy_" and len(args) > 1 and isinstance(args[1], TensorMeta):
        return CopyEndpoints(src=args[1], dst=args[0])  # copy_(self=dst, src)
    if name in ("_copy_from", "_copy_from_and_resize") and len(args) > 1 and isinstance(args[1], TensorMeta):
        return CopyEndpoints(src=args[0], dst=args[1])  # _copy_from(self=src, dst)
    if name == "copy" and len(args) > 1 and isinstance(args[1], TensorMeta) and outs:
        return CopyEndpoints(src=args[1], dst=outs[0])
    if isinstance(args[0] if args else None, TensorMeta) and outs:
        return CopyEndpoints(src=args[0], dst=outs[0])  # _to_copy, clone, lift_fresh_copy, ...
    return None


# Conversions torch's copy kernel runs vectorized (Copy.cu: float -> bfloat16 / half have kernels of
# their own); every other dtype change takes the dynamic-casting unrolled kernel (the H100 sweep's
# RMSNorm cases: bf16 -> fp32 at 0.66 of the streaming rate, fp32 -> bf16 at the full rate).
VECTORIZED_CASTS = {("float32", "bfloat16"), ("float32", "float16")}


def _dense_alike(e: CopyEndpoints) -> bool:
    """Source and destination dense with the same strides (no broadcast, no transpose)."""
    return e.src.shape == e.dst.shape and e.src.stride == e.dst.stride and is_dense(e.src)


def _same_layout(e: CopyEndpoints) -> bool:
    return (e.src.dtype == e.dst.dtype and e.src.shape == e.dst.shape and e.src.stride == e.dst.stride
            and e.src.is_contiguous())


def host_copy_ns(nbytes: float, pinned: bool, ctx: CostContext) -> float:
    gpu = ctx.gpu
    bandwidth = gpu.pinned_copy_bandwidth if pinned else gpu.pageable_copy_bandwidth
    if bandwidth <= 0:
        bandwidth = gpu.pcie_bandwidth * (0.85 if pinned else 0.4)
    return COPY_LATENCY_NS + nbytes / bandwidth * 1e9


def peer_copy(e: CopyEndpoints, ctx: CostContext) -> OpCost:
    """Hook: a copy between two GPUs. Placeholder time over one NVLink direction; the lead will
    route these through phantora/net (topology, contention) and ignore this estimate."""
    nbytes = float(footprint_bytes(e.src))
    ns = COPY_LATENCY_NS + nbytes / (ctx.gpu.nvlink_bandwidth or ctx.gpu.pcie_bandwidth) * 1e9
    return OpCost((Kernel("Memcpy PtoP (Device -> Device)", ns, 0.0, nbytes),), COPY_D2D)


def copy(sig: OpSignature, ctx: CostContext) -> OpCost:
    """Any copy op, dispatched on where its source and destination live."""
    e = copy_endpoints(sig)
    if e is None:  # copy_.int / copy_.float: a fill with a scalar
        dst = sig.args[0]
        return OpCost((streaming_kernel("FillFunctor", ctx.gpu, footprint_bytes(dst)),))
    if e.is_peer:
        return peer_copy(e, ctx)
    if e.src.is_cuda and e.dst.is_cuda:
        if _same_layout(e):
            nbytes = 2.0 * footprint_bytes(e.src)
            memcpy = Kernel("Memcpy DtoD (Device -> Device)", memory_ns(nbytes, ctx.gpu), 0.0, nbytes)
            return OpCost((memcpy,), COPY_D2D)
        name = "unrolled_elementwise_kernel<direct_copy>" if e.src.dtype != e.dst.dtype else "elementwise_kernel<copy>"
        nbytes = float(footprint_bytes(e.src) + footprint_bytes(e.dst))
        k = streaming_kernel(name, ctx.gpu, nbytes)
        slow = 0.0
        if e.dst.dtype not in FLOATING or e.src.dtype not in FLOATING:
            pass  # the slow paths are measured on floating copies only
        elif not _dense_alike(e):  # torch's generic elementwise_kernel: every element through the offset calculator
            slow = kernel_ns("elementwise_strided", operand_bytes([e.src, e.dst], e.dst.numel), 1, ctx.gpu)
        elif e.src.dtype != e.dst.dtype and (e.src.dtype, e.dst.dtype) not in VECTORIZED_CASTS:
            slow = kernel_ns("unrolled_cast", nbytes, 1, ctx.gpu)  # dynamic casting, scalar loads
        if slow > k.duration_ns:
            k = Kernel(name, slow, k.flops, k.bytes)
        return OpCost((k,), COMPUTE)
    if e.dst.is_cuda:  # host -> device; a dtype change is converted on the device afterwards
        nbytes = float(footprint_bytes(e.src))
        kernels = [Kernel(f"Memcpy HtoD ({'Pinned' if e.src.pinned else 'Pageable'} -> Device)",
                          host_copy_ns(nbytes, e.src.pinned, ctx), 0.0, nbytes)]
        if e.src.dtype != e.dst.dtype:
            kernels.append(cast(sig, ctx).kernels[0])
        return OpCost(tuple(kernels), COPY_H2D)
    # device -> host; a dtype change is converted on the device first
    nbytes = float(footprint_bytes(e.dst))
    kernels = []
    if e.src.dtype != e.dst.dtype:
        kernels.append(cast(sig, ctx).kernels[0])
    kernels.append(Kernel(f"Memcpy DtoH (Device -> {'Pinned' if e.dst.pinned else 'Pageable'})",
                          host_copy_ns(nbytes, e.dst.pinned, ctx), 0.0, nbytes))
    return OpCost(tuple(kernels), COPY_D2H)


def local_scalar_dense(sig: OpSignature, ctx: CostContext) -> OpCost:
    """.item() on a device tensor: a few bytes copied to pageable host memory (then the host
    waits for it, which the engine models as a synchronization)."""
    x = sig.args[0]
    nbytes = float(x.itemsize)
    memcpy = Kernel("Memcpy DtoH (Device -> Pageable)", host_copy_ns(nbytes, False, ctx), 0.0, nbytes)
    return OpCost((memcpy,), COPY_D2H)
