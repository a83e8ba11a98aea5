"""The one table of GPU models phantora can simulate.

Every per-GPU fact (peak FLOP/s per dtype, memory size and bandwidth, what torch.cuda reports)
lives here and nowhere else. Figures are vendor datasheet values for dense math unless noted;
what a real kernel achieves relative to them is the cost model's business (phantora/cost).
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
