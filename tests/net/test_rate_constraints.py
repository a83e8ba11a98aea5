"""The rate solve holds one constraint for links that always carry the same load
(Topology.solve_scale): an adaptive leaf's (or pod's) equal-cost up- and down-links as one link of
their summed capacity, and a GPU's PCIe link and its own NIC as the tighter of the two. Every end
and every reported link load must be what the full set of links gives: bit-identical where the
group's size is a power of two, within float rounding otherwise."""

from __future__ import annotations

from unittest import mock

import numpy as np
import pytest
from hypothesis import given, settings

from phantora.net import cluster_from_toml, load_cluster
from phantora.net.topology import Topology

from .conftest import SMALL_TOML
from .test_rollback import arrived, scenarios

ADAPTIVE = SMALL_TOML.replace('routing = "ecmp"', 'routing = "adaptive"')
SLOW_PCIE = ADAPTIVE.replace('bandwidth = "64 GB/s"', 'bandwidth = "32 GB/s"')  # PCIe tighter than a 50 GB/s NIC
# two GPUs per NIC, each PCIe link (32 GB/s) tighter than the NIC (50 GB/s) yet carrying only its
# GPU's share: both are constraints (both nodes on one leaf, so no spine is tighter than either)
SHARED_NICS = SLOW_PCIE.replace("count = 4", "count = 2").replace("nodes_per_leaf = 1", "nodes_per_leaf = 2")
FAT_TREE = ADAPTIVE.replace('topology = "leaf_spine"', 'topology = "fat_tree"').replace(
    "spines = 2", "leafs_per_pod = 4\naggregations_per_pod = 2\ncores = 4\n"
                  "core_oversubscription = 1.0").replace("nodes = 2", "nodes = 8")
THREE_SPINES = ADAPTIVE.replace("spines = 2", "spines = 3")


def _full_constraints(self):
    return np.ones(self.n_links), self.capacity.copy()


def _run(cluster, items, order, queries):
    """Ends (after arrivals in `order`, with finish_time questions that make the network
    simulate ahead and roll back) and the link loads over the whole run."""
    net, handle = arrived(cluster, items, order, queries)
    ends = [net.finish_time(handle[i]) for i in range(len(items))]
    last = max(e for e in ends if e is not None) + 1
    return ends, net.link_utilization(0, last)


@pytest.mark.parametrize("toml", [ADAPTIVE, SLOW_PCIE, SHARED_NICS, FAT_TREE],
                         ids=["adaptive", "slow-pcie", "shared-nics", "fat-tree"])
@settings(max_examples=120, deadline=None)
@given(case=scenarios())
def test_fewer_constraints_give_the_ends_and_loads_of_every_link(toml, case):
    cluster = cluster_from_toml(toml, source="test")
    got = _run(cluster, *case)
    with mock.patch.object(Topology, "_rate_constraints", _full_constraints):
        want = _run(cluster, *case)
    assert got == want  # bit-identical: ends, and every real link's load segments


@settings(max_examples=60, deadline=None)
@given(case=scenarios())
def test_three_spines_as_one_link_agree_within_rounding(case):
    cluster = cluster_from_toml(THREE_SPINES, source="test")
    got, _ = _run(cluster, *case)
    with mock.patch.object(Topology, "_rate_constraints", _full_constraints):
        want, _ = _run(cluster, *case)
    for g, w in zip(got, want):
        assert g == pytest.approx(w, rel=1e-9, abs=2)


def test_dgx_h100_constraints_per_link_kind():
    topo = Topology(load_cluster("dgx-h100", nodes=64))  # two leaf units of 32 nodes, 16 spines
    kind = np.array([topo.link_kind(i) for i in range(topo.n_links)])
    scale, cap = topo.solve_scale, topo.solve_capacity
    # PCIe (64 GB/s) is looser than each GPU's own 400 Gb/s NIC: the NIC is the constraint
    for k in ("gpu->pcie", "pcie->gpu"):
        assert (scale[kind == k] == 0).all()
    for k in ("nic->leaf", "leaf->nic", "gpu->nvswitch", "nvswitch->gpu"):
        assert (scale[kind == k] == 1).all() and (cap[kind == k] == topo.capacity[kind == k]).all()
    S = topo.spines
    for k in ("leaf->spine", "spine->leaf"):
        links = np.flatnonzero(kind == k)
        kept = links[scale[links] > 0]
        assert len(kept) == topo.leafs  # one per leaf
        assert (scale[kept] == S).all()
        assert np.array_equal(cap[kept], topo.capacity[kept] * S)
