"""The one table of GPU models phantora can simulate.

Every per-GPU fact (peak FLOP/s per dtype, memory size and bandwidth, what torch.cuda reports,
what fraction of those peaks real kernels sustain) lives here and nowhere else. Peak figures are
vendor datasheet values for dense math unless noted. The "achieved" fields below are what real
kernels sustain on that GPU; the cost model (phantora/cost) combines them with per-shape effects
(tile and wave quantization, launch ramp, kernel counts). Each achieved figure says whether it
was measured (shared/calibration, or torch.profiler times in tests/data/groundtruth/h100_kernel_profile.json) or
is an estimate to be replaced by a measurement.
"""

from __future__ import annotations

from dataclasses import dataclass, field

GiB = 1024**3
MiB = 1024**2


@dataclass(frozen=True)
class GPUSpec:
    key: str  # canonical full name accepted by --gpu, e.g. "h100-sxm-80gb"
    aliases: tuple[str, ...]  # short names accepted by --gpu, e.g. ("h100",)
    device_name: str  # what torch.cuda.get_device_name() returns on the real card
    total_memory: int  # bytes, as torch.cuda.get_device_properties().total_memory reports
    capability: tuple[int, int]
    sm_count: int
    l2_cache_bytes: int
    # Dense peak math throughput in FLOP/s by compute type. "fp32" is true (non tensor core)
    # FP32, what torch uses by default (TF32 off); "tf32" applies when
    # torch.backends.cuda.matmul.allow_tf32 / set_float32_matmul_precision('high') is on.
    peak_flops: dict[str, float] = field(default_factory=dict)
    hbm_bandwidth: float = 0.0  # bytes/s, datasheet
    pcie_bandwidth: float = 0.0  # bytes/s per direction, datasheet (host <-> device)
    nvlink_bandwidth: float = 0.0  # bytes/s per direction per GPU, datasheet
    max_threads_per_sm: int = 2048
    regs_per_sm: int = 65536
    warp_size: int = 32
    # --- What real kernels achieve on this GPU (used by phantora/cost) ---
    # Fraction of the dense peak that large, well-shaped cuBLAS GEMMs sustain (clock and power
    # limits, epilogues); shape effects (tiles, waves, small K) come on top of it.
    gemm_efficiency: float = 0.75
    # Fraction of hbm_bandwidth that large streaming kernels (copy, add) sustain, counting bytes
    # read plus bytes written.
    memory_efficiency: float = 0.90
    # Fraction of the bf16/fp16 dense peak that the main loop of each fused SDPA backend
    # sustains at head dim 128 on long sequences ("cudnn", "flash" = FlashAttention-2 kernels
    # bundled with torch, "efficient" = the CUTLASS memory-efficient kernels).
    attention_efficiency: dict[str, float] = field(default_factory=dict)
    # Tensor-core FLOPs of time one exponential costs on the special-function units: dense
    # bf16 FLOP/clk/SM divided by 16 MUFU ops/clk/SM (Ampere 128, Hopper 256, Blackwell 512).
    # It is why softmax, not the matrix products, limits attention at small head dims.
    exp_cost_flops: float = 256.0
    # Host <-> device copies actually achieved, bytes/s per direction: from pinned host memory
    # (DMA straight from the page-locked buffer) and from pageable memory (staged by the driver
    # through a pinned bounce buffer, so slower).
    pinned_copy_bandwidth: float = 0.0
    pageable_copy_bandwidth: float = 0.0
    # Kernel time floor: the shortest kernels in real profiler traces take ~1-2.5 us of GPU time
    # (a 1-element add: 1.2 us on the H100); back-to-back tiny kernels also pay the gap between
    # them, so a stream of them advances ~2 us per kernel.
    min_kernel_ns: int = 2_000
    # Fixed part of a memory-bound kernel beyond bytes / bandwidth: ramp-up to full bandwidth
    # and the tail of the last wave. Equivalent to an achieved-bandwidth curve
    # bw(bytes) = peak * bytes / (bytes + ramp * peak).
    kernel_ramp_ns: int = 1_500

    @property
    def names(self) -> tuple[str, ...]:
        return (self.key, *self.aliases)


GPUS: tuple[GPUSpec, ...] = (
    GPUSpec(
        key="h100-sxm-80gb",
        aliases=("h100", "h100-sxm", "h100-80gb"),
        device_name="NVIDIA H100 80GB HBM3",
        total_memory=85_017_493_504,  # torch total_memory on a real H100 80GB HBM3 (79.18 GiB)
        capability=(9, 0),
        sm_count=132,
        l2_cache_bytes=50 * MiB,
        peak_flops={"fp64": 67e12, "fp32": 67e12, "tf32": 494.7e12, "bf16": 989.4e12,
                    "fp16": 989.4e12, "fp8": 1978.9e12, "int8": 1978.9e12},
        hbm_bandwidth=3.35e12,
        pcie_bandwidth=64e9,
        nvlink_bandwidth=450e9,
        # Measured (shared/calibration/h100_sxm_kernels.jsonl): bf16 mm 8192^3 ~694 TFLOP/s,
        # 4096x8192x8192 ~795; fp32 4096^3 ~51 of 67 TFLOP/s. 0.78 fits the large shapes.
        gemm_efficiency=0.78,
        memory_efficiency=0.90,  # measured: add/copy on 2^28 elements ~3.0 TB/s of 3.35
        # Fitted with phantora/cost/attention.py's constants to the calibration SDPA points
        # (cuDNN, the backend torch 2.11 picked on this H100) and to torch.profiler kernel
        # times of each backend (tests/data/groundtruth/h100_kernel_profile.json): cuDNN 146 us, FA2 273 us,
        # CUTLASS 477 us for causal 4x16x2048x128 bf16 forward.
        attention_efficiency={"cudnn": 0.84, "flash": 0.57, "efficient": 0.29},
        pinned_copy_bandwidth=55e9,  # measured: h2d/d2h of 256 MiB pinned ~55 GB/s
        pageable_copy_bandwidth=25e9,  # estimate: staged copies reach about half of pinned
    ),
    GPUSpec(
        # The H100s of TorchTitan's published Llama 3 benchmarks (pytorch/torchtitan
        # benchmarks/llama3_h100_202412_torchtitan.md, Meta's Grand Teton hosts): "96GB HBM2e with
        # 2.4 TB/sec peak memory bandwidth", "the default 500W power limit", and (its footnote)
        # "the actual peak TFLOPs number is between SXM and NVL". Same GH100 die as the SXM 80 GB
        # (132 SMs, 50 MiB L2, NVLink 4). Peak math: NVIDIA's datasheets give the bf16 dense peak
        # at 989.4 TFLOP/s for the SXM at 700 W and 835 for the H100 NVL (same 132 SMs) at 400 W;
        # interpolated linearly in power to 500 W: 835 + (989.4 - 835) / 3 = 886.5 TFLOP/s, i.e. a
        # sustained tensor clock of 886.5e12 / (132 SMs x 4096 FLOP/clk) = 1.64 GHz instead of 1.83.
        # Every compute type scales by that ratio (0.896). An estimate, not a measurement.
        key="h100-sxm-96gb-500w",
        aliases=("h100-96gb",),
        device_name="NVIDIA H100 96GB HBM2e",  # not read from a real card
        # 96 GiB less what the driver keeps on the 80 GB card (80 GiB - 85,017,493,504 B)
        total_memory=96 * GiB - (80 * GiB - 85_017_493_504),
        capability=(9, 0),
        sm_count=132,
        l2_cache_bytes=50 * MiB,
        peak_flops={"fp64": 60.0e12, "fp32": 60.0e12, "tf32": 443.3e12, "bf16": 886.5e12,
                    "fp16": 886.5e12, "fp8": 1773e12, "int8": 1773e12},
        hbm_bandwidth=2.4e12,
        pcie_bandwidth=64e9,
        nvlink_bandwidth=450e9,
        # As the H100 SXM 80 GB (measured there); the lower clock is in peak_flops already
        gemm_efficiency=0.78,
        memory_efficiency=0.90,
        attention_efficiency={"cudnn": 0.84, "flash": 0.57, "efficient": 0.29},
        pinned_copy_bandwidth=55e9,
        pageable_copy_bandwidth=25e9,
    ),
    GPUSpec(
        key="h200-sxm-141gb",
        aliases=("h200", "h200-sxm"),
        device_name="NVIDIA H200",
        total_memory=143771 * MiB,  # nvidia-smi on the lent H200: 143771 MiB
        capability=(9, 0),
        sm_count=132,
        l2_cache_bytes=60 * MiB,
        peak_flops={"fp64": 67e12, "fp32": 67e12, "tf32": 494.7e12, "bf16": 989.4e12,
                    "fp16": 989.4e12, "fp8": 1978.9e12, "int8": 1978.9e12},
        hbm_bandwidth=4.8e12,
        pcie_bandwidth=64e9,
        nvlink_bandwidth=450e9,
        # Estimate: same die and power limit as the H100 SXM; the lent H200 ran bf16 8192^3 at
        # ~790 TFLOP/s (device/KINDS.md), about what the H100 reaches on its best shapes.
        gemm_efficiency=0.79,
        memory_efficiency=0.90,  # seen on the lent H200: a d2d copy moved ~4.3 TB/s of 4.8
        attention_efficiency={"cudnn": 0.84, "flash": 0.57, "efficient": 0.29},  # as H100
        pinned_copy_bandwidth=55e9,  # estimate: same PCIe gen5 host link as the H100
        pageable_copy_bandwidth=25e9,
    ),
    GPUSpec(
        key="a100-sxm-80gb",
        aliases=("a100", "a100-sxm", "a100-80gb"),
        device_name="NVIDIA A100-SXM4-80GB",
        total_memory=81920 * MiB,
        capability=(8, 0),
        sm_count=108,
        l2_cache_bytes=40 * MiB,
        peak_flops={"fp64": 19.5e12, "fp32": 19.5e12, "tf32": 156e12, "bf16": 312e12,
                    "fp16": 312e12, "int8": 624e12},
        hbm_bandwidth=2.039e12,
        pcie_bandwidth=32e9,
        nvlink_bandwidth=300e9,
        # Estimates: A100 cuBLAS bf16 sustains ~270-290 of 312 TFLOP/s (it rarely throttles);
        # streaming kernels ~1.75-1.85 TB/s; FA2 was tuned for this chip.
        gemm_efficiency=0.86,
        memory_efficiency=0.88,
        attention_efficiency={"cudnn": 0.75, "flash": 0.80, "efficient": 0.55},
        exp_cost_flops=128.0,
        pinned_copy_bandwidth=25e9,  # PCIe gen4 x16
        pageable_copy_bandwidth=12e9,
    ),
    GPUSpec(
        key="b200-sxm-180gb",
        aliases=("b200", "b200-sxm"),
        device_name="NVIDIA B200",
        total_memory=183359 * MiB,
        capability=(10, 0),
        sm_count=148,
        l2_cache_bytes=126 * MiB,
        peak_flops={"fp64": 37e12, "fp32": 75e12, "tf32": 1100e12, "bf16": 2250e12,
                    "fp16": 2250e12, "fp8": 4500e12, "int8": 4500e12},
        hbm_bandwidth=8.0e12,
        pcie_bandwidth=64e9,
        nvlink_bandwidth=900e9,
        # Estimates: early B200 reports ~1.5-1.7 PFLOP/s bf16 GEMM and ~6.5-7 TB/s; the FA2
        # kernels in torch are sm80 code without Blackwell tensor-core instructions.
        gemm_efficiency=0.72,
        memory_efficiency=0.85,
        attention_efficiency={"cudnn": 0.80, "flash": 0.30, "efficient": 0.20},
        exp_cost_flops=512.0,
        pinned_copy_bandwidth=55e9,
        pageable_copy_bandwidth=25e9,
    ),
)

DEFAULT_GPU = "h100-sxm-80gb"


class UnknownGPUError(ValueError):
    pass


def known_gpu_names() -> list[str]:
    return [n for g in GPUS for n in g.names]


def lookup_gpu(name: str) -> GPUSpec:
    """Find a GPU by full or short name, case-insensitively ("H100", "h100-sxm-80gb")."""
    wanted = name.strip().lower().replace("_", "-").replace(" ", "-")
    for gpu in GPUS:
        if wanted in gpu.names:
            return gpu
    choices = ", ".join(f"{g.key} ({'/'.join(g.aliases)})" for g in GPUS)
    raise UnknownGPUError(f"unknown GPU {name!r}; known GPUs: {choices}")
