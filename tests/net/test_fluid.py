"""The fluid simulation: flows share links over time, with per-flow latency."""

from __future__ import annotations

import math

import numpy as np
import pytest

from phantora.net import CollectiveSpec, Network, NetworkConfig, load_cluster
from phantora.net.fluid import DoneByTime, Flow, FlowSimulator


def flow(fid, start, nbytes, links, latency=0, coefs=None, cap=np.inf):
    links = np.array(links, dtype=np.int64)
    coefs = np.ones(len(links)) if coefs is None else np.array(coefs, dtype=float)
    return Flow(fid, (start, fid), fid, start, float(nbytes), latency, links, coefs, cap)


def run(capacity, flows):
    sim = FlowSimulator(np.array(capacity, dtype=float))
    for f in flows:
        sim.attach([f])
    for f in flows:
        sim.run_until_done(f)
    return [f.end_ns() for f in flows]


def test_single_flow_takes_latency_plus_size_over_bottleneck():
    # 1 MB over links of 50 and 20 bytes/ns, 1 us latency
    assert run([50.0, 20.0], [flow(0, 0, 1_000_000, [0, 1], latency=1000)]) == [1000 + 50_000]


def test_two_flows_share_a_link_then_the_survivor_speeds_up():
    # link of 10 B/ns: both at 5 until the 1000-byte flow is done at 200 ns; the other has
    # 2000 bytes left and finishes them alone at 10 B/ns.
    assert run([10.0], [flow(0, 0, 1000, [0]), flow(1, 0, 3000, [0])]) == [200, 400]


def test_a_flow_limited_elsewhere_leaves_the_rest_to_the_others():
    # B is held to 2 B/ns by link 1, so A gets 8 of link 0's 10.
    ends = run([10.0, 2.0], [flow(0, 0, 800, [0]), flow(1, 0, 200, [0, 1])])
    assert ends == [100, 100]


def test_a_late_flow_slows_an_earlier_one_from_its_start_on():
    # A alone for 100 ns (1000 bytes), then 5/5 with B until B's 500 bytes are done at 200;
    # A's last 500 bytes then go at 10 B/ns.
    ends = run([10.0], [flow(0, 0, 2000, [0]), flow(1, 100, 500, [0])])
    assert ends == [250, 200]


def test_drain_times_round_up_to_whole_ns():
    ends = run([3.0], [flow(0, 0, 10, [0])])
    assert ends == [math.ceil(10 / 3)]


def test_flows_on_disjoint_links_stay_in_separate_islands():
    sim = FlowSimulator(np.ones(4) * 10)
    a, b, c = flow(0, 0, 100, [0, 1]), flow(1, 0, 100, [2]), flow(2, 0, 100, [1, 3])
    for f in (a, b, c):
        sim.attach([f])
    assert a.island == c.island != b.island
    sim.run_until_done(b)  # runs only b's island
    assert a.state == c.state == 0  # still pending


def test_network_send_recv_matches_the_formula(small_cluster):
    net = Network(small_cluster)
    nbytes = 1 << 24
    h = net.submit(CollectiveSpec("send_recv", nbytes, (0, 4)), 5_000)
    # NCCL p2p latency (Simple, network): 8.4 us base + 14 us per step, plus the route's
    # hardware latency 1.8 us; bandwidth: the 12.5 GB/s spine link (2:1 oversubscribed).
    latency = 8_400 + 14_000 + 1_800
    assert net.finish_time(h) == 5_000 + latency + math.ceil(nbytes / 12.5)


def test_nvlink_is_contended_like_any_link(h100):
    ranks = tuple(range(8))
    config = NetworkConfig(algorithm="ring", protocol="Simple")
    alone = Network(h100, config)
    ha = alone.submit(CollectiveSpec("all_reduce", 1 << 28, ranks), 0)
    shared = Network(h100, config)
    hs = shared.submit(CollectiveSpec("all_reduce", 1 << 28, ranks), 0)
    shared.submit(CollectiveSpec("send_recv", 1 << 30, (3, 4)), 0)  # on GPU 3's NVLink
    assert shared.finish_time(hs) > alone.finish_time(ha) * 1.3


def test_traffic_on_other_links_does_not_interfere():
    cluster = load_cluster("dgx-h100", nodes=2)
    ranks = tuple(range(8))
    alone = Network(cluster)
    ha = alone.submit(CollectiveSpec("all_reduce", 1 << 28, ranks), 0)
    busy = Network(cluster)
    hb = busy.submit(CollectiveSpec("all_reduce", 1 << 28, ranks), 0)
    busy.submit(CollectiveSpec("all_reduce", 1 << 28, tuple(range(8, 16))), 0)  # other node
    assert busy.finish_time(hb) == alone.finish_time(ha)


def test_two_identical_all_reduces_share_nvlink_evenly(h100):
    config = NetworkConfig(algorithm="ring", protocol="Simple")
    spec = CollectiveSpec("all_reduce", 1 << 30, tuple(range(8)))
    one = Network(h100, config)
    t1 = one.finish_time(one.submit(spec, 0))
    two = Network(h100, config)
    a, b = two.submit(spec, 0), two.submit(spec, 0)
    latency = one.collective_info(0).latency_ns
    assert two.finish_time(a) == two.finish_time(b)
    assert two.finish_time(a) - latency == pytest.approx(2 * (t1 - latency), rel=1e-6)


def test_finished_flows_by_time_answer_the_flows_done_at_or_after_a_time():
    """What a rollback to t may rewind among finished flows (rollback.py): those done at or after
    t, kept per event batch; a flow revived or forgotten leaves, and an emptied time with it."""
    done = DoneByTime()
    done.add_batch(10, [1, 2])
    done.add_batch(30, [3])
    done.add_batch(20, [4, 5])
    done.add_batch(20, [6])  # a second batch at a time already held
    assert sorted(done.fids_from(0)) == [1, 2, 3, 4, 5, 6]
    assert sorted(done.fids_from(20)) == [3, 4, 5, 6]
    assert sorted(done.fids_from(21)) == [3]
    assert done.fids_from(31) == []
    done.discard(30, 3)
    done.discard(20, 4)
    done.discard(20, 99)  # not there: nothing happens
    done.discard(40, 1)
    assert sorted(done.fids_from(11)) == [5, 6]
    assert len(done) == 4
