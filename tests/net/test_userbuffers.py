"""Transformer Engine's userbuffers transfers (transport "userbuffers"): copies and kernels over the
node's NVLink, timed by hand, not as NCCL's protocol."""

from __future__ import annotations

import math

import pytest

from phantora.net import CollectiveSpec, Network, load_cluster

# small_cluster (conftest): NVLink 400 GB/s at efficiency 1, 100 ns a link, so a route GPU -> switch
# -> GPU is 200 ns; NCCL's hardware latency of one Simple step over NVLink is 3.4 us.
STEP_NS = 3_400 + 200


def info(cluster, spec):
    net = Network(cluster)
    h = net.submit(spec, 0)
    net.finish_time(h)
    return net.collective_info(h)


@pytest.mark.parametrize("nbytes", [4096, 8 << 20])
def test_a_ring_exchange_step_is_one_copy_at_the_link_rate_after_one_steps_latency(small_cluster, nbytes):
    # a copy engine's copy: no NCCL base latency (8.4 us), no LL flags below 16 KiB
    i = info(small_cluster, CollectiveSpec("send_recv", nbytes, (0, 1), transport="userbuffers"))
    assert i.algorithm == "userbuffers" and i.latency_ns == STEP_NS
    assert i.end_ns == STEP_NS + math.ceil(nbytes / 400.0)
    nccl = info(small_cluster, CollectiveSpec("send_recv", nbytes, (0, 1)))
    assert nccl.end_ns > i.end_ns  # NCCL's p2p pays its kernel's base latency (LL: 6.6 us, Simple: 8.4 us)


@pytest.mark.parametrize("op", ["reduce_scatter", "all_gather"])
def test_userbuffers_reduce_scatter_and_all_gather_move_a_rings_bytes_after_one_steps_latency(small_cluster, op):
    # every GPU reads (reduce-scatter) or writes (all-gather) (n-1)/n of the buffer over its link,
    # all peers at once: one step's latency where NCCL's ring pays its base and n - 1 steps
    nbytes, n = 16 << 20, 4
    i = info(small_cluster, CollectiveSpec(op, nbytes, tuple(range(n)), transport="userbuffers"))
    assert i.latency_ns == STEP_NS
    assert i.end_ns == STEP_NS + math.ceil((n - 1) / n * nbytes / 400.0)
    nccl = info(small_cluster, CollectiveSpec(op, nbytes, tuple(range(n))))
    assert nccl.end_ns > i.end_ns


def test_a_dgx_h100_ring_exchange_step_and_chunk_by_hand():
    # dgx-h100: NVLink 450 GB/s at efficiency 0.824 = 370.8 GB/s, 0.1 us a link
    dgx = load_cluster("dgx-h100", nodes=1)
    step = info(dgx, CollectiveSpec("send_recv", 8 << 20, (0, 1), transport="userbuffers"))
    assert step.end_ns == 3_600 + math.ceil((8 << 20) / 370.8)  # 26.2 us (NCCL: 34.6 us)
    rs = info(dgx, CollectiveSpec("reduce_scatter", 16 << 20, tuple(range(8)), transport="userbuffers"))
    assert rs.end_ns == 3_600 + math.ceil(7 / 8 * (16 << 20) / 370.8)  # 43.2 us (NCCL: 71.7 us, LL128)


def test_userbuffers_and_nccl_transfers_of_one_size_are_planned_apart(small_cluster):
    net = Network(small_cluster)
    a = net.submit(CollectiveSpec("send_recv", 1 << 20, (0, 1)), 0)
    b = net.submit(CollectiveSpec("send_recv", 1 << 20, (2, 3), transport="userbuffers"), 0)
    assert net.collective_info(a).algorithm == "p2p" and net.collective_info(b).algorithm == "userbuffers"
    assert net.finish_time(a) - net.finish_time(b) == 8_400  # the NCCL kernel's base latency


def test_userbuffers_stay_inside_a_node_and_name_what_they_move(small_cluster):
    with pytest.raises(ValueError, match="userbuffers connect the GPUs of one node only"):
        Network(small_cluster).submit(CollectiveSpec("all_gather", 1 << 20, (0, 4), transport="userbuffers"), 0)
    with pytest.raises(ValueError, match="not all_reduce"):
        Network(small_cluster).submit(CollectiveSpec("all_reduce", 1 << 20, (0, 1), transport="userbuffers"), 0)
    with pytest.raises(ValueError, match="transport: 'ucx' is not allowed"):
        Network(small_cluster).submit(CollectiveSpec("all_reduce", 1 << 20, (0, 1), transport="ucx"), 0)
