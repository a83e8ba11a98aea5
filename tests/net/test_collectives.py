"""Collectives: closed forms, public reference figures, NCCL-like algorithm choice, every op."""

from __future__ import annotations

import math

import pytest

from phantora.net import CollectiveSpec, Network, NetworkConfig, load_cluster
from phantora.net.collectives import tree_parents

GiB = 1 << 30
RING = NetworkConfig(algorithm="ring", protocol="Simple")


def info(cluster, spec, config=None, start=0):
    net = Network(cluster, config)
    h = net.submit(spec, start)
    net.finish_time(h)
    return net.collective_info(h)


def all_reduce(n, nbytes, first=0):
    return CollectiveSpec("all_reduce", nbytes, tuple(range(first, first + n)))


# ---- closed forms -------------------------------------------------------------------------

@pytest.mark.parametrize("n", [2, 3, 4])
@pytest.mark.parametrize("nbytes", [4096, 1 << 20, 96 << 20])
def test_ring_all_reduce_matches_the_closed_form(small_cluster, n, nbytes):
    # One node, NVLink 400 GB/s (efficiency 1 in this test cluster): every ring edge moves
    # 2(n-1)/n * S at the link rate; latency is NCCL's ring/Simple model: 8.4 us base plus
    # 2(n-1) steps of 3.4 us (NVLink, Simple) + 0.2 us (GPU -> switch -> GPU).
    i = info(small_cluster, all_reduce(n, nbytes), RING)
    latency = 8_400 + 2 * (n - 1) * (3_400 + 200)
    assert i.latency_ns == latency
    assert i.end_ns == latency + math.ceil(2 * (n - 1) / n * nbytes / 400.0)


def test_ring_all_gather_and_reduce_scatter_move_n_minus_1_over_n(small_cluster):
    for op in ("all_gather", "reduce_scatter"):
        i = info(small_cluster, CollectiveSpec(op, 64 << 20, (0, 1, 2, 3)), RING)
        latency = 8_400 + 3 * (3_400 + 200)
        assert i.end_ns == latency + math.ceil(3 / 4 * (64 << 20) / 400.0)


def test_broadcast_is_a_pipelined_chain(small_cluster):
    i = info(small_cluster, CollectiveSpec("broadcast", 64 << 20, (0, 1, 2, 3), root=2), RING)
    latency = 8_400 + 3 * (3_400 + 200)  # the first chunk crosses n-1 hops
    assert i.end_ns == latency + math.ceil((64 << 20) / 400.0)


# ---- public reference figures (prior-art.md), large messages -----------------------------

def test_h100_ring_all_reduce_bus_bandwidth_is_about_370(h100):
    assert info(h100, all_reduce(8, GiB), RING).busbw == pytest.approx(370, rel=0.05)


def test_h100_nvls_all_reduce_bus_bandwidth_is_about_480(h100):
    i = info(h100, all_reduce(8, GiB))
    assert i.algorithm == "nvls"
    assert i.busbw == pytest.approx(480, rel=0.05)


@pytest.mark.parametrize("op", ["all_gather", "reduce_scatter"])
def test_h100_other_collectives_are_about_370(h100, op):
    i = info(h100, CollectiveSpec(op, GiB, tuple(range(8))))
    assert i.algorithm == "ring" and i.busbw == pytest.approx(370, rel=0.05)


def test_ndr_nic_delivers_46_to_48_gb_per_s():
    i = info(load_cluster("dgx-h100", nodes=2), CollectiveSpec("send_recv", GiB, (0, 8)))
    assert 46.0 <= i.algbw <= 48.0


def test_a100_two_nodes_with_8x200g_all_reduce_is_about_192():
    i = info(load_cluster("dgx-a100", nodes=2), all_reduce(16, GiB))
    assert i.algorithm == "ring"  # what NCCL runs there
    assert i.busbw == pytest.approx(192, rel=0.05)


def test_small_messages_take_microseconds_not_zero(h100):
    one_node = info(h100, all_reduce(8, 8))
    assert 5_000 < one_node.end_ns < 50_000
    two_nodes = info(load_cluster("dgx-h100", nodes=2), all_reduce(16, 8))
    assert one_node.end_ns < two_nodes.end_ns < 200_000
    p2p = info(h100, CollectiveSpec("send_recv", 8, (0, 1)))
    assert 2_000 < p2p.end_ns < 20_000


# ---- algorithm choice ---------------------------------------------------------------------

def test_choice_follows_size_on_one_h100_node(h100):
    assert (info(h100, all_reduce(8, 1024)).algorithm, info(h100, all_reduce(8, 1024)).protocol) \
        == ("ring", "LL")
    assert info(h100, all_reduce(8, GiB)).algorithm == "nvls"


def test_choice_without_nvls_is_ring_simple_for_large():
    i = info(load_cluster("dgx-a100"), all_reduce(8, GiB))
    assert (i.algorithm, i.protocol) == ("ring", "Simple")


def test_choice_across_nodes():
    c = load_cluster("dgx-h100", nodes=4)
    assert info(c, all_reduce(32, 64 << 10)).algorithm == "tree"  # latency: log(nodes) hops
    assert info(c, all_reduce(32, GiB)).algorithm == "nvls_tree"


def test_algorithm_override_like_nccl_algo(h100):
    assert info(h100, all_reduce(8, GiB), NetworkConfig(algorithm="ring")).algorithm == "ring"
    assert info(h100, all_reduce(8, GiB), NetworkConfig(algorithm="^nvls")).algorithm == "ring"
    per_op = NetworkConfig(algorithm="allreduce:tree")
    assert info(h100, all_reduce(8, GiB), per_op).algorithm == "tree"
    bcast = CollectiveSpec("broadcast", GiB, tuple(range(8)), root=0)
    assert info(h100, bcast, per_op).algorithm == "ring"


def test_protocol_override_like_nccl_proto(h100):
    i = info(h100, all_reduce(8, GiB), NetworkConfig(algorithm="ring", protocol="LL"))
    assert i.protocol == "LL"
    assert i.busbw < 150  # LL's ceiling: 141 GB/s on Hopper


def test_bad_override_names_allowed_values(h100):
    with pytest.raises(ValueError, match="allowed: tree, ring, nvls, nvls_tree"):
        Network(h100, NetworkConfig(algorithm="ring,butterfly"))
    with pytest.raises(ValueError, match="mode"):
        Network(h100, NetworkConfig(mode="eager"))


# ---- every op -----------------------------------------------------------------------------

@pytest.mark.parametrize("op", ["all_reduce", "all_gather", "reduce_scatter", "broadcast",
                                "reduce", "all_to_all"])
def test_every_collective_runs_at_a_plausible_speed(h100, op):
    root = 3 if op in ("broadcast", "reduce") else None
    i = info(h100, CollectiveSpec(op, GiB, tuple(range(8)), root=root, label=op), start=1000)
    assert i.start_ns == 1000 and i.end_ns > 1000 and i.label == op
    assert 300 < i.busbw < 520


def test_all_to_allv_uses_the_byte_matrix(h100):
    split = tuple(tuple(0 if i == j else (1 << 20) * (j + 1) for j in range(4)) for i in range(4))
    net = Network(h100, NetworkConfig(record_flows=True))
    h = net.submit(CollectiveSpec("all_to_all", 0, (0, 1, 2, 3), split_bytes=split), 0)
    records = net.flow_records(h)
    assert len(records) == 12
    assert {(r.src, r.dst, r.nbytes) for r in records} == {
        (i, j, (1 << 20) * (j + 1)) for i in range(4) for j in range(4) if i != j}


def test_barrier_is_a_tiny_all_reduce(h100):
    i = info(h100, CollectiveSpec("barrier", 0, tuple(range(8))))
    assert i.op == "barrier" and 5_000 < i.end_ns < 50_000


def test_one_rank_collective_is_instant(h100):
    assert info(h100, all_reduce(1, GiB), start=77).end_ns == 77


def test_bad_specs_are_refused(h100):
    net = Network(h100)
    with pytest.raises(ValueError, match="op"):
        net.submit(CollectiveSpec("allreduce", 8, (0, 1)), 0)
    with pytest.raises(ValueError, match="ranks"):
        net.submit(CollectiveSpec("all_reduce", 8, (0, 8)), 0)
    with pytest.raises(ValueError, match="root"):
        net.submit(CollectiveSpec("broadcast", 8, (0, 1)), 0)
    with pytest.raises(ValueError, match="send_recv"):
        net.submit(CollectiveSpec("send_recv", 8, (0, 1, 2)), 0)


def test_busbw_uses_the_nccl_tests_factors(h100):
    ar = info(h100, all_reduce(8, GiB), RING)
    assert ar.busbw == pytest.approx(ar.algbw * 2 * 7 / 8)
    ag = info(h100, CollectiveSpec("all_gather", GiB, tuple(range(8))))
    assert ag.busbw == pytest.approx(ag.algbw * 7 / 8)


def test_double_binary_trees_never_make_a_node_interior_twice():
    for n in range(1, 70):
        trees = [tree_parents(n, which) for which in (0, 1)]
        for parents in trees:
            assert sum(p < 0 for p in parents) == 1
            children = [parents.count(r) for r in range(n)]
            assert max(children) <= 2
        interior = [{p for p in parents if p >= 0} for parents in trees]
        assert not (interior[0] & interior[1])
