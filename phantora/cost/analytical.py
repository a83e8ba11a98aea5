"""The analytical kernel-time estimator: a roofline with efficiency curves, per GPU model.

    est = AnalyticalEstimator(lookup_gpu("h100"), allow_tf32=False)
    e = est.estimate(sig)        # KernelEstimate: duration, kernels, FLOPs, bytes, kind, ...
    ks = est.kernels(sig)        # the individual kernels behind it, for traces and tests

How one signature is answered:
  1. no CUDA tensor among inputs and outputs -> the op runs on the host (NO_GPU_WORK);
  2. families.classify() picks the family; ops without GPU work (views, allocations,
     host queries, collectives timed by the network model) cost host time only;
  3. the family's model (gemm.py, attention.py, pointwise.py, ...) lists the kernels the op
     launches; each lasts at least GPUSpec.min_kernel_ns and they run back to back;
  4. unknown or deliberately unmodelled ops, and any op whose model cannot read its
     signature, get the generic fallback: one memory-bound kernel over every input and output
     byte (never zero) with known=False, so that the caller counts and reports them.
"""

from __future__ import annotations

from phantora.cost.estimate import COMPUTE, NO_GPU_WORK, KernelEstimate
from phantora.cost.families import Family, classify
from phantora.cost.host import host_ns
from phantora.cost.roofline import (
    CostContext,
    Kernel,
    OpCost,
    bytes_read,
    bytes_written,
    clamp_to_min,
    context_for,
    streaming_kernel,
)
from phantora.hardware import GPUSpec
from phantora.ops import OpSignature

ESTIMATOR_NAME = "analytical"


def fallback_cost(sig: OpSignature, ctx: CostContext) -> OpCost:
    """Generic memory-bound kernel over all bytes the op touches; at least one minimum kernel."""
    nbytes = bytes_read(sig) + bytes_written(sig)
    return OpCost((streaming_kernel(sig.short_name, ctx.gpu, nbytes),), COMPUTE)


def _trace_name(kernels: tuple[Kernel, ...], sig: OpSignature) -> str:
    if not kernels:
        return sig.short_name
    names = {k.name for k in kernels}
    if len(names) == 1:
        return kernels[0].name
    longest = max(kernels, key=lambda k: k.duration_ns)
    return f"{longest.name} (+{len(kernels) - 1} kernels)"


class AnalyticalEstimator:
    """Roofline estimator for one GPU model; deterministic, no torch import."""

    name = ESTIMATOR_NAME

    def __init__(self, gpu: GPUSpec, allow_tf32: bool = False, cudnn_allow_tf32: bool = True) -> None:
        self.gpu = gpu
        self.ctx = CostContext(gpu, allow_tf32=allow_tf32, cudnn_allow_tf32=cudnn_allow_tf32)

    # --- public --------------------------------------------------------------------------

    def family(self, sig: OpSignature) -> Family | None:
        """The family that models this op (None: unknown), as the estimate uses it."""
        return classify(sig.name, sig.tags)

    def kernels(self, sig: OpSignature) -> OpCost:
        """The kernels the op launches, each already raised to the minimum kernel duration."""
        cost, _known = self._cost(sig)
        return OpCost(tuple(clamp_to_min(k, self.gpu) for k in cost.kernels), cost.kind)

    def estimate(self, sig: OpSignature) -> KernelEstimate:
        cost, known = self._cost(sig)
        kernels = tuple(clamp_to_min(k, self.gpu) for k in cost.kernels)
        family = self.family(sig)
        family_name = family.name if family is not None else "unknown"
        if cost.kind == NO_GPU_WORK or not kernels:
            cpu_bytes = 0.0 if sig.cuda_device() is not None or _on_meta(sig) else \
                float(bytes_read(sig) + bytes_written(sig))
            return KernelEstimate(
                duration_ns=0, kernels=0, flops=0.0, bytes=0.0, kind=NO_GPU_WORK,
                estimator=self.name, known=known, kernel_name=sig.short_name,
                host_ns=host_ns(NO_GPU_WORK, 0, family_name, cpu_bytes),
            )
        return KernelEstimate(
            duration_ns=int(round(sum(k.duration_ns for k in kernels))),
            kernels=len(kernels),
            flops=float(sum(k.flops for k in kernels)),
            bytes=float(sum(k.bytes for k in kernels)),
            kind=cost.kind,
            estimator=self.name,
            known=known,
            kernel_name=_trace_name(kernels, sig),
            host_ns=host_ns(cost.kind, len(kernels), family_name),
        )

    # --- internals -----------------------------------------------------------------------

    def _cost(self, sig: OpSignature) -> tuple[OpCost, bool]:
        """(cost, known). Host-only ops and ops without GPU work have no kernels."""
        family = classify(sig.name, sig.tags)
        if sig.cuda_device() is None:
            return OpCost((), NO_GPU_WORK), True  # every tensor on the host: runs on the CPU
        if family is None or not family.modelled:
            return fallback_cost(sig, self.ctx), False
        if family.model is None:
            return OpCost((), NO_GPU_WORK), True
        try:
            return family.model(sig, context_for(self.ctx, sig.tags)), True
        except (IndexError, KeyError, TypeError, AttributeError, ValueError, ZeroDivisionError, StopIteration):
            # A signature shape the model does not expect (a new overload, say): time it with the
            # fallback and let the caller report it rather than stop the simulation.
            return fallback_cost(sig, self.ctx), False


def _on_meta(sig: OpSignature) -> bool:
    """Every tensor of the op is on the meta device: torch only propagates shapes and touches no
    data (FLOP counting on a meta copy of the model, as Lightning's measure_flops does)."""
    tensors = sig.tensors_in() + sig.tensors_out()
    return bool(tensors) and all(t.device == "meta" for t in tensors)
