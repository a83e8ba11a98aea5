"""Host (CPU) time an intercepted op costs the user's process: dispatch plus kernel launches.

Measured on the H100 host (shared/calibration): 10,000 back-to-back 1-element in-place adds
cost 6.4 us of host time each, and profiler traces show ~5.5 us per cudaLaunchKernel (the
profiler itself inflates that a little). View and metadata ops only pay the dispatcher.
These are first figures, to be calibrated per host later; keep them in this one table.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from phantora.cost.estimate import COMPUTE, COPY_D2D, COPY_D2H, COPY_H2D, NO_GPU_WORK
from phantora.protocol import OP_BACKWARD, OP_COMPILED, OP_IN_MODULE, OP_IN_OPTIMIZER, OP_RECORDS_GRAD


@dataclass(frozen=True, slots=True)
class HostCosts:
    dispatch_ns: int = 1_900  # Python binding + dispatcher + output allocation, per op
    launch_ns: int = 4_500  # one cudaLaunchKernel, so a 1-kernel op costs 6.4 us in all
    extra_launch_ns: int = 3_000  # each further launch from inside the same C++ op
    memcpy_ns: int = 4_500  # one cudaMemcpyAsync call
    view_ns: int = 1_200  # view / metadata op: dispatch only, no allocation, no launch
    alloc_ns: int = 1_800  # empty*: dispatch + caching allocator, no kernel
    cpu_bytes_per_s: float = 5e9  # ops running on CPU tensors: one core streaming memory
    # c10d + ProcessGroupNCCL enqueue of one collective (work object, CUDA events, stream
    # waits, the kernel launch). Not measured yet: NCCL's own figure for a launch is ~5-10 us.
    collective_ns: int = 12_000
    # CUDA graphs. Not measured yet: NVIDIA gives ~2.5 us for cudaGraphLaunch of a straight-line
    # graph, independent of its node count since CUDA 12 ("constant time launch"); instantiation
    # grows with the node count. Capturing an op costs what launching it eagerly costs (the
    # Python, the dispatcher and the launch call all run; the launch is recorded, not run).
    graph_capture_ns: int = 3_000  # cudaStreamBeginCapture / cudaStreamEndCapture, each
    graph_instantiate_ns: int = 20_000  # cudaGraphInstantiate, plus graph_node_ns per kernel
    graph_node_ns: int = 2_000
    graph_launch_ns: int = 2_500  # cudaGraphLaunch, whatever the graph holds


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


# --- Python and autograd overhead around ops in real training code ---------------------------
# Ops in eager model code cost far more host time than the same op in a tight loop: nn.Module
# dispatch, functional wrappers, autograd graph recording, the autograd engine in backward,
# torch.utils.checkpoint, optimizer bookkeeping. Fitted (non-negative least squares) to phases
# of training steps timed on the host of a real H100 machine with shapes small enough that the
# GPU never limits (benchmarks/groundtruth/host_probe.py, tests/data/groundtruth/host_probe.json):
# forward ops inside nn.Modules ~23.5 us each plus ~8.6 us when they record autograd, backward ops ~35.6 us,
# backward views ~7 us, forward views ~nothing extra, module calls ~2.8 us, a checkpointed
# region ~512 us of Python in forward and again in backward, an optimizer step ~575 us plus
# ~9.6 us per parameter with its own ops at their bare cost. Per-phase errors of this fit are
# within about +-50% (mlp_4 forward: +47%) and it is specific to that host CPU; it exists so that launch-bound
# steps come out right, see tests/cost/test_host.py.

@dataclass(frozen=True, slots=True)
class PythonOverhead:
    forward_op_ns: int = 23_500 - 6_400  # on top of the bare dispatch + launch above
    records_grad_ns: int = 8_600
    backward_op_ns: int = 35_600 - 6_400
    backward_view_ns: int = 7_000 - 1_200
    module_call_ns: int = 2_800
    checkpoint_region_ns: int = 512_000
    optimizer_step_ns: int = 575_000
    optimizer_param_ns: int = 9_600
    # torch.compile, once per compiled graph (forward and backward each). Not measured: the
    # order of what a GPU host takes with cold caches (Dynamo + AOTAutograd + Inductor ~1 s a
    # graph, Triton compiling ~0.25 s a kernel across its compile workers). A @triton.jit kernel
    # the program launches itself pays the kernel's figure when Triton compiles it (first launch).
    compile_graph_ns: int = 1_000_000_000
    compile_kernel_ns: int = 250_000_000


PYTHON_OVERHEAD = PythonOverhead()


def python_overhead_ns(flags: int, launches_gpu_work: bool, costs: PythonOverhead = PYTHON_OVERHEAD) -> int:
    """Host time the code around one GPU op spends before the op is dispatched."""
    if flags & OP_COMPILED:
        return 0  # Inductor's generated wrapper calls the op (or launches the kernel) directly
    if flags & OP_IN_OPTIMIZER:
        return 0  # the optimizer's own Python is charged per step and parameter
    if flags & OP_BACKWARD:
        return costs.backward_op_ns if launches_gpu_work else costs.backward_view_ns
    if not launches_gpu_work:
        return 0
    # A bare loop of tensor ops outside any module pays only dispatch + launch (host_ns).
    forward = costs.forward_op_ns if flags & OP_IN_MODULE else 0
    return forward + (costs.records_grad_ns if flags & OP_RECORDS_GRAD else 0)


def host_event_ns(kind: str, count: int, costs: PythonOverhead = PYTHON_OVERHEAD) -> int:
    """Host time of a Python-level event the user process reports (phantora/protocol.py R_HOST)."""
    if kind == "module_call":
        return costs.module_call_ns * count
    if kind == "checkpoint":
        return costs.checkpoint_region_ns * count
    if kind == "compile":
        return costs.compile_graph_ns + costs.compile_kernel_ns * count
    if kind == "triton_compile":
        return costs.compile_kernel_ns * count
    if kind == "optimizer_step":
        return costs.optimizer_step_ns + costs.optimizer_param_ns * count
    raise ValueError(f"unknown host event {kind!r}")


# --- counted Python (the default host time) ---------------------------------------------------
# `--host-time counted` counts the program's own Python where it runs (interpose/host/python_work.py:
# bytecode instructions and Python frames entered, outside phantora's own work) and charges it at
# these costs on the lent H100 VM; what the program runs in C++ around an op that is neither the
# bare dispatch nor the launch (the Python binding's work for an op of model code, autograd recording
# a node, the autograd engine running one, a checkpoint region's set-up) is charged per op.
# Fitted (non-negative least squares, relative error) with the HostCosts above held fixed, by
# benchmarks/host/fit_python_work.py, to the 24 phases of benchmarks/groundtruth/host_probe.py on the
# lent VM (tests/data/groundtruth/host_probe.json) and the pure-Python benchmark of host_bench.py
# there after CUDA's initialisation (161.8 ms, h100_startup.jsonl): mean |error| 13.7% over the
# phases fitted, 29.7% with each workload left out of the fit (docs/host-time.md).

@dataclass(frozen=True, slots=True)
class PythonWork:
    instruction_ps: int = 18_220  # one bytecode instruction
    # one that calls something (CALL): counted apart, but the probe's phases and the benchmark
    # cannot tell its cost from a plain instruction's (the fit gives it nothing of its own)
    call_site_ps: int = 0
    call_ps: int = 1_038_580  # entering a Python frame (a function, a generator resuming)
    forward_op_ns: int = 11_916  # a forward GPU op's C++ beyond a bare loop's dispatch (HostCosts)
    records_grad_ns: int = 4_504  # a forward op that records an autograd node
    backward_op_ns: int = 30_249  # the autograd engine running a node that launches work
    backward_view_ns: int = 0
    checkpoint_region_ns: int = 308_429  # entering a torch.utils.checkpoint region (forward or recompute)


def _python_work_from_env() -> PythonWork:
    """PHANTORA_PYTHON_WORK=field=value,...: other costs, for benchmarks/host/fit_python_work.py's
    fit only (it perturbs one cost per run to read each one's share of every phase)."""
    spec = os.environ.get("PHANTORA_PYTHON_WORK", "")
    fields = dict(item.split("=") for item in spec.split(",") if item)
    return PythonWork(**{k: int(v) for k, v in fields.items()})


PYTHON_WORK = _python_work_from_env()


def op_cxx_ns(flags: int, launches_gpu_work: bool, costs: PythonWork = PYTHON_WORK) -> int:
    """Host time of the C++ around one op of model code (binding, autograd), with the program's
    Python counted apart."""
    if flags & (OP_COMPILED | OP_IN_OPTIMIZER):
        return 0
    if flags & OP_BACKWARD:
        return costs.backward_op_ns if launches_gpu_work else costs.backward_view_ns
    if not launches_gpu_work:
        return 0
    return costs.forward_op_ns + (costs.records_grad_ns if flags & OP_RECORDS_GRAD else 0)


# --- the simulated host ----------------------------------------------------------------------
# Every figure above was measured on one host: the lent H100 machine (a Firecracker microVM with
# 16 vCPUs, torch 2.11.0+cu130, Python 3.12) that ran benchmarks/groundtruth/host_probe.py,
# host_costs and the examples' real runs (tests/data/groundtruth/). Host time is a property of the
# host CPU, not of the GPU: the same eager program costs another host a different, nearly
# proportional, host time (it is Python, the dispatcher and the driver all running on one core).
# A HostSpec scales every modelled host cost by its speed; waits for the GPU and the program's
# own sleeps are not scaled.

@dataclass(frozen=True, slots=True)
class HostSpec:
    key: str  # accepted by `phantora trace --host`
    aliases: tuple[str, ...]
    speed: float  # host time of each modelled host cost, relative to the host the model was fitted on
    description: str
    sources: tuple[str, ...]

    @property
    def names(self) -> tuple[str, ...]:
        return (self.key, *self.aliases)


HOSTS: tuple[HostSpec, ...] = (
    HostSpec(
        key="reference",
        aliases=("default",),
        speed=0.75,
        description="a current server host running eager PyTorch (0.75 of the lent H100 VM's host time)",
        sources=(
            "PyTorch's activation-checkpointing maintainer measured a constant ~350 us per non-reentrant "
            "checkpoint region on an 8-GPU node (pytorch/torchtitan#1323, 2026-02); the lent H100 VM's "
            "no-grad forward pays 508 us per region (host_probe.json, gpt_L6_ckpt vs gpt_L6): 0.69",
            "tiny ops in the real H100 ResNet-50 profile (shared/groundtruth) against the same ops in the "
            "examples' profiles from the lent VM (tests/data/groundtruth/examples/profile_*.json): "
            "detach 1.17 vs 1.6-2.1 us, AccumulateGrad 2.3 vs 3.2-3.9, empty_like 2.2 vs 3.2-4.6, aten::to "
            "1.4 vs 1.7-3.5 (self times; the examples' profiles also recorded shapes): 0.7-0.85",
            "issue 18: a per-block checkpointed GPT-124M b8x1024 runs +36% over the same run without "
            "checkpointing on a real H100 (~36 ms); with the lent VM's figures that step costs 45.3 ms of "
            "host time against 28.1 ms of GPU work, so that H100's host is 0.78 of the lent VM's or faster",
        ),
    ),
    HostSpec(
        key="lent-h100",
        aliases=("probe",),
        speed=1.0,
        description="the lent H100 machine every host measurement in tests/data/groundtruth was taken on",
        sources=("tests/data/groundtruth/host_probe.json, host_costs.json, examples/examples.json; "
                 "shared/calibration tiny_launch_host_us 6.39 us",),
    ),
)

DEFAULT_HOST = "reference"

# `phantora trace --host-time`: how the program's own Python is charged (docs/host-time.md)
HOST_TIME_MODES = ("counted", "measured", "modelled")
DEFAULT_HOST_TIME = "counted"


class UnknownHostError(ValueError):
    pass


def lookup_host(name: str) -> HostSpec:
    """Find a host by name or alias, case-insensitively."""
    wanted = name.strip().lower().replace("_", "-")
    for host in HOSTS:
        if wanted in host.names:
            return host
    choices = ", ".join(f"{h.key} (x{h.speed:.2f}: {h.description})" for h in HOSTS)
    raise UnknownHostError(f"unknown host {name!r}; known hosts: {choices}")
