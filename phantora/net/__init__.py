"""phantora.net: flow-level network simulator (pure Python + numpy; never imports torch).

Where things happen:
  cluster.py      cluster description (TOML format, validation, load_cluster, describe)
  presets.py      built-in clusters: dgx-h100, dgx-h200, dgx-a100, ethernet
  topology.py     links, capacities, routes (NVLink, PCIe, NICs, leaf/spine, fat tree, ECMP)
  maxmin.py       max-min fair rates by progressive filling
  tuning.py       NCCL's latency/protocol model and algorithm choice (NCCL_ALGO/NCCL_PROTO)
  collectives.py  collectives as flow groups per NCCL algorithm (ring, tree, NVLS, p2p)
  fluid.py        event-driven fluid simulation, per-flow rate history, islands
  rollback.py     rewinding for late arrivals; pruning history nobody can roll back to
  network.py      Network: the engine's interface (submit, finish_time, corrections, prune)
  records.py      the dataclasses that cross this boundary
"""

from phantora.net.cluster import (Cluster, ClusterConfigError, FabricSpec, LinkSpec, NodeSpec,
                                  cluster_from_toml, describe_cluster, describe_presets,
                                  load_cluster, preset_names)
from phantora.net.network import MODES, Network, NetworkConfig
from phantora.net.presets import preset_toml
from phantora.net.records import (OPS, CollectiveInfo, CollectiveSpec, Correction, FlowRecord,
                                  LinkInfo, LinkSegment, NetworkStats, RollbackRecord)
from phantora.net.tuning import NcclConstants

__all__ = [
    "Cluster", "ClusterConfigError", "FabricSpec", "LinkSpec", "NodeSpec", "cluster_from_toml",
    "describe_cluster", "describe_presets", "load_cluster", "preset_names", "preset_toml",
    "MODES", "Network", "NetworkConfig", "NcclConstants",
    "OPS", "CollectiveInfo", "CollectiveSpec", "Correction", "FlowRecord", "LinkInfo",
    "LinkSegment", "NetworkStats", "RollbackRecord",
]
