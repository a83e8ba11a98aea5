"""The links of a cluster and the routes transfers take over them.

Every link is directed and has an id; ids are laid out in contiguous blocks per kind, so a
route is computed with arithmetic rather than graph search and many routes at once with
numpy (a 4,096-GPU ring has 4,096 edges to route).

Routes (src and dst are global GPU indices):
- same node, NVSwitch: GPU -> switch -> GPU (the sender's up-link and the receiver's down-link).
- same node, PCIe only: GPU -> PCIe switch -> GPU.
- other node: GPU -PCIe-> its NIC -> leaf [-> spine or aggregation/core -> leaf] -> NIC -PCIe-> GPU.
  With PXN (NCCL's default on NVSwitch nodes), a GPU first hands the data over NVLink to the
  GPU whose NIC is on the destination NIC's rail, so traffic stays on one rail of a
  rail-optimized fabric; that is how NCCL avoids crossing spines.
- NVLS: GPU -> switch and switch -> GPU halves, written with SWITCH (-1) as the other end.
Between leaves the fabric offers several equal-cost paths. "adaptive" routing spreads a
transfer evenly over all of them (a 1/k share of the transfer on each of k links: adaptive
routing on InfiniBand, packet spraying); "ecmp" hashes (src, dst, channel) to pick one, so
transfers can collide on a link the way hashed ECMP makes them collide.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass

import numpy as np

from phantora.net.cluster import Cluster, LinkSpec
from phantora.net.records import LinkInfo

SWITCH = -1  # a transfer endpoint meaning "the node's NVSwitch" (NVLS)


@dataclass(frozen=True)
class _Block:
    kind: str
    start: int
    count: int
    shape: tuple[int, ...]  # how the index within the block decomposes, for names
    names: tuple[str, ...]


class Topology:
    def __init__(self, cluster: Cluster):
        self.cluster = cluster
        node, fabric = cluster.node, cluster.fabric
        G, N, K = node.gpus, cluster.nodes, node.nics
        self.gpus_per_node, self.nodes, self.nics = G, N, K
        self.num_gpus = G * N
        self.nvswitch = node.intra == "nvswitch"
        self._blocks: list[_Block] = []
        self._cap: list[np.ndarray] = []
        self._line: list[np.ndarray] = []
        self._lat: list[np.ndarray] = []
        self._next = 0

        per_gpu, per_nic = ((N, G), ("node", "gpu")), ((N, K), ("node", "nic"))
        if self.nvswitch:
            self.nvl_up0 = self._block("gpu->nvswitch", *per_gpu, node.nvlink)
            self.nvl_down0 = self._block("nvswitch->gpu", *per_gpu, node.nvlink)
        self.pcie_up0 = self._block("gpu->pcie", *per_gpu, node.pcie)
        self.pcie_down0 = self._block("pcie->gpu", *per_gpu, node.pcie)
        self.nic_tx0 = self._block("nic->leaf", *per_nic, node.nic)
        self.nic_rx0 = self._block("leaf->nic", *per_nic, node.nic)

        self.nodes_per_leaf = fabric.nodes_per_leaf
        self.rail_optimized = fabric.rail_optimized
        units = math.ceil(N / fabric.nodes_per_leaf)
        self.leafs = units * K if fabric.rail_optimized else units
        ports = fabric.nodes_per_leaf * (1 if fabric.rail_optimized else K)
        leaf_down = ports * node.nic.bandwidth  # line rate of a full leaf's NIC ports

        def switch_link(line_rate: float) -> LinkSpec:
            return LinkSpec(line_rate, fabric.link_latency_ns, fabric.efficiency)

        self.fat_tree = fabric.topology == "fat_tree"
        self.adaptive = fabric.routing == "adaptive"
        L = self.leafs
        if not self.fat_tree:
            S = self.spines = fabric.spines
            up = switch_link(leaf_down / fabric.oversubscription / S)
            self.leaf_up0 = self._block("leaf->spine", (L, S), ("leaf", "spine"), up)
            self.leaf_down0 = self._block("spine->leaf", (L, S), ("leaf", "spine"), up)
        else:
            A = self.aggs = fabric.aggregations_per_pod
            self.leafs_per_pod = fabric.leafs_per_pod
            P = self.pods = math.ceil(L / fabric.leafs_per_pod)
            C = self.cores_per_agg = fabric.cores // A
            up = switch_link(leaf_down / fabric.oversubscription / A)
            core = switch_link(fabric.leafs_per_pod * up.bandwidth
                               / fabric.core_oversubscription / C)
            self.leaf_up0 = self._block("leaf->agg", (L, A), ("leaf", "agg"), up)
            self.leaf_down0 = self._block("agg->leaf", (L, A), ("leaf", "agg"), up)
            self.agg_up0 = self._block("agg->core", (P, A, C), ("pod", "agg", "core"), core)
            self.agg_down0 = self._block("core->agg", (P, A, C), ("pod", "agg", "core"), core)

        self.capacity = np.concatenate(self._cap)  # GB/s == bytes per ns
        self.line_rate = np.concatenate(self._line)
        self.latency = np.concatenate(self._lat)  # ns
        self.n_links = self._next
        self._starts = [b.start for b in self._blocks]
        self.nic_of_local = np.arange(G, dtype=np.int64) * K // G
        first = np.zeros(K, dtype=np.int64)
        for local in range(G - 1, -1, -1):
            first[self.nic_of_local[local]] = local
        self.first_local_of_nic = first
        self.solve_scale, self.solve_capacity = self._rate_constraints()

    def _rate_constraints(self) -> tuple[np.ndarray, np.ndarray]:
        """The links the rate solve (fluid.py) needs, as (coefficient scale per link, 0 where
        the link is no constraint of its own; capacity per link as the solve sees it).

        Two kinds of links always carry the same transfers in the same proportion, so one
        constraint stands for them and the solve holds fewer (flow, link) pairs: a round of a
        1,024-GPU all-to-all loads 384 links, 128 of them PCIe twins of NICs, and a ring
        crossing leaves 16 spine links per hop.
        - Adaptive routing spreads every transfer evenly over all equal-cost up-links of its leaf
          (or pod), and likewise down: the group is one link of the summed capacity, loaded by
          the group's size times one link's coefficient (exactly the same rates when the group's
          size is a power of two, since that scaling is exact in floating point).
        - With a NIC per GPU and NVSwitch (PXN), a GPU's PCIe up-link carries exactly the
          inter-node transfers its NIC sends (its own, and those it proxies for its rail), and
          its PCIe down-link what its NIC receives: the pair is one constraint, the tighter one
          (the other can never fill first; pairs within 1e-9 of each other stay both).
        Reports (link_utilization, flow records) still name every real link."""
        scale = np.ones(self.n_links)
        capacity = self.capacity.copy()

        def as_one(start: int, groups: int, size: int) -> None:
            if size < 2:
                return
            first = start + np.arange(groups) * size
            capacity[first] = self.capacity[first] * size
            scale[first] = size
            rest = (first[:, None] + np.arange(1, size)).ravel()
            scale[rest] = 0.0

        if self.adaptive:
            if not self.fat_tree:
                for start in (self.leaf_up0, self.leaf_down0):
                    as_one(start, self.leafs, self.spines)
            else:
                for start in (self.leaf_up0, self.leaf_down0):
                    as_one(start, self.leafs, self.aggs)
                for start in (self.agg_up0, self.agg_down0):
                    as_one(start, self.pods, self.aggs * self.cores_per_agg)
        G, K = self.gpus_per_node, self.nics
        if self.nvswitch and G == K:  # nic_of_local is the identity: GPU g's NIC is NIC g of the cluster
            gpus = np.arange(self.num_gpus)
            for pcie, nic in ((self.pcie_up0 + gpus, self.nic_tx0 + gpus),
                              (self.pcie_down0 + gpus, self.nic_rx0 + gpus)):
                a, b = self.capacity[pcie], self.capacity[nic]
                scale[pcie[(a >= b * (1 + 1e-9)) | (a == b)]] = 0.0  # the NIC fills first, or with it
                scale[nic[b >= a * (1 + 1e-9)]] = 0.0
        return scale, capacity

    def _block(self, kind: str, shape: tuple[int, ...], names: tuple[str, ...],
               spec: LinkSpec) -> int:
        count = int(np.prod(shape))
        start = self._next
        self._blocks.append(_Block(kind, start, count, shape, names))
        self._cap.append(np.full(count, spec.capacity))
        self._line.append(np.full(count, float(spec.bandwidth)))
        self._lat.append(np.full(count, float(spec.latency_ns)))
        self._next += count
        return start

    # ---- names -------------------------------------------------------------------------

    def link_kind(self, link: int) -> str:
        return self._blocks[bisect.bisect_right(self._starts, link) - 1].kind

    def link_name(self, link: int) -> str:
        b = self._blocks[bisect.bisect_right(self._starts, link) - 1]
        idx = np.unravel_index(link - b.start, b.shape)
        where = " ".join(f"{n}{int(i)}" for n, i in zip(b.names, idx))
        return f"{b.kind} [{where}]"

    def link_infos(self) -> list[LinkInfo]:
        return [LinkInfo(link=i, name=self.link_name(i), kind=self.link_kind(i),
                         line_rate=float(self.line_rate[i]), capacity=float(self.capacity[i]),
                         latency_ns=float(self.latency[i])) for i in range(self.n_links)]

    # ---- routes ------------------------------------------------------------------------

    def leaf_of(self, node: np.ndarray, nic: np.ndarray) -> np.ndarray:
        unit = node // self.nodes_per_leaf
        return unit * self.nics + nic if self.rail_optimized else unit

    def route_many(self, src, dst, salt=0, pxn: bool = True
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Routes of transfers src[i] -> dst[i], as (transfer index, link, share) triples: a
        transfer puts `share` of its bytes on that link (1 except where adaptive routing
        splits it over equal-cost links)."""
        src = np.atleast_1d(np.asarray(src, dtype=np.int64))
        dst = np.atleast_1d(np.asarray(dst, dtype=np.int64))
        salt = np.broadcast_to(np.asarray(salt, dtype=np.int64), src.shape)
        G = self.gpus_per_node
        out_m: list[np.ndarray] = []
        out_l: list[np.ndarray] = []
        out_c: list[np.ndarray] = []

        def emit(members, links, share=1.0):
            out_m.append(members)
            out_l.append(np.asarray(links, dtype=np.int64))
            out_c.append(np.broadcast_to(np.asarray(share, dtype=np.float64), members.shape))

        to_switch, from_switch = dst == SWITCH, src == SWITCH
        if (to_switch | from_switch).any() and not self.nvswitch:
            raise ValueError("NVLS transfers need an NVSwitch node")
        i = np.nonzero(to_switch)[0]
        if len(i):
            emit(i, self.nvl_up0 + src[i])
        i = np.nonzero(from_switch)[0]
        if len(i):
            emit(i, self.nvl_down0 + dst[i])

        p2p = ~(to_switch | from_switch)
        sn, dn = src // G, dst // G
        i = np.nonzero(p2p & (sn == dn))[0]
        if len(i):
            if self.nvswitch:
                up, down = self.nvl_up0, self.nvl_down0
            else:
                up, down = self.pcie_up0, self.pcie_down0
            emit(i, up + src[i])
            emit(i, down + dst[i])

        i = np.nonzero(p2p & (sn != dn))[0]
        if len(i):
            s, d, sn_i, dn_i = src[i], dst[i], sn[i], dn[i]
            ks = self.nic_of_local[s % G]
            kd = self.nic_of_local[d % G]
            k = ks
            if pxn and self.nvswitch:
                via = ks != kd
                if via.any():
                    proxy = sn_i[via] * G + self.first_local_of_nic[kd[via]]
                    emit(i[via], self.nvl_up0 + s[via])
                    emit(i[via], self.nvl_down0 + proxy)
                    emit(i[via], self.pcie_up0 + proxy)
                direct = ~via
                emit(i[direct], self.pcie_up0 + s[direct])
                k = np.where(via, kd, ks)
            else:
                emit(i, self.pcie_up0 + s)
            emit(i, self.nic_tx0 + sn_i * self.nics + k)
            emit(i, self.nic_rx0 + dn_i * self.nics + kd)
            emit(i, self.pcie_down0 + d)
            la, lb = self.leaf_of(sn_i, k), self.leaf_of(dn_i, kd)
            cross = la != lb
            if cross.any():
                self._fabric_route(emit, i[cross], la[cross], lb[cross], s[cross], d[cross],
                                   salt[i][cross])

        if not out_m:
            empty = np.zeros(0, dtype=np.int64)
            return empty, empty, np.zeros(0)
        return np.concatenate(out_m), np.concatenate(out_l), np.concatenate(out_c)

    def _fabric_route(self, emit, members, la, lb, src, dst, salt) -> None:
        if not self.fat_tree:
            S = self.spines
            if self.adaptive:
                m = np.repeat(members, S)
                sp = np.tile(np.arange(S), len(members))
                emit(m, self.leaf_up0 + np.repeat(la, S) * S + sp, 1.0 / S)
                emit(m, self.leaf_down0 + np.repeat(lb, S) * S + sp, 1.0 / S)
            else:
                sp = _hash(src, dst, salt) % np.uint64(S)
                sp = sp.astype(np.int64)
                emit(members, self.leaf_up0 + la * S + sp)
                emit(members, self.leaf_down0 + lb * S + sp)
            return
        A, C, LPP = self.aggs, self.cores_per_agg, self.leafs_per_pod
        pa, pb = la // LPP, lb // LPP
        same_pod = pa == pb
        if self.adaptive:
            m = np.repeat(members, A)
            ag = np.tile(np.arange(A), len(members))
            emit(m, self.leaf_up0 + np.repeat(la, A) * A + ag, 1.0 / A)
            emit(m, self.leaf_down0 + np.repeat(lb, A) * A + ag, 1.0 / A)
            far = ~same_pod
            if far.any():
                mf = np.repeat(members[far], A * C)
                ac = np.tile(np.arange(A * C), int(far.sum()))
                emit(mf, self.agg_up0 + np.repeat(pa[far], A * C) * A * C + ac, 1.0 / (A * C))
                emit(mf, self.agg_down0 + np.repeat(pb[far], A * C) * A * C + ac, 1.0 / (A * C))
        else:
            h = _hash(src, dst, salt)
            ag = (h % np.uint64(A)).astype(np.int64)
            co = ((h // np.uint64(A)) % np.uint64(C)).astype(np.int64)
            emit(members, self.leaf_up0 + la * A + ag)
            emit(members, self.leaf_down0 + lb * A + ag)
            far = ~same_pod
            if far.any():
                emit(members[far], self.agg_up0 + (pa[far] * A + ag[far]) * C + co[far])
                emit(members[far], self.agg_down0 + (pb[far] * A + ag[far]) * C + co[far])

    def route_latency_many(self, src, dst, pxn: bool = True) -> np.ndarray:
        """Hardware latency (ns) of each transfer's route: the sum of its links' latencies
        (with adaptive routing, the share-weighted mean over the equal-cost alternatives,
        which all have the same latency)."""
        member, link, share = self.route_many(src, dst, 0, pxn)
        n = len(np.atleast_1d(src))
        return np.bincount(member, weights=self.latency[link] * share, minlength=n)


def _hash(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """A fixed 64-bit mix of three integers (splitmix64 finalizer): the same on every run and
    platform, unlike Python's hash()."""
    x = (a.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)
         ^ (b.astype(np.uint64) + np.uint64(0x632BE59BD9B4E019)) * np.uint64(0xC2B2AE3D27D4EB4F)
         ^ (c.astype(np.uint64) + np.uint64(0x8CB92BA72F3D8DD7)) * np.uint64(0x165667B19E3779F9))
    x ^= x >> np.uint64(30)
    x *= np.uint64(0xBF58476D1CE4E5B9)
    x ^= x >> np.uint64(27)
    x *= np.uint64(0x94D049BB133111EB)
    x ^= x >> np.uint64(31)
    return x
