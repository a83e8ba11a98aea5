"""Host (CPU) time an intercepted op costs the user's process: dispatch plus kernel launches.

Measured on the H100 host (shared/calibration): 10,000 back-to-back 1-element in-place adds
cost 6.4 us of host time each, and profiler traces show ~5.5 us per cudaLaunchKernel (the
profiler itself inflates that a little). View and metadata ops only pay the dispatcher.
These are first figures, to be calibrated per host later; keep them in this one table.
"""

from __future__ import annotations

from dataclasses import dataclass

from phantora.cost import COMPUTE, COPY_D2D, COPY_D2H, COPY_H2D, NO_GPU_WORK


@dataclass(frozen=True, slots=True)
class HostCosts:
    dispatch_ns: int = 1_900  # Python binding + dispatcher + output allocation, per op
    launch_ns: int = 4_500  # one cudaLaunchKernel, so a 1-kernel op costs 6.4 us in all
    extra_launch_ns: int = 3_000  # each further launch from inside the same C++ op
    memcpy_ns: int = 4_500  # one cudaMemcpyAsync call
    view_ns: int = 1_200  # view / metadata op: dispatch only, no allocation, no launch
    alloc_ns: int = 1_800  # empty*: dispatch + caching allocator, no kernel
    cpu_bytes_per_s: float = 5e9  # ops running on CPU tensors: one core streaming memory


HOST_COSTS = HostCosts()


def host_ns(kind: str, kernels: int, family: str, cpu_bytes: float = 0.0, costs: HostCosts = HOST_COSTS) -> int:
    """Host time of one op call.

    kind/kernels come from the op's estimate; family is the op family name ("view",
    "allocation", "host", ...); cpu_bytes is what a CPU-only op streams through memory.
    """
    if kind == NO_GPU_WORK:
        if family == "view":
            return costs.view_ns
        if family == "allocation":
            return costs.alloc_ns
        return costs.dispatch_ns + int(cpu_bytes / costs.cpu_bytes_per_s * 1e9)
    if kind in (COPY_H2D, COPY_D2H, COPY_D2D):
        return costs.dispatch_ns + costs.memcpy_ns + max(0, kernels - 1) * costs.extra_launch_ns
    assert kind == COMPUTE, kind
    if kernels == 0:
        return costs.dispatch_ns
    return costs.dispatch_ns + costs.launch_ns + (kernels - 1) * costs.extra_launch_ns
