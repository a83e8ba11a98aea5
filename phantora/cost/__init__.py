"""Kernel-time estimation: how long the GPU work of one aten op takes on a simulated GPU.

Public surface:
    KernelEstimate      what an estimator returns for one op signature
    Estimator           the protocol every estimator implements
    make_estimator()    pick an estimator by name for a GPU

Where each op family is modelled (analytical estimator): analytical.py (the estimator),
families.py (op -> family table), roofline.py (shared pieces), gemm.py, conv.py,
attention.py, pointwise.py, normalization.py, reductions.py, indexing.py, movement.py,
losses.py, optimizers.py, copies.py, spectral.py, recurrent.py, host.py (host-side cost).

The simulator calls `estimate` once per distinct op signature and caches the result, so an
estimator may be slow-ish (tens of microseconds) but must be deterministic.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from phantora.hardware import GPUSpec
from phantora.ops import OpSignature

# Kinds of GPU work; the engine schedules copies on the copy model, kernels on streams.
COMPUTE = "compute"
COPY_H2D = "copy_h2d"
COPY_D2H = "copy_d2h"
COPY_D2D = "copy_d2d"
NO_GPU_WORK = "none"  # views, metadata ops, allocations without a kernel, host-only ops


@dataclass(frozen=True, slots=True)
class KernelEstimate:
    duration_ns: int  # GPU time of all kernels the op launches, back to back
    kernels: int  # number of kernel launches; 0 when the op launches no GPU work
    flops: float  # floating point operations performed
    bytes: float  # bytes read + written in device memory (or moved over PCIe for copies)
    kind: str  # one of COMPUTE, COPY_H2D, COPY_D2H, COPY_D2D, NO_GPU_WORK
    estimator: str  # "analytical", "calibrated", "measured"
    known: bool  # False when the op is not modelled and a generic fallback was used
    kernel_name: str  # the name a trace shows for the kernel, e.g. "gemm_bf16" or "mm"
    host_ns: int  # host (CPU) time the call costs: dispatch plus kernel launches


class Estimator(Protocol):
    name: str
    gpu: GPUSpec

    def estimate(self, sig: OpSignature) -> KernelEstimate: ...


def make_estimator(kind: str, gpu: GPUSpec, *, allow_tf32: bool = False, cudnn_allow_tf32: bool = True) -> Estimator:
    """The estimator named `kind` ("analytical" for now) for `gpu`.

    allow_tf32 / cudnn_allow_tf32 mirror torch.backends.cuda.matmul.allow_tf32 (default off)
    and torch.backends.cudnn.allow_tf32 (default on): whether fp32 matmuls / convolutions may
    run on tensor cores as TF32.
    """
    if kind in ("analytical", "auto"):
        from phantora.cost.analytical import AnalyticalEstimator

        return AnalyticalEstimator(gpu, allow_tf32=allow_tf32, cudnn_allow_tf32=cudnn_allow_tf32)
    raise ValueError(f"unknown kernel-time estimator {kind!r}; choose from: analytical, auto")
