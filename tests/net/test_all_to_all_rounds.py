"""All-to-all as NCCL schedules it: rounds of its point-to-point schedule, one flow per round's
equal transfers, with the ends of one flow per transfer."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from phantora.net import CollectiveSpec, Network, NetworkConfig, load_cluster
from phantora.net.collectives import p2p_rounds

GiB = 1 << 30


def nccl_send_schedule(ranks: tuple[int, ...], gpus_per_node: int) -> dict[int, list[int]]:
    """NCCL's ncclP2pSchedule (src/init.cc), written out from its source: for each rank of the
    communicator, the rank it sends to in each round. Nodes in order of first use, local ranks
    in communicator order, groups of 8 local ranks across nodes (NCCL_P2P_SCHEDULE_GROUP_SIZE)."""
    nodes: dict[int, list[int]] = {}
    for r in ranks:
        nodes.setdefault(r // gpus_per_node, []).append(r)
    node_ranks = list(nodes.values())
    group_size = 8 if len(node_ranks) > 1 else max(len(v) for v in node_ranks)
    for v in node_ranks:
        if len(v) % group_size != 0 or len(v) < group_size:
            group_size = math.gcd(group_size, len(v))
    group_to_node, group_to_local = [], []
    for n, v in enumerate(node_ranks):
        for g in range(len(v) // group_size):
            group_to_node.append(n)
            group_to_local.append(g * group_size)
    n_groups = len(ranks) // group_size
    pow2 = 1 << (n_groups - 1).bit_length()
    out = {}
    for n, v in enumerate(node_ranks):
        before = sum(len(w) // group_size for w in node_ranks[:n])
        for local_rank, r in enumerate(v):
            local, group = local_rank % group_size, before + local_rank // group_size
            sends, group_round, group_delta = [], 0, 0
            while True:
                if group_delta < n_groups:
                    send_group = (group + group_delta) % n_groups
                    for delta in range(group_size):
                        send_local = group_to_local[send_group] + (local + delta) % group_size
                        sends.append(node_ranks[group_to_node[send_group]][send_local])
                group_round += 1
                group_delta = (group_delta + group_round) & (pow2 - 1)
                if group_round == pow2:
                    break
            out[r] = sends
    return out


layouts = st.one_of(
    st.lists(st.sampled_from([1, 2, 4, 8]), min_size=1, max_size=5),  # GPUs used on each node
    st.lists(st.integers(1, 8), min_size=1, max_size=4),  # uneven nodes: groups of the gcd
)


@settings(max_examples=60, deadline=None)
@given(layouts, st.randoms(use_true_random=False))
def test_rounds_are_nccls_rounds(per_node, rnd):
    cluster = load_cluster("dgx-h100", nodes=len(per_node))
    ranks = [n * 8 + k for n, count in enumerate(per_node) for k in sorted(rnd.sample(range(8), count))]
    if len(ranks) < 2:
        return
    ranks = tuple(ranks)
    index = {r: i for i, r in enumerate(ranks)}
    rounds = p2p_rounds(ranks, Network(cluster).topology)
    schedule = nccl_send_schedule(ranks, 8)
    n_rounds = len(schedule[ranks[0]])
    assert n_rounds == len(ranks)
    seen = set()
    for k in range(n_rounds):
        # NCCL's round k, over every rank, is one round here, and a different one for each k
        ours = {int(rounds[index[r], index[schedule[r][k]]]) for r in ranks}
        assert len(ours) == 1
        seen |= ours
        assert sorted(schedule[r][k] for r in ranks) == sorted(ranks)  # a permutation
    assert len(seen) == n_rounds


def ends_as_separate_transfers(cluster, spec, start=0):
    """The end of an all-to-all simulated as one flow per transfer: each transfer a send_recv
    of its own (the model before rounds)."""
    n = len(spec.ranks)
    net = Network(cluster)
    sizes = spec.split_bytes or [[0 if i == j else spec.nbytes // n for j in range(n)] for i in range(n)]
    handles = net.submit_many([(CollectiveSpec("send_recv", sizes[i][j], (spec.ranks[i], spec.ranks[j])), start)
                               for i in range(n) for j in range(n) if i != j and sizes[i][j]])
    return max(net.finish_time(h) for h in handles)


def end_of(cluster, spec, start=0):
    net = Network(cluster)
    h = net.submit(spec, start)
    return net.finish_time(h), net


@pytest.mark.parametrize("nodes,ranks", [
    (1, tuple(range(8))), (2, tuple(range(16))), (8, tuple(range(64))),
    (2, (0, 1, 2, 3, 8, 9, 10, 11)), (8, tuple(range(0, 64, 8))), (2, (0, 1, 2, 3, 4, 5, 8, 9)),
])
@pytest.mark.parametrize("nbytes", [64 << 10, 16 << 20, GiB])
def test_rounds_end_when_separate_transfers_end(nodes, ranks, nbytes):
    cluster = load_cluster("dgx-h100", nodes=nodes)
    spec = CollectiveSpec("all_to_all", nbytes, ranks)
    end, net = end_of(cluster, spec)
    assert end == ends_as_separate_transfers(cluster, spec)
    n = len(ranks)
    assert net.transfers_submitted == n * (n - 1)
    assert net.flows_submitted == n - 1  # one flow per round (every transfer the same size)


def test_a_round_under_uneven_contention_ends_with_its_transfers():
    """Cross traffic on a few NICs only (two large sends between nodes): the round's transfers
    through them are slowed and the others are not, and the all-to-all ends when one flow per
    transfer would."""
    cluster = load_cluster("dgx-h100", nodes=8)
    per = 4096 * 8 * 7168 * 2
    a2a = CollectiveSpec("all_to_all", per, tuple(range(64)))
    cross = [(CollectiveSpec("send_recv", GiB, (5, 13)), 0), (CollectiveSpec("send_recv", GiB, (21, 40)), 50_000)]
    net = Network(cluster)
    together = net.finish_time(net.submit_many([(a2a, 0)] + cross)[0])
    alone, _ = end_of(cluster, a2a)
    assert together > alone  # the sends are felt
    n = 64
    ref = Network(cluster)
    handles = ref.submit_many([(CollectiveSpec("send_recv", per // n, (i, j)), 0)
                               for i in range(n) for j in range(n) if i != j] + cross)
    assert together == max(ref.finish_time(x) for x in handles[:-2])


def test_unequal_transfers_keep_a_flow_each():
    split = tuple(tuple(0 if i == j else (1 << 20) * (1 + (i * 4 + j) % 5) for j in range(4)) for i in range(4))
    cluster = load_cluster("dgx-h100")
    spec = CollectiveSpec("all_to_all", 0, (0, 1, 2, 3), split_bytes=split)
    end, net = end_of(cluster, spec)
    sizes_per_round = {}
    rounds = p2p_rounds(spec.ranks, net.topology)
    for i in range(4):
        for j in range(4):
            if i != j:
                sizes_per_round.setdefault(int(rounds[i, j]), set()).add(split[i][j])
    assert net.flows_submitted == sum(len(v) for v in sizes_per_round.values())
    assert end == ends_as_separate_transfers(cluster, spec)


def test_flow_records_still_name_every_transfer(h100):
    net = Network(h100, NetworkConfig(record_flows=True))
    h = net.submit(CollectiveSpec("all_to_all", 8 << 20, tuple(range(8))), 0)
    records = net.flow_records(h)
    assert {(r.src, r.dst, r.nbytes) for r in records} == {(i, j, 1 << 20) for i in range(8) for j in range(8) if i != j}
    assert len({r.end_ns for r in records}) == 1
