"""Small clusters for network tests, written in the cluster TOML format."""

from __future__ import annotations

import pytest

from phantora.net import cluster_from_toml, load_cluster

# 2 nodes x 4 GPUs, one NIC per GPU, one node per leaf so that every inter-node transfer
# crosses a spine; ECMP hashing. Small enough for hypothesis to try many flow sets.
SMALL_TOML = """
name = "small"
nodes = 2
[node]
gpus = 4
gpu = "h100"
intra = "nvswitch"
nvls = true
[node.nvlink]
bandwidth = "400 GB/s"
latency = "100 ns"
efficiency = 1.0
[node.pcie]
bandwidth = "64 GB/s"
latency = "100 ns"
efficiency = 1.0
[node.nic]
count = 4
bandwidth = "400 Gb/s"
latency = "500 ns"
efficiency = 1.0
[fabric]
topology = "leaf_spine"
rail_optimized = true
nodes_per_leaf = 1
spines = 2
oversubscription = 2.0
routing = "ecmp"
link_latency = "300 ns"
"""


@pytest.fixture(scope="session")
def small_cluster():
    return cluster_from_toml(SMALL_TOML, source="small")


@pytest.fixture(scope="session")
def h100():
    return load_cluster("dgx-h100")
