"""Links and routes: NVLink, PCIe, NICs, leaf/spine, fat tree, PXN, ECMP vs adaptive."""

from __future__ import annotations

import numpy as np
import pytest

from phantora.net import cluster_from_toml, load_cluster
from phantora.net.topology import SWITCH, Topology

from .conftest import SMALL_TOML


def kinds(topo, src, dst, salt=0, pxn=True):
    member, link, share = topo.route_many([src], [dst], salt, pxn)
    return sorted(topo.link_kind(int(x)) for x in link), share


def test_intra_node_nvswitch_route_is_up_then_down(small_cluster):
    topo = Topology(small_cluster)
    ks, share = kinds(topo, 0, 3)
    assert ks == ["gpu->nvswitch", "nvswitch->gpu"]
    assert np.all(share == 1)


def test_intra_node_pcie_route(small_cluster):
    topo = Topology(load_cluster("ethernet"))
    assert kinds(topo, 0, 5)[0] == ["gpu->pcie", "pcie->gpu"]


def test_inter_node_same_rail_crosses_one_spine_with_ecmp(small_cluster):
    topo = Topology(small_cluster)  # one node per leaf, 2 spines, ECMP
    ks, share = kinds(topo, 0, 4)
    assert ks == sorted(["gpu->pcie", "nic->leaf", "leaf->spine", "spine->leaf", "leaf->nic",
                         "pcie->gpu"])
    assert np.all(share == 1)


def test_cross_rail_uses_pxn_over_nvlink(small_cluster):
    topo = Topology(small_cluster)
    with_pxn, _ = kinds(topo, 0, 5)
    without, _ = kinds(topo, 0, 5, pxn=False)
    assert with_pxn.count("gpu->nvswitch") == 1 and with_pxn.count("nvswitch->gpu") == 1
    assert "gpu->nvswitch" not in without


def test_pxn_keeps_traffic_on_the_destination_rail():
    topo = Topology(load_cluster("dgx-h100", nodes=2))  # both nodes on the same rail leaves
    ks, _ = kinds(topo, 0, 13)  # GPU 0 of node 0 -> GPU 5 of node 1
    assert "leaf->spine" not in ks  # rail 5 leaf to rail 5 leaf: one switch, no spine
    ks, _ = kinds(topo, 0, 13, pxn=False)
    assert "leaf->spine" in ks


def test_adaptive_routing_spreads_evenly_over_spines():
    c = load_cluster("dgx-h100", nodes=64)  # 32 nodes per leaf: node 0 and 63 on different leaves
    topo = Topology(c)
    member, link, share = topo.route_many([0], [63 * 8])
    spine_up = [s for x, s in zip(link, share) if topo.link_kind(int(x)) == "leaf->spine"]
    assert len(spine_up) == c.fabric.spines
    assert sum(spine_up) == pytest.approx(1.0)


def test_ecmp_hash_is_deterministic_and_uses_several_spines(small_cluster):
    topo = Topology(small_cluster)
    chosen = set()
    for salt in range(16):
        a = topo.route_many([0], [4], salt)[1]
        b = topo.route_many([0], [4], salt)[1]
        assert np.array_equal(a, b)
        chosen.add(int([x for x in a if topo.link_kind(int(x)) == "leaf->spine"][0]))
    assert len(chosen) == 2


def test_nvls_halves_route_to_and_from_the_switch(small_cluster):
    topo = Topology(small_cluster)
    assert kinds(topo, 2, SWITCH)[0] == ["gpu->nvswitch"]
    assert kinds(topo, SWITCH, 2)[0] == ["nvswitch->gpu"]


def test_oversubscription_sets_uplink_capacity(small_cluster):
    topo = Topology(small_cluster)  # 1 port of 50 GB/s per leaf, 2:1, 2 spines
    up = [i for i in range(topo.n_links) if topo.link_kind(i) == "leaf->spine"]
    assert topo.line_rate[up] == pytest.approx(50.0 / 2 / 2)


FAT_TREE = SMALL_TOML.replace('topology = "leaf_spine"', 'topology = "fat_tree"').replace(
    "spines = 2", "leafs_per_pod = 4\naggregations_per_pod = 2\ncores = 4\n"
                  "core_oversubscription = 1.0").replace("nodes = 2", "nodes = 8")


def test_fat_tree_routes_stay_in_pod_when_they_can():
    topo = Topology(cluster_from_toml(FAT_TREE))
    # rail-optimized, one node per leaf: 4 rails x 8 units = 32 leaves, 4 leaves per pod.
    # Node 0 rail 0 is leaf 0; node 1 rail 0 is leaf 4 (another pod): goes through a core.
    ks, _ = kinds(topo, 0, 4)
    assert ks.count("agg->core") == 1 and ks.count("core->agg") == 1
    # Rail 0 of node 0 and rail 1 of node 0 sit in the same pod (leaves 0 and 1).
    ks, _ = kinds(topo, 0, 1 + 4, pxn=False)  # node 0 GPU 0 -> node 1 GPU 1, no PXN
    assert "leaf->agg" in ks


def test_route_latency_sums_link_latencies(small_cluster):
    topo = Topology(small_cluster)
    assert topo.route_latency_many([0], [1])[0] == pytest.approx(200.0)  # 2 NVLink hops
    # pcie 100 + nic 500 + up 300 + down 300 + nic 500 + pcie 100
    assert topo.route_latency_many([0], [4])[0] == pytest.approx(1800.0)


def test_link_names_say_what_and_where(small_cluster):
    topo = Topology(small_cluster)
    names = {topo.link_name(i) for i in range(topo.n_links)}
    assert len(names) == topo.n_links
    assert "gpu->nvswitch [node1 gpu2]" in names
