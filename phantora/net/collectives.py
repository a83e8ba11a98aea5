"""NCCL collectives decomposed into flow groups, one decomposition per NCCL algorithm.

Granularity, and why it is faithful
-----------------------------------
NCCL runs a ring all-reduce of S bytes over n ranks as 2(n-1) steps on each of C channels;
every step moves one chunk per ring edge, and chunks are pipelined (a rank forwards chunk k
while receiving chunk k+1, with NCCL_STEPS buffer slots per connection). Simulating chunks
would cost O(n * steps * chunks) flows. We do not need them: in steady state every edge of a
pipelined ring carries data continuously, and because a rank can only forward what it has
received, the whole ring advances at the rate of its slowest edge. That is exactly one rate
variable shared by all n edges. So a channel of a ring is ONE flow group: n transfers (its
edges), each carrying the bytes an edge carries over the whole operation (2(n-1)/n * S / C
for all-reduce), all progressing at one max-min rate (the group loads every link on its
edges; a link crossed by k of its edges is loaded k times). Contention on any edge slows the
whole ring, as it does on real hardware; spare capacity on its other links stays available to
other traffic. What chunking adds on top - the per-step latency of filling the pipeline, and
of synchronising flags - is time, not bandwidth, and NCCL's own model charges it as latency
per step; tuning.py adds the same latency analytically. The approximation error is that of
NCCL's model: the fluid limit ignores the finite buffer's slack (a few chunks) under
transient contention.

The same argument holds for the pipelined trees (reduce up and broadcast down stream through
the tree together: one rate per tree) and for NVLS (each GPU streams to and from the
switch). A send/recv is one transfer. An all-to-all runs as NCCL's point-to-point schedule
does: in rounds, each a permutation of the ranks (every rank sends to the one so many places
ahead), taken in the same order by every rank; a round's transfers of one size are one flow.
With equal sizes max-min gives them one rate anyway, so the ends are those of one flow per
transfer (tests/net/test_all_to_all_rounds.py), at n-1 flows instead of n(n-1).

Channels: NCCL's channels differ in where the ring enters and leaves each node, so their
inter-node hops use different NICs. Channels that take the same links are interchangeable,
so we model one flow group per distinct pattern: one for a single node, one per local rank
(= per NIC rail) across nodes. On multi-node rings the hop out of a node uses PXN: the last
GPU of the node hands over NVLink to the GPU on the next node's entry rail.

Hierarchical algorithms: "tree" is NCCL's: a chain through the GPUs of each node, and a
double binary tree between nodes (two trees, each with half the data, so that every node is a
leaf in at least one and no NIC carries more than its share). "nvls_tree" replaces the chain
by NVSwitch multicast/reduction (NVLS) inside each node.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from phantora.net.records import CollectiveSpec
from phantora.net.topology import SWITCH, Topology
from phantora.net.tuning import (P2P, USERBUFFERS, GroupShape, NcclConstants, p2p_latency_us,
                                 userbuffers_latency_us)


@dataclass
class FlowGroup:
    """One max-min rate variable: transfers src[i] -> dst[i] that progress together.

    Transfer i delivers payload[i] * nbytes and puts weight[i] * nbytes on each link of its
    route (protocol overhead included); the group progresses at one rate."""

    src: np.ndarray
    dst: np.ndarray
    weight: np.ndarray  # link bytes per group byte: payload x protocol overhead
    payload: np.ndarray  # payload bytes per group byte (what the transfer delivers)
    fraction: float  # nbytes = fraction * spec.nbytes (or fixed_bytes when set)
    cap: float  # rate ceiling in bytes/ns (protocol limits); inf if none
    salt: int  # ECMP hash input, distinct per channel pattern
    latency_ns: int
    fixed_bytes: int | None = None


@dataclass
class CollectivePlan:
    algorithm: str
    protocol: str
    groups: list[FlowGroup]

    @property
    def transfers(self) -> int:
        return sum(len(g.src) for g in self.groups)


@dataclass(frozen=True)
class Communicator:
    """What the cost model needs about a group of ranks, computed once per group."""

    shape: GroupShape
    min_ppn: int
    intra_hop_ns: float  # hardware latency of a hop inside a node
    inter_hop_ns: float  # of the slowest hop between consecutive nodes of the ring


def communicator(ranks: tuple[int, ...], topo: Topology) -> Communicator:
    nodes = _nodes_in_order(ranks, topo)
    node = topo.cluster.node
    ppn = len(ranks) // len(nodes)
    # NICs a node's ranks can use (each GPU its nearest), the fewest over the nodes
    nics = min(len({int(topo.nic_of_local[g % topo.gpus_per_node]) for g in v})
               for v in nodes.values())
    inter_bw = nics * node.nic.capacity
    intra_bw = node.nvlink.capacity if topo.nvswitch else node.pcie.capacity
    if ppn == 1:
        intra_bw = inter_bw
    shape = GroupShape(n_ranks=len(ranks), n_nodes=len(nodes), ppn=ppn,
                       intra_hw="nvlink" if topo.nvswitch else "pcie",
                       intra_bw=intra_bw, inter_bw=inter_bw)
    pair = next((v[:2] for v in nodes.values() if len(v) > 1), None)
    intra_ns = float(topo.route_latency_many(pair[0], pair[1])[0]) if pair else 0.0
    inter_ns = 0.0
    if len(nodes) > 1:
        groups = list(nodes.values())
        src = [g[-1] for g in groups]
        dst = [g[0] for g in groups[1:] + groups[:1]]
        inter_ns = float(topo.route_latency_many(src, dst).max())
    return Communicator(shape, min(len(v) for v in nodes.values()), intra_ns, inter_ns)


def _nodes_in_order(ranks, topo: Topology) -> dict[int, list[int]]:
    """Node -> the group's GPUs on it sorted by local index; nodes in order of first use."""
    nodes: dict[int, list[int]] = {}
    for g in ranks:
        nodes.setdefault(g // topo.gpus_per_node, []).append(g)
    for v in nodes.values():
        v.sort()
    return nodes


def ring_orders(ranks: tuple[int, ...], topo: Topology) -> list[np.ndarray]:
    """Ring orders, one per channel pattern: nodes in turn, each node's GPUs rotated so that
    pattern a enters every node at its a-th GPU (and so on that GPU's NIC rail)."""
    nodes = _nodes_in_order(ranks, topo)
    patterns = 1 if len(nodes) == 1 else max(len(v) for v in nodes.values())
    orders = []
    for a in range(patterns):
        order = []
        for gpus in nodes.values():
            r = a % len(gpus)
            order.extend(gpus[r:] + gpus[:r])
        orders.append(np.array(order, dtype=np.int64))
    return orders


def tree_parents(n: int, which: int) -> list[int]:
    """Parent of each of n tree members in one tree of NCCL's double binary tree (-1: root).

    Tree 0 is the in-order binary tree on positions 1..n (a position's level is its lowest
    set bit; positions above n are skipped by climbing to the next ancestor). Tree 1 is tree 0
    mirrored (n even) or shifted by one (n odd), which makes every member a leaf in at least
    one of the two, so no member forwards more than its share in both."""
    def position(r: int) -> int:
        if which == 0:
            return r + 1
        return n - r if n % 2 == 0 else (r + 1) % n + 1

    member_at = {position(r): r for r in range(n)}
    parents = []
    for r in range(n):
        p = position(r)
        while True:  # climb the perfect in-order tree until an ancestor that exists
            low = p & -p
            p = p - low if p & (low << 1) else p + low
            if p <= n or low > n:
                break
        parents.append(member_at[p] if p <= n else -1)
    return parents


def ring_plan(spec: CollectiveSpec, protocol: str, topo: Topology, const: NcclConstants,
              ll_cap: float) -> CollectivePlan:
    orders = ring_orders(spec.ranks, topo)
    n, patterns = len(spec.ranks), len(orders)
    factor = const.link_factor("ring", protocol)
    groups = []
    for a, order in enumerate(orders):
        if spec.op in ("broadcast", "reduce"):
            at = int(np.nonzero(order == spec.root)[0][0])
            if spec.op == "broadcast":  # a chain starting at the root
                chain = np.roll(order, -at)
            else:  # a chain ending at the root
                chain = np.roll(order, -(at + 1))
            src, dst = chain[:-1], chain[1:]
            fraction = 1.0 / patterns
        else:
            src, dst = order, np.roll(order, -1)
            per_edge = 2 * (n - 1) / n if spec.op == "all_reduce" else (n - 1) / n
            fraction = per_edge / patterns
        groups.append(FlowGroup(src=src, dst=dst, weight=np.full(len(src), factor),
                                payload=np.ones(len(src)),
                                fraction=fraction, cap=_cap(protocol, ll_cap, patterns),
                                salt=a, latency_ns=0))
    return CollectivePlan("ring", protocol, groups)


def tree_plan(spec: CollectiveSpec, protocol: str, topo: Topology, const: NcclConstants,
              ll_cap: float) -> CollectivePlan:
    """NCCL's tree all-reduce: a chain inside each node (reduce towards its head GPU,
    broadcast back), a double binary tree between the heads; both directions stream at once."""
    nodes = list(_nodes_in_order(spec.ranks, topo).values())
    patterns = 1 if len(nodes) == 1 else max(len(v) for v in nodes)
    factor = const.link_factor("tree", protocol)
    groups = []
    for a in range(patterns):
        heads, intra_src, intra_dst = [], [], []
        for gpus in nodes:
            r = a % len(gpus)
            chain = gpus[r:] + gpus[:r]
            heads.append(chain[0])
            for x, y in zip(chain[:-1], chain[1:]):
                intra_src += [y, x]
                intra_dst += [x, y]
        for which in (0, 1):
            src, dst = list(intra_src), list(intra_dst)
            for child, parent in enumerate(tree_parents(len(nodes), which)):
                if parent >= 0:
                    src += [heads[child], heads[parent]]
                    dst += [heads[parent], heads[child]]
            groups.append(FlowGroup(src=np.array(src, dtype=np.int64),
                                    dst=np.array(dst, dtype=np.int64),
                                    weight=np.full(len(src), factor),
                                    payload=np.ones(len(src)),
                                    fraction=1.0 / (2 * patterns),
                                    # NCCL's tree bus bandwidth is twice its algorithm bandwidth
                                    cap=_cap(protocol, ll_cap / 2, 2 * patterns),
                                    salt=2 * a + which, latency_ns=0))
    return CollectivePlan("tree", protocol, groups)


def nvls_plan(spec: CollectiveSpec, topo: Topology, const: NcclConstants) -> CollectivePlan:
    """NVLS inside one node. All-reduce: each GPU's slice is reduced in the switch
    (multimem.ld_reduce pulls every GPU's copy: S up per GPU) and the result multicast back
    (S/n up from its owner, S down to every GPU): (n+1)/n * S each way per GPU.
    All-gather: S/n up, S down. Reduce-scatter: S up, S/n down."""
    n = len(spec.ranks)
    gpus = np.array(spec.ranks, dtype=np.int64)
    up, down = {"all_reduce": ((n + 1) / n, (n + 1) / n), "all_gather": (1 / n, 1.0),
                "reduce_scatter": (1.0, 1 / n)}[spec.op]
    factor = const.link_factor("nvls", "Simple")
    switch = np.full(n, SWITCH, dtype=np.int64)
    payload = np.concatenate([np.full(n, up), np.full(n, down)])
    group = FlowGroup(src=np.concatenate([gpus, switch]), dst=np.concatenate([switch, gpus]),
                      weight=payload * factor, payload=payload,
                      fraction=1.0, cap=np.inf, salt=0, latency_ns=0)
    return CollectivePlan("nvls", "Simple", [group])


def nvls_tree_plan(spec: CollectiveSpec, topo: Topology, const: NcclConstants) -> CollectivePlan:
    """NVLS inside each node (reduce a slice into its head GPU through the switch, multicast
    the result back), double binary trees between the heads, all pipelined together."""
    nodes = list(_nodes_in_order(spec.ranks, topo).values())
    patterns = max(len(v) for v in nodes)
    factor = const.link_factor("nvls_tree", "Simple")
    groups = []
    for a in range(patterns):
        heads, src, dst, payload = [], [], [], []
        for gpus in nodes:
            head = gpus[a % len(gpus)]
            heads.append(head)
            for g in gpus:
                times = 2.0 if g == head else 1.0  # the head also receives and re-sends
                src += [g, SWITCH]
                dst += [SWITCH, g]
                payload += [times, times]
        intra = len(src)
        for which in (0, 1):
            s, d, p = list(src), list(dst), list(payload)
            for child, parent in enumerate(tree_parents(len(nodes), which)):
                if parent >= 0:
                    s += [heads[child], heads[parent]]
                    d += [heads[parent], heads[child]]
                    p += [1.0, 1.0]
            p = np.array(p)
            w = p.copy()
            w[:intra] *= factor
            groups.append(FlowGroup(src=np.array(s, dtype=np.int64),
                                    dst=np.array(d, dtype=np.int64),
                                    weight=w, payload=p, fraction=1.0 / (2 * patterns),
                                    cap=np.inf, salt=2 * a + which, latency_ns=0))
    return CollectivePlan("nvls_tree", "Simple", groups)


def p2p_plan(spec: CollectiveSpec, topo: Topology, const: NcclConstants) -> CollectivePlan:
    """send_recv: one transfer. all_to_all(v): one flow for the transfers of a round of NCCL's
    point-to-point schedule (p2p_rounds) that carry the same bytes, in lockstep. Under max-min
    sharing those get one rate on symmetric links anyway (the ends are those of one flow per
    transfer, to the ns, on the cases of tests/net/test_all_to_all_rounds.py, cross traffic on a
    few links included); transfers of different sizes stay flows of their own, as before: coupled,
    an uneven all-to-all ended 9-17% later than with one flow per transfer, a change of model no
    measurement here supports."""
    ranks = np.array(spec.ranks, dtype=np.int64)
    n = len(ranks)
    if spec.op == "send_recv":
        pairs = [(0, 1, spec.nbytes)]
    elif spec.split_bytes is not None:
        pairs = [(i, j, spec.split_bytes[i][j]) for i in range(n) for j in range(n)
                 if i != j and spec.split_bytes[i][j] > 0]
    else:
        each = spec.nbytes // n
        pairs = [(i, j, each) for i in range(n) for j in range(n) if i != j] if each else []
    if not pairs:
        return CollectivePlan(P2P, "Simple", [])
    src = ranks[[p[0] for p in pairs]]
    dst = ranks[[p[1] for p in pairs]]
    path_ns = topo.route_latency_many(src, dst)
    intra = (src // topo.gpus_per_node) == (dst // topo.gpus_per_node)
    hw = "nvlink" if topo.nvswitch else "pcie"
    protocol_of, latency_of, factor_of = [], [], []
    for k, (_, _, nbytes) in enumerate(pairs):
        protocol, lat_us = p2p_latency_us(nbytes, bool(intra[k]), hw, const, path_ns[k] / 1e3)
        protocol_of.append(protocol)
        latency_of.append(int(round(lat_us * 1e3)))
        factor_of.append(const.link_factor(P2P, protocol))
    if spec.op == "send_recv":
        members = [[0]]
    else:
        rounds = p2p_rounds(spec.ranks, topo)
        by_round: dict[tuple[int, int], list[int]] = {}
        for k, (i, j, b) in enumerate(pairs):
            by_round.setdefault((int(rounds[i, j]), b), []).append(k)
        members = [by_round[r] for r in sorted(by_round)]
    groups = []
    for ks in members:
        idx = np.array(ks, dtype=np.int64)
        groups.append(FlowGroup(src=src[idx], dst=dst[idx],
                                weight=np.array([factor_of[k] for k in ks]), payload=np.ones(len(ks)),
                                fraction=0.0, cap=np.inf, salt=0,
                                latency_ns=max(latency_of[k] for k in ks), fixed_bytes=int(pairs[ks[0]][2])))
    protocols = set(protocol_of)
    protocol = protocols.pop() if len(protocols) == 1 else "mixed"
    return CollectivePlan(P2P, protocol, groups)


def userbuffers_plan(spec: CollectiveSpec, topo: Topology, const: NcclConstants) -> CollectivePlan:
    """A Transformer Engine userbuffers transfer (spec.transport "userbuffers") inside one node:
    the ring exchange's copy to the next rank (send_recv), or the kernels that reduce-scatter or
    all-gather by reading and writing every peer's buffer directly. On an NVSwitch those move
    (n-1)/n of the buffer out of and into each GPU, as a ring does, so the ring's flows carry them
    at the link's full rate (no NCCL protocol's flags); the latency is one step's
    (tuning.userbuffers_latency_us), where NCCL pays its kernel's base latency and, in a ring,
    n - 1 handshakes. Userbuffers never leave the node (TE asserts INTRANODE)."""
    if len({r // topo.gpus_per_node for r in spec.ranks}) > 1:
        raise ValueError(f"userbuffers transfer {spec.op} over GPUs {list(spec.ranks)}: userbuffers "
                         "connect the GPUs of one node only")
    hw = "nvlink" if topo.nvswitch else "pcie"
    path_ns = float(topo.route_latency_many(np.array(spec.ranks[:1]), np.array(spec.ranks[1:2]))[0])
    latency_ns = int(round(userbuffers_latency_us(hw, const, path_ns / 1e3) * 1e3))
    if spec.op == "send_recv":  # a copy engine's copy: no LL flags, whatever the size
        ends = np.array(spec.ranks, dtype=np.int64)
        groups = [FlowGroup(src=ends[:1], dst=ends[1:], weight=np.ones(1), payload=np.ones(1), fraction=0.0,
                            cap=np.inf, salt=0, latency_ns=latency_ns, fixed_bytes=spec.nbytes)]
    elif spec.op in ("all_gather", "reduce_scatter"):
        groups = ring_plan(spec, "Simple", topo, const, np.inf).groups
        for g in groups:
            g.latency_ns = latency_ns
    else:
        raise ValueError(f"userbuffers move all_gather, reduce_scatter and send_recv, not {spec.op}")
    return CollectivePlan(USERBUFFERS, "Simple", groups)


def p2p_rounds(ranks: tuple[int, ...], topo: Topology) -> np.ndarray:
    """rounds[i, j]: the round of NCCL's point-to-point schedule (init.cc, ncclP2pSchedule) in
    which member i sends to member j. NCCL cuts each node's ranks into groups of `size` local
    ranks (8 across nodes, NCCL_P2P_SCHEDULE_GROUP_SIZE; the whole node inside one); in round
    (group delta, local delta) every rank sends to the rank that many groups and local places
    ahead, and receives from the one as far behind. So each round is a permutation of the
    members, and every rank works through the rounds in the same order: an all-to-all advances
    round by round across all its ranks, not as n(n-1) independent transfers (which is also
    n(n-1) flows to simulate where this is n-1)."""
    nodes: dict[int, list[int]] = {}  # in the order of first use; local ranks in comm order
    for r in ranks:
        nodes.setdefault(r // topo.gpus_per_node, []).append(r)
    counts = [len(v) for v in nodes.values()]
    size = 8 if len(nodes) > 1 else max(counts)
    for c in counts:
        if c % size or c < size:
            size = math.gcd(size, c)
    group_of, local_of, g0 = {}, {}, 0
    for v in nodes.values():
        for k, r in enumerate(v):
            group_of[r], local_of[r] = g0 + k // size, k % size
        g0 += len(v) // size
    groups = np.array([group_of[r] for r in ranks], dtype=np.int64)
    local = np.array([local_of[r] for r in ranks], dtype=np.int64)
    delta_g = (groups[None, :] - groups[:, None]) % g0
    delta_l = (local[None, :] - local[:, None]) % size
    return delta_g * size + delta_l


def _cap(protocol: str, ll_cap: float, groups: int) -> float:
    """LL's bandwidth ceiling, shared evenly by the groups that make up the collective."""
    return ll_cap / groups if protocol == "LL" else np.inf


def bus_factor(op: str, n: int) -> float:
    """nccl-tests' busBw / algBw ratio."""
    if n <= 1:
        return 1.0
    if op in ("all_reduce", "barrier"):
        return 2 * (n - 1) / n
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    return 1.0
