"""The vocabulary every estimator shares: what an estimate is, the kinds of GPU work, the
Estimator protocol, and the error a choice of estimator raises.

It sits below every module of phantora.cost (they import it; it imports none of them), so
the package's `__init__` can pick estimators from its modules without an import cycle.
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


class KernelTimesError(ValueError):
    """The requested kernel-time estimator cannot be used; the message says what to change."""
