"""Built-in cluster descriptions, written in the same TOML format users write.

Keeping presets as TOML (not Python objects) means every preset goes through the one parser
and validator, and `phantora`'s users can start a file of their own from `preset_toml(name)`.

Where the efficiencies come from (fraction of line rate NCCL traffic gets on a link):
- NVLink 4 (H100/H200): NCCL's own topology model counts 20.6 GB/s x 18 links = 370.8 GB/s
  per GPU per direction of the 450 GB/s line rate (0.824); nccl-tests ring all-reduce on
  8x H100 reaches ~370 GB/s bus bandwidth. NVLink 3 (A100): 20 GB/s x 12 = 240 of 300 (0.80).
- InfiniBand: 46-48 GB/s measured per NDR 400 Gb/s NIC (0.95 of 50 GB/s); 8x HDR 200 Gb/s
  give ~192 GB/s all-reduce bus bandwidth on 8x A100 nodes (0.96 of 25 GB/s per NIC).
- PCIe: pinned host copies reach ~55 GB/s on Gen5 x16 (0.85 of 64 GB/s).
Latencies are hardware (wire + switch) latencies; NCCL's software/protocol latency per
algorithm step is added on top by tuning.py.
"""

from __future__ import annotations

PRESETS: dict[str, str] = {
    "dgx-h100": """
name = "dgx-h100"
description = "NVIDIA DGX H100: 8x H100 SXM on NVSwitch (NVLS), 8x 400 Gb/s NDR InfiniBand, rail-optimized leaf/spine (SuperPOD-style, 32 nodes per rail leaf)"
nodes = 1

[node]
gpus = 8
gpu = "h100-sxm-80gb"
intra = "nvswitch"
nvls = true

[node.nvlink]
bandwidth = "450 GB/s"
latency = "0.1 us"
efficiency = 0.824

[node.pcie]
bandwidth = "64 GB/s"
latency = "0.1 us"
efficiency = 0.85

[node.nic]
count = 8
bandwidth = "400 Gb/s"
latency = "0.5 us"
efficiency = 0.95

[fabric]
topology = "leaf_spine"
rail_optimized = true
nodes_per_leaf = 32
spines = 16
oversubscription = 1.0
routing = "adaptive"
link_latency = "0.3 us"
""",
    "dgx-h200": """
name = "dgx-h200"
description = "NVIDIA DGX H200: 8x H200 SXM on NVSwitch (NVLS), 8x 400 Gb/s NDR InfiniBand, rail-optimized leaf/spine (32 nodes per rail leaf)"
nodes = 1

[node]
gpus = 8
gpu = "h200-sxm-141gb"
intra = "nvswitch"
nvls = true

[node.nvlink]
bandwidth = "450 GB/s"
latency = "0.1 us"
efficiency = 0.824

[node.pcie]
bandwidth = "64 GB/s"
latency = "0.1 us"
efficiency = 0.85

[node.nic]
count = 8
bandwidth = "400 Gb/s"
latency = "0.5 us"
efficiency = 0.95

[fabric]
topology = "leaf_spine"
rail_optimized = true
nodes_per_leaf = 32
spines = 16
oversubscription = 1.0
routing = "adaptive"
link_latency = "0.3 us"
""",
    "dgx-a100": """
name = "dgx-a100"
description = "NVIDIA DGX A100: 8x A100 SXM on NVSwitch (no NVLS), 8x 200 Gb/s HDR InfiniBand, rail-optimized leaf/spine (20 nodes per rail leaf)"
nodes = 1

[node]
gpus = 8
gpu = "a100-sxm-80gb"
intra = "nvswitch"
nvls = false

[node.nvlink]
bandwidth = "300 GB/s"
latency = "0.1 us"
efficiency = 0.80

[node.pcie]
bandwidth = "32 GB/s"
latency = "0.1 us"
efficiency = 0.85

[node.nic]
count = 8
bandwidth = "200 Gb/s"
latency = "0.5 us"
efficiency = 0.96

[fabric]
topology = "leaf_spine"
rail_optimized = true
nodes_per_leaf = 20
spines = 10
oversubscription = 1.0
routing = "adaptive"
link_latency = "0.3 us"
""",
    "ethernet": """
name = "ethernet"
description = "Generic Ethernet cluster: 8 GPUs per node on PCIe (no NVLink), 2x 100 Gb/s RoCE NICs, top-of-rack leaf/spine at 2:1 oversubscription, ECMP hashing"
nodes = 1

[node]
gpus = 8
gpu = "a100-sxm-80gb"
intra = "pcie"
nvls = false

[node.pcie]
bandwidth = "32 GB/s"
latency = "0.2 us"
efficiency = 0.85

[node.nic]
count = 2
bandwidth = "100 Gb/s"
latency = "1.0 us"
efficiency = 0.92

[fabric]
topology = "leaf_spine"
rail_optimized = false
nodes_per_leaf = 16
spines = 4
oversubscription = 2.0
routing = "ecmp"
link_latency = "0.5 us"
""",
}


def preset_toml(name: str) -> str:
    """The TOML text of a preset, e.g. to start a cluster file of one's own."""
    return PRESETS[name].lstrip()
