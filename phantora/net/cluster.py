"""Cluster description: what the simulated machines and their network are.

A cluster is N identical nodes. Each node has G GPUs joined either by NVSwitch (every GPU has
one NVLink port group to the switch) or by PCIe only, and K NICs (GPU g uses NIC
g * K // G, its nearest). NICs plug into a two-tier leaf/spine fabric or a three-tier fat tree
(leaf / aggregation per pod / core), optionally rail-optimized (NIC k of every node on the
rail-k leaf of its scalable unit) and optionally oversubscribed.

Global GPU index g = node * gpus_per_node + local_index, everywhere in phantora.net.

The file format is TOML; see presets.py for complete examples. Bandwidths are strings with a
unit ("400 Gb/s", "450 GB/s"), latencies too ("0.5 us", "300 ns"). Every error names the bad
field and, where there is a fixed set, the allowed values.
"""

from __future__ import annotations

import math
import os
import re
import tomllib
from dataclasses import dataclass, replace
from typing import Any

from phantora.hardware import GPUSpec, UnknownGPUError, known_gpu_names, lookup_gpu
from phantora.net.presets import PRESETS

INTRA_KINDS = ("nvswitch", "pcie")
FABRIC_TOPOLOGIES = ("leaf_spine", "fat_tree")
ROUTINGS = ("adaptive", "ecmp")

_BANDWIDTH_UNITS = {  # to GB/s
    "Tb/s": 125.0, "Gb/s": 0.125, "Mb/s": 0.000125,
    "TB/s": 1000.0, "GB/s": 1.0, "MB/s": 0.001,
}
_LATENCY_UNITS = {"ns": 1.0, "us": 1e3, "µs": 1e3, "ms": 1e6}
_QUANTITY = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*([^\s0-9].*?)\s*$")


class ClusterConfigError(ValueError):
    """A cluster description that cannot be used. `field` is the dotted path of the bad
    entry (e.g. "fabric.routing"); `allowed` lists the accepted values when there is a set."""

    def __init__(self, field: str, message: str, allowed: tuple[str, ...] = (), source: str = ""):
        self.field = field
        self.allowed = allowed
        self.source = source
        text = f"{field}: {message}" if field else message
        if allowed:
            text += f" (allowed: {', '.join(allowed)})"
        if source:
            text = f"{source}: {text}"
        super().__init__(text)


@dataclass(frozen=True)
class LinkSpec:
    """One kind of link. bandwidth: line rate in GB/s per direction; efficiency: the fraction
    of it NCCL traffic achieves (protocol and packet overhead)."""

    bandwidth: float
    latency_ns: float
    efficiency: float

    @property
    def capacity(self) -> float:
        return self.bandwidth * self.efficiency


@dataclass(frozen=True)
class NodeSpec:
    gpus: int
    gpu: str  # canonical key in phantora.hardware
    intra: str  # "nvswitch" | "pcie"
    nvls: bool  # NVSwitch multicast/in-switch reduction (NCCL's NVLS algorithms)
    nvlink: LinkSpec | None  # per GPU, GPU <-> NVSwitch; None on PCIe-only nodes
    pcie: LinkSpec  # per GPU, GPU <-> its PCIe switch (GPU-GPU on PCIe nodes, GPU-NIC)
    nics: int
    nic: LinkSpec  # per NIC, NIC <-> leaf switch


@dataclass(frozen=True)
class FabricSpec:
    topology: str  # "leaf_spine" | "fat_tree"
    rail_optimized: bool
    nodes_per_leaf: int
    routing: str  # "adaptive": traffic spread over all equal-cost paths; "ecmp": hashed
    oversubscription: float  # leaf: downlink bandwidth / uplink bandwidth
    link_latency_ns: float  # each switch-to-switch link
    efficiency: float
    spines: int = 0  # leaf_spine
    leafs_per_pod: int = 0  # fat_tree
    aggregations_per_pod: int = 0  # fat_tree
    cores: int = 0  # fat_tree
    core_oversubscription: float = 1.0  # fat_tree: aggregation down / up


@dataclass(frozen=True)
class Cluster:
    name: str
    description: str
    nodes: int
    node: NodeSpec
    fabric: FabricSpec

    @property
    def gpus_per_node(self) -> int:
        return self.node.gpus

    @property
    def num_gpus(self) -> int:
        return self.nodes * self.node.gpus

    @property
    def gpu_spec(self) -> GPUSpec:
        return lookup_gpu(self.node.gpu)

    def node_of(self, gpu: int) -> int:
        return gpu // self.node.gpus

    def local_index(self, gpu: int) -> int:
        return gpu % self.node.gpus

    def describe(self) -> str:
        return describe_cluster(self)


def preset_names() -> list[str]:
    return sorted(PRESETS)


def load_cluster(name_or_path: str, nodes: int | None = None) -> Cluster:
    """A preset by name ("dgx-h100", case-insensitive) or a TOML file by path; `nodes`
    overrides the node count in either."""
    key = name_or_path.strip().lower().replace("_", "-")
    if key in PRESETS:
        cluster = cluster_from_toml(PRESETS[key], source=f"preset {key}")
    elif os.path.isfile(name_or_path):
        with open(name_or_path, "rb") as fh:
            raw = fh.read()
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ClusterConfigError("", f"not UTF-8 text ({exc})", source=name_or_path) from None
        cluster = cluster_from_toml(text, source=name_or_path)
    else:
        raise ClusterConfigError(
            "cluster", f"{name_or_path!r} is neither a preset nor an existing file",
            allowed=tuple(preset_names()) + ("<path to a .toml file>",))
    if nodes is not None:
        if isinstance(nodes, bool) or not isinstance(nodes, int) or nodes < 1:
            raise ClusterConfigError("nodes", f"must be an integer >= 1, got {nodes!r}")
        cluster = replace(cluster, nodes=nodes)
    return cluster


def cluster_from_toml(text: str, source: str = "") -> Cluster:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ClusterConfigError("", f"not valid TOML: {exc}", source=source) from None
    return cluster_from_dict(data, source=source)


def cluster_from_dict(data: dict[str, Any], source: str = "") -> Cluster:
    top = _Table(data, "", source)
    name = top.get("name", str)
    description = top.get("description", str, default="")
    nodes = top.get("nodes", int, default=1, check=_at_least(1))
    node_t = top.table("node")
    fabric_t = top.table("fabric")
    top.finish()

    gpus = node_t.get("gpus", int, check=_at_least(1))
    gpu_name = node_t.get("gpu", str)
    try:
        gpu = lookup_gpu(gpu_name)
    except UnknownGPUError:
        raise ClusterConfigError("node.gpu", f"unknown GPU {gpu_name!r}",
                                 allowed=tuple(known_gpu_names()), source=source) from None
    intra = node_t.get("intra", str, allowed=INTRA_KINDS)
    nvls = node_t.get("nvls", bool, default=False)
    if nvls and intra != "nvswitch":
        raise ClusterConfigError("node.nvls", "NVLS needs intra = \"nvswitch\"", source=source)
    nvlink = None
    if intra == "nvswitch":
        nvlink = _link(node_t.table("nvlink"), gpu.nvlink_bandwidth / 1e9, 100.0, 0.8)
    elif "nvlink" in node_t.data:
        raise ClusterConfigError("node.nvlink", "only used with intra = \"nvswitch\"",
                                 source=source)
    pcie = _link(node_t.table("pcie", required=False), gpu.pcie_bandwidth / 1e9, 100.0, 0.85)
    nic_t = node_t.table("nic")
    nics = nic_t.get("count", int, check=_at_least(1))
    if nics > gpus:
        raise ClusterConfigError("node.nic.count", f"{nics} NICs for {gpus} GPUs; at most one "
                                 "NIC per GPU is modelled", source=source)
    nic = _link(nic_t, None, 500.0, 0.95)
    node_t.finish()

    topology = fabric_t.get("topology", str, allowed=FABRIC_TOPOLOGIES)
    fabric = FabricSpec(
        topology=topology,
        rail_optimized=fabric_t.get("rail_optimized", bool, default=nics == gpus),
        nodes_per_leaf=fabric_t.get("nodes_per_leaf", int, check=_at_least(1)),
        routing=fabric_t.get("routing", str, default="adaptive", allowed=ROUTINGS),
        oversubscription=fabric_t.get("oversubscription", float, default=1.0, check=_positive),
        link_latency_ns=fabric_t.get("link_latency", "latency", default=300.0),
        efficiency=fabric_t.get("efficiency", float, default=nic.efficiency, check=_fraction),
        spines=fabric_t.get("spines", int, check=_at_least(1),
                            only_with=("topology", topology, "leaf_spine")),
        leafs_per_pod=fabric_t.get("leafs_per_pod", int, check=_at_least(1),
                                   only_with=("topology", topology, "fat_tree")),
        aggregations_per_pod=fabric_t.get("aggregations_per_pod", int, check=_at_least(1),
                                          only_with=("topology", topology, "fat_tree")),
        cores=fabric_t.get("cores", int, check=_at_least(1),
                           only_with=("topology", topology, "fat_tree")),
        core_oversubscription=fabric_t.get("core_oversubscription", float, default=1.0,
                                           check=_positive,
                                           only_with=("topology", topology, "fat_tree")),
    )
    fabric_t.finish()
    if fabric.topology == "fat_tree" and fabric.cores % fabric.aggregations_per_pod:
        raise ClusterConfigError(
            "fabric.cores", f"{fabric.cores} cores cannot be split evenly over "
            f"{fabric.aggregations_per_pod} aggregation switches per pod (need a multiple)",
            source=source)
    node = NodeSpec(gpus=gpus, gpu=gpu.key, intra=intra, nvls=nvls, nvlink=nvlink, pcie=pcie,
                    nics=nics, nic=nic)
    return Cluster(name=name, description=description, nodes=nodes, node=node, fabric=fabric)


def describe_cluster(cluster: Cluster) -> str:
    n, f = cluster.node, cluster.fabric
    gpu = cluster.gpu_spec
    lines = [f"{cluster.name}: {cluster.nodes} node(s) x {n.gpus} {gpu.key} = "
             f"{cluster.num_gpus} GPUs"]
    if cluster.description:
        lines.append(f"  {cluster.description}")
    if n.nvlink is not None:
        lines.append(f"  intra-node: NVSwitch, NVLink {_gbs(n.nvlink.bandwidth)} per GPU per "
                     f"direction ({n.nvlink.efficiency:.0%} usable)"
                     + (", NVLS" if n.nvls else ""))
    else:
        lines.append(f"  intra-node: PCIe only, {_gbs(n.pcie.bandwidth)} per GPU")
    lines.append(f"  NICs: {n.nics} x {n.nic.bandwidth * 8:g} Gb/s per node "
                 f"({n.nic.efficiency:.0%} usable)")
    ports = f.nodes_per_leaf * (1 if f.rail_optimized else n.nics)
    leafs = _leaf_count(cluster)
    over = f"{f.oversubscription:g}:1"
    if f.topology == "leaf_spine":
        lines.append(f"  fabric: leaf/spine, {leafs} leaf(s) of {ports} ports"
                     f"{', rail-optimized' if f.rail_optimized else ''}, {f.spines} spines, "
                     f"{over} oversubscribed, {f.routing} routing")
    else:
        pods = math.ceil(leafs / f.leafs_per_pod)
        lines.append(f"  fabric: fat tree, {leafs} leaf(s) of {ports} ports"
                     f"{', rail-optimized' if f.rail_optimized else ''} in {pods} pod(s) x "
                     f"{f.aggregations_per_pod} aggregation switches, {f.cores} cores, "
                     f"{over} leaf / {f.core_oversubscription:g}:1 core oversubscription, "
                     f"{f.routing} routing")
    return "\n".join(lines)


def describe_presets() -> str:
    """One line per preset, for --help text and error messages."""
    out = []
    for name in preset_names():
        c = cluster_from_toml(PRESETS[name])
        out.append(f"{name:10s} {c.description}")
    return "\n".join(out)


def _leaf_count(cluster: Cluster) -> int:
    f = cluster.fabric
    units = math.ceil(cluster.nodes / f.nodes_per_leaf)
    return units * cluster.node.nics if f.rail_optimized else units


def _gbs(x: float) -> str:
    return f"{x:g} GB/s"


# ---- validation helpers -------------------------------------------------------------------

_REQUIRED = object()

# What a real link can be (GB/s, ns): wider than any hardware, narrow enough that the network's
# integer nanosecond arithmetic stays exact (a "1e-30 GB/s" link made a 2-rank all-reduce take
# 1e36 ns and crashed the simulator).
_PHYSICAL_RANGE = {
    "bandwidth": (0.1, 1e5, "100 MB/s to 100 TB/s"),
    "latency": (0.0, 1e9, "0 ns to 1 s"),
}


def _at_least(lo: int):
    def check(v):
        return None if v >= lo else f"must be >= {lo}"
    return check


def _positive(v):
    return None if v > 0 else "must be > 0"


def _fraction(v):
    # An efficiency is the usable fraction of a link; below 1% the link is not one (and a 1e-12
    # efficiency overflows the simulator's integer nanoseconds just as a 1e-30 GB/s link did).
    return None if 0.01 <= v <= 1 else "must be in [0.01, 1]"


class _Table:
    """A TOML table being read: typed getters that raise ClusterConfigError, and a final
    check that every key was understood (so a typo never silently falls back to a default)."""

    def __init__(self, data: Any, path: str, source: str):
        if not isinstance(data, dict):
            raise ClusterConfigError(path, "must be a table", source=source)
        self.data, self.path, self.source = data, path, source
        self.known: list[str] = []

    def _field(self, key: str) -> str:
        return f"{self.path}.{key}" if self.path else key

    def _error(self, key: str, msg: str, allowed: tuple[str, ...] = ()) -> ClusterConfigError:
        return ClusterConfigError(self._field(key), msg, allowed, self.source)

    def table(self, key: str, required: bool = True) -> _Table:
        self.known.append(key)
        if key not in self.data:
            if required:
                raise self._error(key, "missing table")
            return _Table({}, self._field(key), self.source)
        return _Table(self.data[key], self._field(key), self.source)

    def get(self, key, kind, default=_REQUIRED, allowed=None, check=None, only_with=None):
        self.known.append(key)
        if only_with is not None:
            other, value, needed = only_with
            if value != needed:
                if key in self.data:
                    raise self._error(key, f"only used with {other} = \"{needed}\"")
                return 0 if default is _REQUIRED else default
        if key not in self.data:
            if default is _REQUIRED:
                raise self._error(key, "missing", allowed or ())
            return default
        raw = self.data[key]
        if kind == "bandwidth":
            value = self._quantity(key, raw, _BANDWIDTH_UNITS, "a bandwidth like \"400 Gb/s\"")
        elif kind == "latency":
            value = self._quantity(key, raw, _LATENCY_UNITS, "a latency like \"0.5 us\"")
        elif kind is float:
            if isinstance(raw, bool) or not isinstance(raw, (int, float)):
                raise self._error(key, f"must be a number, got {raw!r}")
            value = float(raw)
        elif kind is int:
            if isinstance(raw, bool) or not isinstance(raw, int):
                raise self._error(key, f"must be an integer, got {raw!r}")
            value = raw
        elif kind is bool:
            if not isinstance(raw, bool):
                raise self._error(key, f"must be true or false, got {raw!r}")
            value = raw
        else:
            if not isinstance(raw, str):
                raise self._error(key, f"must be a string, got {raw!r}", allowed or ())
            value = raw
        if allowed is not None and value not in allowed:
            raise self._error(key, f"{value!r} is not allowed", allowed)
        if check is not None and (problem := check(value)):
            raise self._error(key, f"{problem}, got {raw!r}")
        return value

    def _quantity(self, key, raw, units, example):
        allowed = tuple(f"<number> {u}" for u in units)
        if not isinstance(raw, str):
            raise self._error(key, f"must be a string with a unit, {example}; got {raw!r}", allowed)
        m = _QUANTITY.match(raw)
        if not m or m.group(2) not in units:
            raise self._error(key, f"cannot read {raw!r} as {example}", allowed)
        value = float(m.group(1)) * units[m.group(2)]
        lo, hi, range_text = _PHYSICAL_RANGE["bandwidth" if units is _BANDWIDTH_UNITS else "latency"]
        if not lo <= value <= hi:
            raise self._error(key, f"{raw!r} is outside the physical range {range_text}")
        return value

    def finish(self) -> None:
        unknown = [k for k in self.data if k not in self.known]
        if unknown:
            raise self._error(unknown[0], "unknown key", tuple(self.known))


def _link(t: _Table, default_bw: float | None, default_latency_ns: float,
          default_eff: float) -> LinkSpec:
    bw = t.get("bandwidth", "bandwidth", default=_REQUIRED if default_bw is None else default_bw)
    spec = LinkSpec(
        bandwidth=bw,
        latency_ns=t.get("latency", "latency", default=default_latency_ns),
        efficiency=t.get("efficiency", float, default=default_eff, check=_fraction),
    )
    t.finish()
    return spec
