"""The one table of GPU models phantora can simulate.

Every per-GPU fact lives here and nowhere else, in two groups:

- Published figures, each entry's `sources` saying where from: SM count, the clocks the vendor's
  dense peaks are stated at, dense FLOP per clock per SM of each compute type (an architecture
  figure: H100 and H200 share the Hopper SM's), L2 size, HBM bandwidth, the board power limit.
  Peak FLOP/s are derived from them (SMs x clock x FLOP/clk/SM), never typed in, so a GPU is its
  own model and not another GPU scaled by a ratio.
- What real kernels achieve on that GPU (the fractions of those peaks), each saying whether it was
  measured (shared/calibration, tests/data/groundtruth, device/KINDS.md) or is an estimate. The
  cost model (phantora/cost) combines them with per-shape effects (tile and wave quantization,
  launch ramp, kernel counts).

A variant of a listed GPU (another memory size or power limit) is one more GPUSpec: copy the
base entry's published figures it shares (`dataclasses.replace(base, key=..., ...)` keeps them in
one place) and change only what differs. A lower power limit lowers the clock the SMs sustain
under dense math, so its `gemm_efficiency` (achieved / datasheet peak) scales by
sustained clock / `tensor_clock_mhz`; memory-bound rates do not depend on it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from functools import cached_property

GiB = 1024**3
MiB = 1024**2

# Compute types that run on tensor cores (their datasheet peaks are stated at tensor_clock_mhz);
# the others run on the SIMT (CUDA) cores, stated at boost_clock_mhz.
TENSOR_TYPES = frozenset({"tf32", "bf16", "fp16", "fp8", "int8"})

# Dense FLOP per clock per SM (an FMA counts 2), by architecture. One place per fact: H100 and
# H200 are the same Hopper SM. Sources: NVIDIA A100 Tensor Core GPU Architecture whitepaper
# (2020, table 1: per-SM rates), NVIDIA H100 Tensor Core GPU Architecture whitepaper (2022,
# table 2 and the SM section: 4 tensor cores of 512 dense FP16 FMA/clk), NVIDIA Blackwell
# architecture technical brief (2024). "fp64" is the FP64 rate torch's fp64 matmuls reach (the
# tensor-core DMMA path on A100/H100).
AMPERE_SM = {"fp64": 128, "fp32": 128, "tf32": 1024, "bf16": 2048, "fp16": 2048, "int8": 4096}
HOPPER_SM = {"fp64": 256, "fp32": 256, "tf32": 2048, "bf16": 4096, "fp16": 4096, "fp8": 8192, "int8": 8192}
BLACKWELL_SM = {"fp64": 128, "fp32": 256, "tf32": 4096, "bf16": 8192, "fp16": 8192, "fp8": 16384, "int8": 16384}
# fp64 on Hopper / Ampere runs on the tensor cores (DMMA) but is stated at the SIMT boost clock in
# the datasheets (H100 SXM 66.9 TFLOP/s = 132 x 256 x 1.98 GHz), so it is not in TENSOR_TYPES.

# Bytes per clock per SM that the H100 sweep's kernels are measured against: on the H100 the SMs
# and DRAM stream at the same ~3.0 TB/s (3.015e12 / (132 x 1.98 GHz) = 11.54 B/clk/SM). A kernel
# that reached under fitted.SM_BOUND_BELOW of that rate did not wait on DRAM but on its SMs
# (issue, atomics, one block per channel, latency with little parallelism), so on another GPU it
# runs at the same fraction of SMs x clock x this figure: one fact of the SM, not of the memory.
# The same Hopper SM streams more when the DRAM allows (a d2d copy moves ~4.3 TB/s on the lent
# H200, 16.5 B/clk/SM), so this is the normalizer of the SM-bound rule, not the SM's ceiling.
# Blackwell (B200) takes it too, for want of a measurement: its SM-bound kernels then scale with
# SMs x clock, 148 / 132 of the H100's.
SM_BOUND_BYTES_PER_CLK = 11.54


@dataclass(frozen=True)
class GPUSpec:
    key: str  # canonical full name accepted by --gpu, e.g. "h100-sxm-80gb"
    aliases: tuple[str, ...]  # short names accepted by --gpu, e.g. ("h100",)
    device_name: str  # what torch.cuda.get_device_name() returns on the real card
    total_memory: int  # bytes, as torch.cuda.get_device_properties().total_memory reports
    capability: tuple[int, int]
    # --- published figures ---
    sm_count: int
    l2_cache_bytes: int
    boost_clock_mhz: float = 0.0  # max SM clock; the SIMT (fp32/fp64) datasheet peaks use it
    tensor_clock_mhz: float = 0.0  # the clock the dense tensor-core datasheet peaks are stated at
    power_limit_w: int = 0  # board power limit the datasheet figures (and the achieved ones) hold under
    # Dense FLOP per clock per SM by compute type (one of the *_SM tables above). "fp32" is
    # true (non tensor core) FP32, what torch uses by default (TF32 off); "tf32" applies when
    # torch.backends.cuda.matmul.allow_tf32 / set_float32_matmul_precision('high') is on.
    flops_per_clk_per_sm: dict[str, float] = field(default_factory=dict)
    hbm_bandwidth: float = 0.0  # bytes/s, datasheet
    pcie_bandwidth: float = 0.0  # bytes/s per direction, datasheet (host <-> device)
    nvlink_bandwidth: float = 0.0  # bytes/s per direction per GPU, datasheet
    max_threads_per_sm: int = 2048
    regs_per_sm: int = 65536
    warp_size: int = 32
    sources: tuple[str, ...] = ()  # where the published and measured figures of this entry come from
    # --- What real kernels achieve on this GPU (used by phantora/cost) ---
    # Fraction of the dense peak that large, well-shaped cuBLAS GEMMs sustain (clock and power
    # limits, epilogues); shape effects (tiles, waves, small K) come on top of it.
    gemm_efficiency: float = 0.75
    # The same for the GEMM-like kernels that are not cuBLAS's: cuDNN's implicit-GEMM convolutions
    # (phantora/cost/conv.py) and torch's grouped GEMMs (CUTLASS; gemm.grouped_mm), where it differs
    # from cuBLAS's; None: gemm_efficiency.
    other_gemm_efficiency: float | None = None
    # Fraction of hbm_bandwidth that large streaming kernels (copy, add) sustain, counting bytes
    # read plus bytes written.
    memory_efficiency: float = 0.90
    # Bytes per clock per SM of the SM-bound rule (SM_BOUND_BYTES_PER_CLK above). Kernels that
    # reach well under the streaming rate (BatchNorm's channels_last passes, column reductions,
    # unaligned convolutions: phantora/cost/fitted.py SM_BOUND_BELOW, streaming_rate) are limited
    # on the SM side, not by DRAM, so they run at a fraction of SMs x boost clock x this,
    # whatever the HBM.
    sm_stream_bytes_per_clk: float = SM_BOUND_BYTES_PER_CLK
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
    # (H100 ResNet-50 profile, shared/groundtruth: kernels under 3 us last 1.4 us at the median).
    min_kernel_ns: int = 1_400
    # Idle time between consecutive kernels of a stream that has work queued (the GPU front end
    # fetching and setting up the next launch). H100 ResNet-50 profile: 1.63 us median, 1.70 mean
    # over the 543 kernels launched >100 us before they started; so a stream of tiny kernels
    # advances ~3 us per kernel (1.4 + 1.6; measured 2.94 at the median).
    kernel_gap_ns: int = 1_600
    # Fixed part of a memory-bound kernel beyond bytes / bandwidth: ramp-up to full bandwidth
    # and the tail of the last wave. Equivalent to an achieved-bandwidth curve
    # bw(bytes) = peak * bytes / (bytes + ramp * peak).
    kernel_ramp_ns: int = 1_500

    @property
    def names(self) -> tuple[str, ...]:
        return (self.key, *self.aliases)

    @cached_property
    def peak_flops(self) -> dict[str, float]:
        """Dense peak FLOP/s by compute type: SMs x the clock the datasheet states it at x FLOP/clk/SM."""
        return {ct: self.sm_count * per_clk * 1e6 * (self.tensor_clock_mhz if ct in TENSOR_TYPES else self.boost_clock_mhz)
                for ct, per_clk in self.flops_per_clk_per_sm.items()}

    @property
    def achieved_memory_bandwidth(self) -> float:
        """Bytes/s large streaming kernels sustain (read plus written)."""
        return self.hbm_bandwidth * self.memory_efficiency

    @property
    def sm_stream_bandwidth(self) -> float:
        """Bytes/s of the SM-bound rule (fitted.streaming_rate): SMs x boost clock x bytes/clk/SM."""
        return self.sm_count * self.boost_clock_mhz * 1e6 * self.sm_stream_bytes_per_clk


H100_SXM_80GB = GPUSpec(
    key="h100-sxm-80gb",
    aliases=("h100", "h100-sxm", "h100-80gb"),
    device_name="NVIDIA H100 80GB HBM3",
    total_memory=85_017_493_504,  # torch total_memory on a real H100 80GB HBM3 (79.18 GiB)
    capability=(9, 0),
    sm_count=132,
    l2_cache_bytes=50 * MiB,
    boost_clock_mhz=1980,  # max SM clock (nvidia-smi); FP32 66.9 TFLOP/s = 132 x 256 x 1.98 GHz
    tensor_clock_mhz=1830,  # BF16 dense 989.4 TFLOP/s = 132 x 4096 x 1.83 GHz
    power_limit_w=700,
    flops_per_clk_per_sm=HOPPER_SM,
    hbm_bandwidth=3.35e12,
    pcie_bandwidth=64e9,
    nvlink_bandwidth=450e9,
    sources=(
        "NVIDIA H100 Tensor Core GPU datasheet (SXM5: 989.4 TFLOP/s BF16 dense, 66.9 FP32, 3.35 TB/s HBM3, "
        "700 W, NVLink 900 GB/s bidirectional, PCIe gen5) and H100 architecture whitepaper (132 SMs, 50 MB L2)",
        "measured: shared/calibration/h100_sxm_kernels.jsonl (torch 2.11, max SM clock 1980 MHz, 700 W)",
        "measured: tests/data/groundtruth/h100_kernel_profile.json (torch.profiler kernel times per SDPA backend)",
    ),
    # Measured (shared/calibration/h100_sxm_kernels.jsonl): bf16 mm 8192^3 ~694 TFLOP/s,
    # 4096x8192x8192 ~795; fp32 4096^3 ~51 of 67 TFLOP/s. 0.78 fits the large shapes.
    gemm_efficiency=0.78,
    memory_efficiency=0.90,  # measured: add/copy on 2^28 elements ~3.0 TB/s of 3.35
    sm_stream_bytes_per_clk=SM_BOUND_BYTES_PER_CLK,  # defined by this GPU's streaming rate (above)
    # Fitted with phantora/cost/attention.py's constants to the calibration SDPA points
    # (cuDNN, the backend torch 2.11 picked on this H100) and to torch.profiler kernel
    # times of each backend (tests/data/groundtruth/h100_kernel_profile.json): cuDNN 146 us, FA2 273 us,
    # CUTLASS 477 us for causal 4x16x2048x128 bf16 forward.
    attention_efficiency={"cudnn": 0.84, "flash": 0.57, "efficient": 0.29},
    pinned_copy_bandwidth=55e9,  # measured: h2d/d2h of 256 MiB pinned ~55 GB/s
    pageable_copy_bandwidth=25e9,  # estimate: staged copies reach about half of pinned
)

H200_SXM_141GB = GPUSpec(
    key="h200-sxm-141gb",
    aliases=("h200", "h200-sxm"),
    device_name="NVIDIA H200",
    total_memory=143771 * MiB,  # nvidia-smi on the lent H200: 143771 MiB
    capability=(9, 0),
    sm_count=132,  # the H100's die: PyTorch on the lent H200 reports 132 SMs
    l2_cache_bytes=60 * MiB,  # PyTorch on the lent H200 reports 60 MB of L2 (device/KINDS.md)
    boost_clock_mhz=1980,  # as H100 SXM; 1980 MHz read by nvidia-smi right after bf16 GEMMs
    tensor_clock_mhz=1830,  # the datasheet's 989 TFLOP/s BF16 dense, as H100 SXM
    power_limit_w=700,
    flops_per_clk_per_sm=HOPPER_SM,
    hbm_bandwidth=4.8e12,
    pcie_bandwidth=64e9,
    nvlink_bandwidth=450e9,
    sources=(
        "NVIDIA H200 Tensor Core GPU datasheet (SXM: 141 GB HBM3e at 4.8 TB/s, up to 700 W, H100's compute rates)",
        "seen on the lent H200 (device/KINDS.md, 2026-10-28 and 11-04): 132 SMs, 60 MB L2, d2d copy ~4.3 TB/s, "
        "bf16 8192^3 mm 769-798 TFLOP/s on random data",
    ),
    # Fitted to the lent H200's kernel sweep (phantora/cost/data/h200_sxm_sweep.jsonl, torch.profiler,
    # no launch gaps): bf16 8192x14336x4096 in 1197 us (804 TFLOP/s; the H100 sweep's 806), which
    # 0.84 gives exactly (0.79 before, from 8192^3 at 769-798 TFLOP/s on random data, device/KINDS.md:
    # 0.84 gives 815). Held out, the lent H200's training profiles' aten::mm time (whole programs):
    # Llama 1B / 3B / 8B-accum / 1B-8k +2.6 / +4.2 / +1.3 / +1.1% (0.79: +9.0 / +10.7 / +7.7 / +7.5%),
    # GPT-124M / small -0.6 / -0.2% (+5.5 / +5.7%); the sweep's K=768 ViT shapes -15% / -14% (-10 / -9%).
    gemm_efficiency=0.84,
    # cuDNN's implicit-GEMM convolutions and the grouped GEMMs keep 0.79: the H200 sweep runs the
    # grouped GEMMs as fast as the H100 (H200 / H100 1.000-1.007; with 0.84 the model read them
    # -5.2% -> -10.7%) and its 64-channel 3x3 conv NHWC moved away with 0.84 (-9.3% -> -11.5%).
    other_gemm_efficiency=0.79,
    memory_efficiency=0.90,  # seen on the lent H200: a d2d copy moved ~4.3 TB/s of 4.8
    sm_stream_bytes_per_clk=SM_BOUND_BYTES_PER_CLK,  # the H100's SM at the H100's clock: SM-bound kernels run as fast as there
    attention_efficiency={"cudnn": 0.84, "flash": 0.57, "efficient": 0.29},  # estimate: as H100 (same SM)
    pinned_copy_bandwidth=55e9,  # estimate: same PCIe gen5 host link as the H100
    pageable_copy_bandwidth=25e9,
)

A100_SXM_80GB = GPUSpec(
    key="a100-sxm-80gb",
    aliases=("a100", "a100-sxm", "a100-80gb"),
    device_name="NVIDIA A100-SXM4-80GB",
    total_memory=81920 * MiB,
    capability=(8, 0),
    sm_count=108,
    l2_cache_bytes=40 * MiB,
    boost_clock_mhz=1410,  # BF16 dense 312 TFLOP/s = 108 x 2048 x 1.41 GHz; FP32 19.5 = 108 x 128 x 1.41
    tensor_clock_mhz=1410,
    power_limit_w=400,
    flops_per_clk_per_sm=AMPERE_SM,
    hbm_bandwidth=2.039e12,
    pcie_bandwidth=32e9,
    nvlink_bandwidth=300e9,
    sources=(
        "NVIDIA A100 Tensor Core GPU datasheet (SXM4 80GB: 312 TFLOP/s BF16 dense, 19.5 FP32, 2,039 GB/s HBM2e, "
        "400 W, NVLink 600 GB/s bidirectional, PCIe gen4) and A100 architecture whitepaper (108 SMs, 1410 MHz, 40 MB L2)",
        "achieved fractions: estimates, no A100 measurement in this repository",
    ),
    # Estimates: A100 cuBLAS bf16 sustains ~270-290 of 312 TFLOP/s (it rarely throttles);
    # streaming kernels ~1.75-1.85 TB/s; FA2 was tuned for this chip.
    gemm_efficiency=0.86,
    memory_efficiency=0.88,
    sm_stream_bytes_per_clk=11.8,  # estimate: SM side matched to its DRAM, as measured on the H100
    attention_efficiency={"cudnn": 0.75, "flash": 0.80, "efficient": 0.55},
    exp_cost_flops=128.0,
    pinned_copy_bandwidth=25e9,  # PCIe gen4 x16
    pageable_copy_bandwidth=12e9,
)

B200_SXM_180GB = GPUSpec(
    key="b200-sxm-180gb",
    aliases=("b200", "b200-sxm"),
    device_name="NVIDIA B200",
    total_memory=183359 * MiB,
    capability=(10, 0),
    sm_count=148,
    l2_cache_bytes=126 * MiB,
    boost_clock_mhz=1980,  # implied by the datasheet's 75 TFLOP/s FP32 = 148 x 256 x 1.98 GHz
    tensor_clock_mhz=1856,  # implied by 2.25 PFLOP/s BF16 dense = 148 x 8192 x 1.856 GHz
    power_limit_w=1000,
    flops_per_clk_per_sm=BLACKWELL_SM,
    hbm_bandwidth=8.0e12,
    pcie_bandwidth=64e9,
    nvlink_bandwidth=900e9,
    sources=(
        "NVIDIA DGX B200 / HGX B200 datasheet, per GPU (2.25 PFLOP/s BF16 dense, 4.5 FP8, 75 TFLOP/s FP32, "
        "8 TB/s HBM3e, 1000 W, NVLink 5 1.8 TB/s bidirectional) and Blackwell architecture technical brief (148 SMs, "
        "126 MB L2)",
        "achieved fractions: estimates, no B200 measurement in this repository",
    ),
    # Estimates: early B200 reports ~1.5-1.7 PFLOP/s bf16 GEMM and ~6.5-7 TB/s; the FA2
    # kernels in torch are sm80 code without Blackwell tensor-core instructions.
    gemm_efficiency=0.72,
    memory_efficiency=0.85,
    # SM-bound kernels scale with SMs x clock (SM_BOUND_BYTES_PER_CLK); was 23.2 ("SM side matched
    # to its DRAM"), which the H200's 16.5 B/clk/SM copy shows is not how the Hopper SM is sized
    sm_stream_bytes_per_clk=SM_BOUND_BYTES_PER_CLK,
    attention_efficiency={"cudnn": 0.80, "flash": 0.30, "efficient": 0.20},
    exp_cost_flops=512.0,
    pinned_copy_bandwidth=55e9,
    pageable_copy_bandwidth=25e9,
)

# The H100s of TorchTitan's published Llama 3 benchmarks (pytorch/torchtitan
# benchmarks/llama3_h100_202412_torchtitan.md, Meta's Grand Teton hosts): "96GB HBM2e with 2.4
# TB/sec peak memory bandwidth", "the default 500W power limit", and (its footnote) "the actual
# peak TFLOPs number is between SXM and NVL". Same GH100 die as the SXM 80 GB (132 SMs, 50 MiB L2,
# NVLink 4). Sustained dense clock at 500 W: NVIDIA's datasheets give BF16 dense 989.4 TFLOP/s for
# the SXM at 700 W and 835 for the H100 NVL (same 132 SMs) at 400 W; interpolated linearly in power
# to 500 W, 835 + (989.4 - 835) / 3 = 886.5 TFLOP/s, a sustained tensor clock of 1.64 GHz instead
# of 1.83 (ratio 0.896), which scales every dense-math fraction (module docstring). An estimate,
# not a measurement.
_H100_500W_CLOCK_RATIO = 886.5 / 989.4
H100_SXM_96GB_500W = dataclasses.replace(
    H100_SXM_80GB,
    key="h100-sxm-96gb-500w",
    aliases=("h100-96gb",),
    device_name="NVIDIA H100 96GB HBM2e",  # not read from a real card
    # 96 GiB less what the driver keeps on the 80 GB card (80 GiB - 85,017,493,504 B)
    total_memory=96 * GiB - (80 * GiB - 85_017_493_504),
    power_limit_w=500,
    hbm_bandwidth=2.4e12,
    sources=(
        "pytorch/torchtitan benchmarks/llama3_h100_202412_torchtitan.md (96 GB HBM2e, 2.4 TB/s, 500 W)",
        "NVIDIA H100 datasheet: SXM5 989.4 TFLOP/s BF16 dense at 700 W, NVL 835 at 400 W (interpolated to 500 W)",
        *H100_SXM_80GB.sources[1:],
    ),
    gemm_efficiency=H100_SXM_80GB.gemm_efficiency * _H100_500W_CLOCK_RATIO,
    attention_efficiency={k: v * _H100_500W_CLOCK_RATIO for k, v in H100_SXM_80GB.attention_efficiency.items()},
)

GPUS: tuple[GPUSpec, ...] = (H100_SXM_80GB, H100_SXM_96GB_500W, H200_SXM_141GB, A100_SXM_80GB, B200_SXM_180GB)

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
