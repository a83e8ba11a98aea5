"""One-off host costs of a fresh process on a real GPU: the first time a kernel, a library or a
communicator is used. They make a job's first step (and its start-up) as long as on a real
machine; steady steps never pay them again.

One table, each entry with its source. Most figures come from one fresh process on the lent H100
host (tests/data/groundtruth/h100_startup.jsonl, made by benchmarks/groundtruth/startup_probe.py), each taken as
the first call's time less the second's. That probe ran on a cold machine (`import torch` took
4.9 s there, ~1 s warm): its first SDPA (1.98 s) and first fused AdamW step (5.96 s, which also
imports torch._dynamo) are cold-cache outliers that the real examples' first steps contradict
(examples/gpt_train.py's whole first step, SDPA and fused AdamW included, is 0.55-0.62 s in three
of its four real runs, tests/data/groundtruth/examples/examples.json), so they are not entries:
those ops pay the per-kernel module load like any other. docs/host-time.md compares the table
with the examples' first steps.
"""

from __future__ import annotations

from dataclasses import dataclass

_PROBE = "tests/data/groundtruth/h100_startup.jsonl (one fresh process, lent H100 host, torch 2.11.0+cu130)"


@dataclass(frozen=True, slots=True)
class StartupCost:
    name: str  # what the trace's slice says
    ns: int  # the cost, or its fixed part
    per_unit_ns: int  # times the entry's unit (GiB of a segment, ranks of a communicator); 0: none
    when: str
    source: str


CUDA_CONTEXT = StartupCost(
    "CUDA context creation", 358_796_000, 0, "the process's first GPU work (torch.cuda's lazy init)",
    f"{_PROBE}: cuda_init 358.8 ms")
KERNEL_MODULE = StartupCost(
    "kernel module load", 11_500_000, 0,
    "each distinct kernel's first launch on a device (CUDA_MODULE_LOADING=LAZY, the default since CUDA 12.2)",
    "the warm first steps of examples/gpt_train.py on the lent H100 host (examples.json: checkpointed b4 615.5 ms, "
    "4-layer 553.3 ms, 350M 551.5 ms; 124M 0.55-0.62 s) less what phantora charges them besides module loads (33 "
    f"kernels each): 12.5, 11.9, 9.0 and 10.7-12.6 ms a kernel. {_PROBE} gives 13.7 ms (first launches of 20 "
    "distinct elementwise kernels 274.5 ms, second 0.5 ms), taken cold (`import torch` 4.9 s there, ~1 s warm)")
CUBLAS_INIT = StartupCost(
    "cuBLAS handle and cuBLASLt init", 140_660_000, 0, "the first GEMM on a device",
    f"{_PROBE}: first bf16 1024^3 mm 154.5 ms, second 0.1 ms, less one kernel module load")
CUDNN_INIT = StartupCost(
    "cuDNN handle and heuristics", 138_200_000, 0, "the first convolution on a device",
    f"{_PROBE}: first bf16 3x3 conv 152.3 ms, second 0.4 ms, less one kernel module load")
SEGMENT_MALLOC = StartupCost(
    "cudaMalloc of a new allocator segment", 271_000, 52_200, "the caching allocator reserves more memory (per GiB)",
    f"{_PROBE}: new segments of 1 / 8 / 32 GiB 0.43 / 0.56 / 1.97 ms; least squares: 0.271 ms + 0.0522 ms per GiB")
NCCL_COMM_INIT = StartupCost(
    "NCCL communicator init", 2_000_000_000, 570_000,
    "a rank's first collective in each process group (ProcessGroupNCCL creates communicators lazily; per rank "
    "of the group)",
    "NCCL's own 'Init timings' logs: 2.46 s at 8 ranks (NCCL 2.22.3, 8x H100, NVIDIA/nccl#534), 1.99 s at 16 "
    "(NCCL 2.26.2, 2x8 H100, NVIDIA/nccl-tests#319), 58 s at 98,304 (NVIDIA/nccl PR #1791, before that PR): "
    "2 s + 0.57 ms per rank (the bootstrap's ring allgather); connections are made lazily since NCCL 2.22 "
    "(NCCL_RUNTIME_CONNECT=1)")

STARTUP_COSTS: tuple[StartupCost, ...] = (CUDA_CONTEXT, KERNEL_MODULE, CUBLAS_INIT, CUDNN_INIT, SEGMENT_MALLOC,
                                          NCCL_COMM_INIT)

# Ops that call cuBLAS (the observer's _GEMMS, by name) and cuDNN convolutions.
GEMM_OPS = frozenset({"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::_addmm_activation", "aten::mv",
                      "aten::addmv", "aten::dot", "aten::vdot", "aten::addbmm", "aten::_scaled_mm"})
CONV_OPS = frozenset({"aten::cudnn_convolution", "aten::cudnn_convolution_transpose", "aten::convolution",
                      "aten::_convolution", "aten::convolution_backward", "aten::cudnn_convolution_relu",
                      "aten::cudnn_convolution_add_relu"})


def segment_ns(grown_bytes: int) -> int:
    return SEGMENT_MALLOC.ns + SEGMENT_MALLOC.per_unit_ns * grown_bytes // (1 << 30)


def nccl_init_ns(group_size: int) -> int:
    return NCCL_COMM_INIT.ns + NCCL_COMM_INIT.per_unit_ns * group_size
