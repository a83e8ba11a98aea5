"""Flow-level ("fluid") simulation: flows share links at max-min fair rates, event by event.

State. A flow is one rate variable (a point-to-point transfer, or a ring/tree of them that
moves in lockstep; see collectives.py) that starts at an integer-ns time with some bytes to
deliver. Between events every rate is constant. Each flow keeps its rate history as segments
(t, bytes remaining at t, rate from t on); that history is what rollback rewinds.

Events. At each event time t (a batch): flows starting at t join, flows whose bytes run out at
t leave; then the rates of every connected component (flows linked through shared links)
that gained or lost a flow are recomputed, and nothing else: a change cannot propagate
beyond its component. That is the incremental part of the max-min solve.

Islands. Flows that ever shared a link (within the history kept) form an island, with its own
event queue and its own "processed up to" time. Islands never interact, so each runs only
as far as someone asks, and a late arrival rolls back only its island: on a cluster running
tensor-parallel all-reduces per node, a late arrival on node 3 never rewinds node 200.

Exactness. Event times are integers (a flow's drain time is rounded up to the next ns), and
everything computed at an event depends only on the flows involved, taken in a canonical
order (their `key`, which does not depend on arrival order) - not on island boundaries,
arrival order or how far anything was simulated before. Hence the rollback invariant: any
arrival order gives bit-identical completion times to a run that knew every flow in advance.
"""

from __future__ import annotations

import heapq
import math

import numpy as np
from sortedcontainers import SortedList

from phantora.net.maxmin import max_min_rates, unique_ids

PENDING, ACTIVE, DONE = 0, 1, 2
# Above this, a flow's links are handled in numpy, and kept out of the per-link index. A ring over
# 16 nodes crossing leaves holds 40 rate constraints (Topology.solve_scale): at 64, those went
# link by link, and the 671B's replay at 1,024 GPUs took 83-84 s against 75 s at 16.
_MANY_LINKS = 16


class Flow:
    __slots__ = ("fid", "key", "handle", "start", "nbytes", "latency_ns", "links", "coefs",
                 "link_list", "cap", "state", "seg_t", "seg_rem", "seg_rate", "done_t",
                 "version", "island", "members", "loads")

    def __init__(self, fid: int, key: tuple, handle: int, start: int, nbytes: float,
                 latency_ns: int, links: np.ndarray, coefs: np.ndarray, cap: float,
                 members=None, link_list: list[int] | None = None,
                 loads: tuple[np.ndarray, np.ndarray] | None = None):
        self.fid = fid
        self.key = key  # canonical order: independent of arrival order
        self.handle = handle
        self.start = start
        self.nbytes = nbytes
        self.latency_ns = latency_ns
        self.links = links  # unique link ids (int64)
        self.coefs = coefs  # link bytes per delivered byte, per link
        # read-only: flows of one routed group share their caller's list
        self.link_list = links.tolist() if link_list is None else link_list
        self.cap = cap
        self.state = PENDING
        self.seg_t: list[int] = []
        self.seg_rem: list[float] = []
        self.seg_rate: list[float] = []
        self.done_t = -1
        self.version = 0  # bumps whenever a queued drain event of this flow goes stale
        self.island = -1
        self.members = members  # (src, dst, weight, salt) of the transfers it stands for
        # every real link it loads and by how much (links/coefs may stand one link for a group
        # that always carries the same load: Topology.solve_scale); what link_utilization reports
        self.loads = (links, coefs) if loads is None else loads

    def projected_drain(self) -> int | None:
        return drain_time(self.seg_t[-1], self.seg_rem[-1], self.seg_rate[-1])

    def end_ns(self) -> int:
        return self.done_t + self.latency_ns


def drain_time(t: int, remaining: float, rate: float) -> int | None:
    """The integer ns at which a flow with `remaining` bytes at t, at `rate`, has delivered
    them: rounded up (the 1e-6 ns slack keeps an exact quotient from rounding up a whole ns),
    and at least one ns after t (a flow still active at t needs some time)."""
    if rate <= 0:
        return None
    return max(t + 1, math.ceil(t + remaining / rate - 1e-6))


class DoneByTime:
    """The finished flows by the time they finished, for what a rollback to t can touch (the
    flows done at or after t). Flows finish in batches (every flow draining at one event time),
    so the times are kept sorted and each holds a set of flows: one sorted insertion per batch,
    not per flow (an all-to-all's thousands of flows drain together)."""

    def __init__(self) -> None:
        self._times = SortedList()
        self._fids: dict[int, set[int]] = {}

    def add_batch(self, t: int, fids: list[int]) -> None:
        at = self._fids.get(t)
        if at is None:
            self._fids[t] = set(fids)
            self._times.add(t)
        else:
            at.update(fids)

    def discard(self, t: int, fid: int) -> None:
        at = self._fids.get(t)
        if at is None:
            return
        at.discard(fid)
        if not at:
            del self._fids[t]
            self._times.remove(t)

    def fids_from(self, t: int) -> list[int]:
        """The flows done at or after t."""
        fids = self._fids
        return [fid for time in self._times.islice(self._times.bisect_left(t)) for fid in fids[time]]

    def __len__(self) -> int:
        return sum(len(at) for at in self._fids.values())


class WideIndex:
    """Flows with many links (a ring over many GPUs, a round of an all-to-all: hundreds of
    links each), found from a set of links in numpy. Indexing and unindexing such flows link by
    link, a Python set operation per link each time a flow changed state or was kept or
    forgotten, was 37% of the samples of a DeepSeek-V3 671B run's network at 256 GPUs (py-spy
    over benchmarks/net_replay.py's replay of it).

    The flows are held in chunks, one per batch of flows added between two look-ups (a
    collective's flows come together); a flow discarded stays in its chunk until the chunks are
    rebuilt (when they hold twice the flows there are, or too many chunks), and look-ups drop
    it. A chunk is a bit matrix, a row per link its flows use and a bit per flow: a look-up ORs
    the rows of the links asked about, so it costs (links asked) x (flows in the chunk) / 8
    bytes, not a pass over every (flow, link) pair (which was 17% of the 671B's network at
    1,024 GPUs: a look-up of a few hundred links among 300,000 pairs). With `counted`, on_link
    counts the flows on each link, so that a look-up on links none of them use costs nothing (a
    numpy update per flow added or discarded: the index of active flows, which change state at
    every event, leaves it to its caller)."""

    __slots__ = ("flows", "on_link", "_n_links", "_chunks", "_pending", "_entries")
    _MAX_CHUNKS = 64

    def __init__(self, n_links: int, counted: bool) -> None:
        self.flows: dict[int, Flow] = {}
        self.on_link = np.zeros(n_links, dtype=np.int32) if counted else None
        self._n_links = n_links
        self._chunks: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []  # (fids, row of each link, bits)
        self._pending: list[Flow] = []
        self._entries = 0  # flows in the chunks and pending, discarded ones included

    def add(self, f: Flow) -> None:
        self.flows[f.fid] = f
        if self.on_link is not None:
            self.on_link[f.links] += 1
        self._pending.append(f)
        self._entries += 1

    def discard(self, f: Flow) -> None:
        if self.flows.pop(f.fid, None) is not None and self.on_link is not None:
            self.on_link[f.links] -= 1

    def __bool__(self) -> bool:
        return bool(self.flows)

    def _chunk(self, flows: list[Flow]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(fids, row: each link's row of bits or -1, bits: a row per used link, packed bits
        over the chunk's flows in order, as np.packbits lays them out)."""
        used = unique_ids(np.concatenate([f.links for f in flows]), self._n_links)
        row = np.full(self._n_links, -1, dtype=np.int32)
        row[used] = np.arange(len(used), dtype=np.int32)
        width = (len(flows) + 7) // 8
        bits = np.zeros(len(used) * width, dtype=np.uint8)
        for b in range(min(8, len(flows))):  # flows b, b + 8, ...: bit b of bytes 0, 1, ...
            these = flows[b::8]
            byte = (row[np.concatenate([f.links for f in these])] * width
                    + np.repeat(np.arange(len(these)), [len(f.links) for f in these]))
            bits[byte] |= np.uint8(128 >> b)  # a flow's links are unique: no byte repeats here
        return np.array([f.fid for f in flows], dtype=np.int64), row, bits.reshape(len(used), width)

    def touching(self, links: np.ndarray) -> set[int]:
        """The fids of the flows that use one of `links`."""
        if self.on_link is not None:
            links = links[self.on_link[links] > 0]
        if not len(links):
            return set()
        if len(links) > 64:  # the drained flows of an event ask about their links together, repeated
            links = unique_ids(links, self._n_links)
        flows = self.flows
        if self._entries > 2 * len(flows) + 64 or len(self._chunks) >= self._MAX_CHUNKS:
            self._chunks = [self._chunk(list(flows.values()))] if flows else []
            self._pending = []
            self._entries = len(flows)
        elif self._pending:
            kept = [f for f in self._pending if flows.get(f.fid) is f]
            if kept:
                self._chunks.append(self._chunk(kept))
            self._entries -= len(self._pending) - len(kept)
            self._pending = []
        out: set[int] = set()
        for fids, row, bits in self._chunks:
            rows = row[links]
            rows = rows[rows >= 0]
            if len(rows):
                hit = np.unpackbits(np.bitwise_or.reduce(bits[rows], axis=0), count=len(fids))
                out.update(fids[hit.view(bool)].tolist())
        return {fid for fid in out if fid in flows}


class Island:
    __slots__ = ("iid", "fids", "arrivals", "drains", "processed_until")

    def __init__(self, iid: int):
        self.iid = iid
        self.fids: set[int] = set()
        self.arrivals: list[tuple[int, int]] = []  # heap of (start, fid)
        self.drains: list[tuple[int, int, int]] = []  # heap of (time, fid, version)
        self.processed_until = -1  # time of the last event batch applied


class FlowSimulator:
    def __init__(self, capacity: np.ndarray):
        self.capacity = capacity
        self.flows: dict[int, Flow] = {}
        self.islands: dict[int, Island] = {}
        self._island_parent: list[int] = []
        self._link_island = np.full(len(capacity), -1, dtype=np.int64)
        # Active flows by link, two ways: a flow with few links (a point-to-point transfer) in
        # _on_link, link by link (_narrow_on_link counts them per link), one with many in _wide.
        self._on_link: dict[int, set[int]] = {}  # link -> active flows with few links
        self._narrow_on_link = np.zeros(len(capacity), dtype=np.int32)
        # active flows with many links; those on a link: _flows_on_link - _narrow_on_link
        self._wide = WideIndex(len(capacity), counted=False)
        self._flows_on_link = np.zeros(len(capacity), dtype=np.int32)  # every active flow
        # What a rollback to t can touch: the flows not done yet, and the done ones by the time
        # they finished (rollback.py finds the flows with events at or after t from these two
        # instead of scanning every flow of the island's history).
        self.live: set[int] = set()
        self.done_by_time = DoneByTime()
        # Every flow not forgotten, by link: rollback_scope walks out from a late flow's links
        # instead of scanning every flow with an event after its start (at 768 GPUs, with
        # Transformer Engine's rings, that scan was 79% of the simulator's time). Flows with
        # many links are in kept_wide instead, as the active ones are in _wide.
        self.flows_by_link: dict[int, set[int]] = {}
        self.kept_narrow = np.zeros(len(capacity), dtype=bool)  # links in flows_by_link
        self.kept_wide = WideIndex(len(capacity), counted=True)
        self.link_seen = np.zeros(len(capacity), dtype=bool)  # scratch, False between uses
        self.batches = 0
        self.solves = 0

    # ---- islands ---------------------------------------------------------------------

    def _find(self, iid: int) -> int:
        parent = self._island_parent
        root = iid
        while parent[root] != root:
            root = parent[root]
        while parent[iid] != root:
            parent[iid], iid = root, parent[iid]
        return root

    def _new_island(self) -> Island:
        iid = len(self._island_parent)
        self._island_parent.append(iid)
        island = self.islands[iid] = Island(iid)
        return island

    def island_of(self, flow: Flow) -> Island:
        return self.islands[flow.island]

    def attach(self, flows: list[Flow]) -> Island:
        """Put new (pending) flows into the island their links lead to, merging islands they
        connect. Returns the island; its processed_until is what the newcomers must beat to
        avoid a rollback (the caller decides)."""
        links = (flows[0].links if len(flows) == 1
                 else unique_ids(np.concatenate([f.links for f in flows]), len(self.capacity)))
        ids = self._link_island[links]
        roots = sorted({self._find(i) for i in set(ids[ids >= 0].tolist())})
        if not roots:
            island = self._new_island()
        else:
            island = max((self.islands[r] for r in roots), key=lambda i: (len(i.fids), -i.iid))
            for r in roots:
                if r != island.iid:
                    self._merge(island, self.islands[r])
        self._link_island[links] = island.iid
        iid, by_fid, arrivals = island.iid, self.flows, island.arrivals
        by_link, kept_narrow, kept_wide = self.flows_by_link, self.kept_narrow, self.kept_wide
        for f in flows:
            by_fid[f.fid] = f
            f.island = iid
            if len(f.link_list) > _MANY_LINKS:
                kept_wide.add(f)
                continue
            for link in f.link_list:
                on = by_link.get(link)
                if on is None:
                    by_link[link] = {f.fid}
                    kept_narrow[link] = True
                else:
                    on.add(f.fid)
        fids = [f.fid for f in flows]
        self.live.update(fids)
        island.fids.update(fids)
        if len(flows) > 8:  # one heapify for a collective's many flows (the heap is a set of distinct pairs)
            arrivals.extend((f.start, f.fid) for f in flows)
            heapq.heapify(arrivals)
        else:
            for f in flows:
                heapq.heappush(arrivals, (f.start, f.fid))
        return island

    def _merge(self, into: Island, other: Island) -> None:
        # Islands being merged never shared a link before this moment, so their queued
        # events can simply be interleaved: events of one never involve flows of the other.
        for fid in other.fids:
            self.flows[fid].island = into.iid
        into.fids |= other.fids
        into.arrivals.extend(other.arrivals)
        heapq.heapify(into.arrivals)
        into.drains.extend(other.drains)
        heapq.heapify(into.drains)
        into.processed_until = max(into.processed_until, other.processed_until)
        self._island_parent[other.iid] = into.iid
        del self.islands[other.iid]

    def rebuild_islands(self) -> None:
        """Recompute islands from the live flows (after pruning dropped the flows that tied
        them together), so that they split again."""
        self.islands.clear()
        self._island_parent.clear()
        self._link_island[:] = -1
        link_island = self._link_island
        for fid in sorted(self.flows):
            f = self.flows[fid]
            if len(f.link_list) > _MANY_LINKS:
                ids = link_island[f.links]
                roots = sorted({self._find(int(i)) for i in np.unique(ids[ids >= 0])})
            else:  # a point-to-point transfer's few links: numpy's per-call cost would dominate
                roots = sorted({self._find(i) for i in link_island[f.links].tolist() if i >= 0})
            island = self._new_island() if not roots else self.islands[roots[0]]
            for r in roots[1:]:
                other = self.islands.pop(r)
                for g in other.fids:
                    self.flows[g].island = island.iid
                island.fids |= other.fids
                self._island_parent[r] = island.iid
            self._link_island[f.links] = island.iid
            f.island = island.iid
            island.fids.add(fid)
        for island in self.islands.values():
            for fid in island.fids:
                f = self.flows[fid]
                if f.state == PENDING:
                    island.arrivals.append((f.start, fid))
                elif f.state == ACTIVE:
                    self._queue_drain(island, f)
                island.processed_until = max(island.processed_until, last_event_time(f))
            heapq.heapify(island.arrivals)

    # ---- the link index of active flows -------------------------------------------------

    def activate(self, f: Flow) -> None:
        """Index the flow's links; its caller counts them with count_links, for the whole batch."""
        if len(f.link_list) > _MANY_LINKS:
            self._wide.add(f)
            return
        on_link = self._on_link
        for link in f.link_list:
            s = on_link.get(link)
            if s is None:
                on_link[link] = {f.fid}
            else:
                s.add(f.fid)
        self._narrow_on_link[f.links] += 1

    def deactivate(self, f: Flow) -> None:
        """Unindex the flow's links; its caller counts them with count_links, for the whole batch."""
        if len(f.link_list) > _MANY_LINKS:
            self._wide.discard(f)
            return
        on_link = self._on_link
        for link in f.link_list:
            s = on_link[link]
            s.discard(f.fid)
            if not s:
                del on_link[link]
        self._narrow_on_link[f.links] -= 1

    def _wide_on(self, links: np.ndarray) -> set[int]:
        """The active flows with many links that use one of `links`: only links where the count
        of active flows exceeds the narrow ones' are looked up."""
        return self._wide.touching(links[self._flows_on_link[links] > self._narrow_on_link[links]])

    def count_links(self, flows: list[Flow], delta: int) -> None:
        """_flows_on_link for a batch of flows just activated (+1) or deactivated (-1), in one
        numpy call: an all-to-all's thousands of flows arrive and drain together."""
        if len(flows) == 1:
            self._flows_on_link[flows[0].links] += delta
        elif flows:  # bincount: np.add.at was 12% of an all-to-all's simulation at 1,024 GPUs
            counts = np.bincount(np.concatenate([f.links for f in flows]), minlength=len(self._flows_on_link))
            self._flows_on_link += (delta * counts).astype(np.int32)

    def remove(self, f: Flow) -> None:
        """Forget a finished flow (pruning)."""
        assert f.state == DONE
        del self.flows[f.fid]
        if len(f.link_list) > _MANY_LINKS:
            self.kept_wide.discard(f)
        else:
            for link in f.link_list:
                on = self.flows_by_link[link]
                on.discard(f.fid)
                if not on:
                    del self.flows_by_link[link]
                    self.kept_narrow[link] = False
        self.done_by_time.discard(f.done_t, f.fid)
        island = self.islands.get(f.island)
        if island is not None:
            island.fids.discard(f.fid)

    # ---- events ------------------------------------------------------------------------

    def _queue_drain(self, island: Island, f: Flow) -> None:
        t = f.projected_drain()
        if t is not None:
            heapq.heappush(island.drains, (t, f.fid, f.version))

    def queue_drain(self, f: Flow) -> None:
        self._queue_drain(self.island_of(f), f)

    def next_time(self, island: Island) -> int | None:
        drains = island.drains
        while drains:
            t, fid, version = drains[0]
            f = self.flows.get(fid)
            if f is not None and f.state == ACTIVE and f.version == version:
                break
            heapq.heappop(drains)  # stale: the flow's rate changed, or it was rolled back
        arrivals = island.arrivals
        while arrivals:
            f = self.flows.get(arrivals[0][1])
            if f is not None and f.state == PENDING and f.start == arrivals[0][0]:
                break
            heapq.heappop(arrivals)
        candidates = []
        if drains:
            candidates.append(drains[0][0])
        if arrivals:
            candidates.append(arrivals[0][0])
        return min(candidates) if candidates else None

    def step(self, island: Island) -> int | None:
        """Apply the next event batch of an island; returns its time (None: nothing left)."""
        t = self.next_time(island)
        if t is None:
            return None
        self.batches += 1
        flows = self.flows
        drained = []
        while island.drains and island.drains[0][0] == t:
            _, fid, version = heapq.heappop(island.drains)
            f = flows.get(fid)
            if f is not None and f.state == ACTIVE and f.version == version:
                drained.append(f)
        arrived = []
        while island.arrivals and island.arrivals[0][0] == t:
            _, fid = heapq.heappop(island.arrivals)
            f = flows.get(fid)
            if f is not None and f.state == PENDING and f.start == t:
                arrived.append(f)
        seeds: set[int] = set()
        for f in drained:
            f.state = DONE
            f.done_t = t
            f.version += 1
            self.deactivate(f)
            self.live.discard(f.fid)
        if drained:
            self.done_by_time.add_batch(t, [f.fid for f in drained])
            self.count_links(drained, -1)
            # the flows still on the drained flows' links, each link once (the flows of an
            # all-to-all that drain together share most of their links)
            freed = drained[0].links if len(drained) == 1 else np.concatenate([f.links for f in drained])
            on_link, narrow = self._on_link, self._narrow_on_link
            if on_link:
                for link in set(freed[narrow[freed] > 0].tolist()):
                    seeds |= on_link[link]
            if self._wide:
                seeds |= self._wide_on(freed)
        activated = []
        for f in arrived:
            if f.state != PENDING:
                continue  # listed twice in the heap
            f.state = ACTIVE
            f.seg_t.append(t)
            f.seg_rem.append(f.nbytes)
            f.seg_rate.append(0.0)
            self.activate(f)
            activated.append(f)
            seeds.add(f.fid)
        self.count_links(activated, 1)
        for component in self._components(seeds):
            self._solve(island, component, t)
        island.processed_until = max(island.processed_until, t)
        return t

    def run_before(self, island: Island, t: int) -> None:
        """Apply every event batch of the island earlier than t."""
        while True:
            nxt = self.next_time(island)
            if nxt is None or nxt >= t:
                return
            self.step(island)

    def run_until_done(self, f: Flow) -> None:
        while f.state != DONE:
            if self.step(self.island_of(f)) is None:
                raise RuntimeError(f"flow {f.fid} can never finish (no link capacity?)")

    # ---- rates -------------------------------------------------------------------------

    def _components(self, seeds: set[int]) -> list[list[int]]:
        """Connected components (through links shared by active flows) containing the seeds,
        grown from each seed a frontier at a time: the links the frontier reaches first, then
        every active flow on them (flows with few links from _on_link, the others in numpy)."""
        flows, on_link, shared = self.flows, self._on_link, self._flows_on_link
        visited, narrow = self.link_seen, self._narrow_on_link
        any_wide = bool(self._wide)
        seen: set[int] = set()
        seen_small: set[int] = set()
        components = []
        touched: list[np.ndarray] = []
        for s in sorted(seeds):
            if s in seen:
                continue
            seen.add(s)
            component, frontier = [s], [s]
            while frontier:
                reached: list[np.ndarray] = []  # links reached for the first time
                reached_small: list[int] = []
                wide: list[np.ndarray] = []
                for fid in frontier:
                    f = flows[fid]
                    if len(f.link_list) > _MANY_LINKS:
                        wide.append(f.links)
                    else:
                        for link in f.link_list:
                            if link not in seen_small:
                                seen_small.add(link)
                                reached_small.append(link)
                if wide:  # the wide flows' links in one pass: an all-to-all's frontier has hundreds
                    links = wide[0] if len(wide) == 1 else np.concatenate(wide)
                    links = links[shared[links] > 1]  # links only one flow uses lead nowhere
                    links = links[~visited[links]]
                    if len(links):
                        if len(wide) > 1:
                            links = unique_ids(links, len(visited))
                        visited[links] = True
                        touched.append(links)
                        reached.append(links)
                frontier = []
                found: list[int] = []
                for link in reached_small:
                    on = on_link.get(link)
                    if on is not None:
                        found.extend(on)
                for links in reached:
                    for link in links[narrow[links] > 0].tolist():
                        found.extend(on_link[link])
                if any_wide and (reached or reached_small):
                    small = np.asarray(reached_small, dtype=np.int64)
                    found.extend(self._wide_on(np.concatenate([*reached, small])))
                for g in found:
                    if g not in seen:
                        seen.add(g)
                        component.append(g)
                        frontier.append(g)
            components.append(component)
        for links in touched:
            visited[links] = False
        return components

    def _solve(self, island: Island, component: list[int], t: int) -> None:
        flows = sorted((self.flows[i] for i in component), key=lambda f: f.key)
        rates = max_min_rates([f.links for f in flows], [f.coefs for f in flows],
                              np.array([f.cap for f in flows]), self.capacity)
        self.solves += 1
        for f, rate in zip(flows, rates.tolist()):
            last = f.seg_t[-1]
            if last == t:
                f.seg_rate[-1] = rate
            else:
                remaining = f.seg_rem[-1] - f.seg_rate[-1] * (t - last)
                f.seg_t.append(t)
                f.seg_rem.append(remaining)
                f.seg_rate.append(rate)
            f.version += 1
            self._queue_drain(island, f)


def last_event_time(f: Flow) -> int:
    """The latest event batch that left a trace on this flow (-1: none)."""
    last = f.seg_t[-1] if f.seg_t else -1
    return max(last, f.done_t) if f.state == DONE else last
