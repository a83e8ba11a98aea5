"""The network simulator as the engine sees it: submit collectives, ask when they finish.

    net = Network(load_cluster("dgx-h100", nodes=2))
    h = net.submit(CollectiveSpec("all_reduce", 256 << 20, tuple(range(16))), start_ns=0)
    end = net.finish_time(h)          # simulates as far as needed
    net.take_corrections()            # ends already returned that a late arrival changed
    net.prune(horizon_ns)             # every participant's clock is past horizon_ns: forget
                                      # the history before it (smaller islands, less memory)

Modes. "optimistic": finish_time simulates ahead; a collective that later arrives with an
earlier start rolls the affected part of the network back (rollback.py), and every completion
time already returned that changed is reported by take_corrections() once the network has
simulated that far again (settle() simulates it at once), the rollback itself by
take_rollbacks(). "conservative": the caller promises, through
advance_horizon(t), that no future submission starts before t; the network never simulates
past that horizon, finish_time returns None while the answer could still change, and no
rollback ever happens. Both give the same times for the same submissions.

Deterministic: the same submissions give the same times, whatever the arrival order (in
optimistic mode, after corrections) and whatever was queried in between.
"""

from __future__ import annotations

import functools
import time
from collections import OrderedDict
from dataclasses import dataclass, field, replace

import numpy as np

from phantora.net import collectives as coll
from phantora.net.cluster import Cluster
from phantora.net.fluid import ACTIVE, DONE, PENDING, Flow, FlowSimulator
from phantora.net.records import (OPS, TRANSPORTS, CollectiveInfo, CollectiveSpec, Correction, FlowRecord,
                                  LinkInfo, LinkSegment, NetworkStats, RollbackRecord)
from phantora.net.rollback import prune_history, roll_back, rollback_scope
from phantora.net.topology import Topology
from phantora.net.tuning import (P2P, USERBUFFERS, NcclConstants, collective_latency_us,
                                 default_algorithms, parse_override, predicted_time_us, ring_plateau_applies,
                                 runnable_algorithms, runnable_protocols)

MODES = ("optimistic", "conservative")
_CACHE_SIZE = 1024  # communicators (and their algorithm candidates) remembered
_CHOSEN_SIZE = 65_536  # (op, ranks, bytes) -> the algorithm and protocol chosen for them
_CACHE_LINK_ENTRIES = 8_000_000  # routed plans are kept up to this many (link, load) pairs
_LOAD_UNITS = 1e6  # link_utilization sums loads in integer micro-GB/s


@dataclass(frozen=True)
class NetworkConfig:
    """mode: "optimistic" (simulate ahead, roll back) or "conservative" (never past the
    horizon). algorithm / protocol: like NCCL_ALGO / NCCL_PROTO ("ring", "tree,ring",
    "^nvls", "allreduce:tree"); None lets the model choose as NCCL would. pxn: route
    cross-rail traffic through the GPU on the destination's rail (NCCL's PXN).
    record_flows: include per-transfer FlowRecords in the CollectiveInfo prune() returns."""

    mode: str = "optimistic"
    algorithm: str | None = None
    protocol: str | None = None
    pxn: bool = True
    record_flows: bool = False
    constants: NcclConstants = field(default_factory=NcclConstants)


@dataclass
class _RoutedGroup:
    """A FlowGroup with its routes folded into per-link load coefficients."""

    links: np.ndarray  # the links that constrain its rate (Topology.solve_scale), with
    coefs: np.ndarray  # their load per byte (an aggregated group's: its size x one link's)
    cap: float
    latency_ns: int
    fraction: float
    fixed_bytes: int | None
    members: tuple  # (src, dst, payload, salt), for FlowRecords
    loads: tuple[np.ndarray, np.ndarray]  # every real link and its load per byte (link_utilization)
    link_list: list[int] = field(default_factory=list)  # links.tolist(), once for every flow made from it


@dataclass
class _Choice:
    algorithm: str
    protocol: str
    groups: list[_RoutedGroup]
    latency_ns: int  # NCCL's latency for this communicator, before size-dependent terms
    transfers: int = 0  # point-to-point transfers the groups stand for


class _Collective:
    __slots__ = ("handle", "spec", "start", "algorithm", "protocol", "channels", "transfers",
                 "flows", "latency_ns", "end", "reported", "pruned_end", "pruned_records")

    def __init__(self, handle, spec, start, algorithm, protocol, channels, transfers, latency_ns):
        self.handle, self.spec, self.start = handle, spec, start
        self.algorithm, self.protocol = algorithm, protocol
        self.channels, self.transfers, self.latency_ns = channels, transfers, latency_ns
        self.flows: list[Flow] = []
        self.end: int | None = None  # known and final unless a rollback resets it
        self.reported: int | None = None  # the last end finish_time returned
        self.pruned_end = -1  # latest end among flows already forgotten
        self.pruned_records: list[FlowRecord] = []


def _timed(method):
    """Adds the wall time of an engine-facing call to Network.wall_s (once, if calls nest): the
    simulator's share of a run's wall time, which docs/scale.md reports per layout."""
    @functools.wraps(method)
    def timed(self, *args, **kwargs):
        if self._in_call:
            return method(self, *args, **kwargs)
        self._in_call = True
        started = time.perf_counter()
        try:
            return method(self, *args, **kwargs)
        finally:
            self.wall_s += time.perf_counter() - started
            self._in_call = False

    return timed


class Network:
    def __init__(self, cluster: Cluster, config: NetworkConfig | None = None):
        self.cluster = cluster
        self.config = config = config or NetworkConfig()
        if config.mode not in MODES:
            raise ValueError(f"mode: {config.mode!r} is not allowed (allowed: {', '.join(MODES)})")
        self._algorithms = parse_override(config.algorithm, "algorithm")
        self._protocols = parse_override(config.protocol, "protocol")
        self.topology = Topology(cluster)
        self._sim = FlowSimulator(self.topology.solve_capacity)
        self._collectives: dict[int, _Collective] = {}
        self._next_handle = 0
        self._next_fid = 0
        self._horizon = 0
        self._corrections: list[Correction] = []
        # reported ends a rollback undid, not yet simulated again (take_corrections, settle)
        self._unsettled: set[int] = set()
        self._rollbacks: list[RollbackRecord] = []
        self._rollback_count = 0
        self._plans: OrderedDict[tuple, _Choice] = OrderedDict()  # LRU of routed plans
        self._plan_entries = 0
        self._candidates: OrderedDict[tuple, list[tuple[str, str]]] = OrderedDict()
        self._chosen: OrderedDict[tuple, tuple[str, str]] = OrderedDict()  # (op, ranks, nbytes) -> algorithm, protocol
        self._communicators: OrderedDict[tuple, coll.Communicator] = OrderedDict()
        self.flows_submitted = 0
        self.transfers_submitted = 0
        self.wall_s = 0.0  # wall time spent answering the engine (_timed)
        self._in_call = False

    # ---- the engine's interface ------------------------------------------------------------

    def submit(self, spec: CollectiveSpec, start_ns: int) -> int:
        """Start a collective at start_ns (when its last participant reaches it); returns a
        handle. If start_ns is before what the network has simulated, the affected part rolls
        back (optimistic mode); corrections are then waiting in take_corrections()."""
        return self.submit_many([(spec, start_ns)])[0]

    @_timed
    def submit_many(self, collectives: list[tuple[CollectiveSpec, int]]) -> list[int]:
        """submit() for several collectives at once (one handle each, in order): the network
        rolls back at most once per island, to the earliest of them, where one submit() each
        would roll back and re-simulate once per collective (the ranks mirrored from one
        representative start theirs together: phantora/engine/mirrors.py)."""
        made = [self._create(spec, start) for spec, start in collectives]
        for c in made:
            if c.flows:
                self._sim.attach(c.flows)
        late: dict[int, list[_Collective]] = {}  # island -> its late newcomers
        for c in made:
            if c.flows:
                island = self._sim.island_of(c.flows[0])
                if c.start <= island.processed_until:
                    late.setdefault(island.iid, []).append(c)
        for iid, cs in late.items():
            if self.config.mode == "conservative":  # cannot happen: nothing runs past the horizon
                raise AssertionError("conservative network simulated past its horizon")
            self._roll_back(cs, self._sim.islands[iid])
        return [c.handle for c in made]

    def _create(self, spec: CollectiveSpec, start_ns: int) -> "_Collective":
        """A collective and its flows, not yet in the flow simulator."""
        spec = self._validated(spec)
        if isinstance(start_ns, bool) or not isinstance(start_ns, (int, np.integer)):
            raise ValueError(f"start_ns must be an integer (ns), got {start_ns!r}")
        start = int(start_ns)
        if start < self._horizon:
            raise ValueError(f"start_ns {start} is before the horizon {self._horizon}: the "
                             "caller promised (advance_horizon/prune) no earlier submissions")
        model = replace(spec, op="all_reduce", nbytes=4) if spec.op == "barrier" else spec
        handle = self._next_handle
        self._next_handle += 1
        if len(spec.ranks) == 1:
            c = _Collective(handle, spec, start, "none", "none", 0, 0, 0)
            c.end = start
            self._collectives[handle] = c
            return c
        choice = self._choose(model)
        const = self.config.constants
        # NCCL's size-dependent terms: multi-node rings pay more latency on large messages;
        # trees deliver less than their bandwidth on medium ones (charged as extra bytes).
        latency_scale = byte_scale = 1.0
        if choice.algorithm == "ring" and ring_plateau_applies(
                model.op, choice.protocol, self._communicator(model.ranks).shape, model.nbytes,
                const):
            latency_scale = const.ring_plateau
        if choice.algorithm == "tree":
            byte_scale = 1.0 / const.tree_factor(choice.protocol, model.nbytes)
        latency = int(round(choice.latency_ns * latency_scale))
        c = _Collective(handle, spec, start, choice.algorithm, choice.protocol,
                        len(choice.groups), choice.transfers,
                        latency)
        self._collectives[handle] = c
        key = _content_key(model, choice)
        fid, flows, total = self._next_fid, c.flows, model.nbytes
        for i, g in enumerate(choice.groups):  # a loop per flow: an all-to-all over 64 ranks has 63 (one per round), 4,032 if every transfer differs
            nbytes = g.fixed_bytes if g.fixed_bytes is not None else g.fraction * total * byte_scale
            if nbytes <= 0:
                continue
            flow_latency = (g.latency_ns if latency_scale == 1.0 and type(g.latency_ns) is int
                            else int(round(g.latency_ns * latency_scale)))
            flows.append(Flow(fid, (start, key, i), handle, start, float(nbytes), flow_latency, g.links, g.coefs,
                              g.cap, g.members, g.link_list, g.loads))
            fid += 1
        self._next_fid = fid
        self.flows_submitted += len(c.flows)
        self.transfers_submitted += c.transfers
        if not c.flows:  # nothing to move: only the latency
            c.end = start + latency
        return c

    @_timed
    def finish_time(self, handle: int) -> int | None:
        """Completion time (ns) of a collective. Optimistic: simulates as far as needed.
        Conservative: None until no submission allowed by the horizon can change it."""
        c = self._get(handle)
        if handle in self._unsettled:  # the end told before a rollback undid it: corrected first
            self._correct(c)
            return c.reported
        end = self._end(c)
        if end is not None:
            c.reported = end
        return end

    @_timed
    def provisional_end(self, handle: int) -> int | None:
        """finish_time without reporting it: a later correction to this value is not a
        correction to an answer the caller used (take_corrections leaves it out)."""
        return self._end(self._get(handle))

    @_timed
    def end_by(self, handle: int, t_ns: int) -> int | None:
        """The collective's end if it is at or before t_ns, else None, simulating only the events
        of its island before t_ns: where no submission can start before t_ns (the engine's proven
        horizon), nothing simulated for this answer is ever rolled back, where provisional_end
        would have simulated as far as the collective runs. (A flow that drains exactly at t_ns
        gives None.)"""
        c = self._get(handle)
        if c.end is None:
            sim = self._sim
            for f in c.flows:
                if f.state != DONE:
                    sim.run_before(sim.island_of(f), int(t_ns))
                    if f.state != DONE:
                        return None
        end = self._end(c)  # every flow done: nothing more to simulate
        return end if end is not None and end <= t_ns else None

    def known_end(self, handle: int) -> int | None:
        """The collective's end if the network has simulated it to its last byte, else None;
        nothing is simulated for the answer."""
        c = self._get(handle)
        return self._end(c) if self._simulated_to_end(c) else None

    def advance_horizon(self, t_ns: int) -> None:
        """Promise: no future submit() starts before t_ns."""
        self._horizon = max(self._horizon, int(t_ns))

    @_timed
    def run_before(self, t_ns: int) -> None:
        """Simulate every event before t_ns (what link_utilization reads up to t_ns is then
        settled unless a submission starts before t_ns)."""
        for island in list(self._sim.islands.values()):
            self._sim.run_before(island, int(t_ns))

    def take_corrections(self) -> list[Correction]:
        """Ends already reported that a rollback changed, as far as the network has simulated
        again: an end whose new value needs more simulation is held until a later call finds it
        simulated (by the finish_time of another collective, prune) or settle() simulates it."""
        self._settle(force=False)
        out, self._corrections = self._corrections, []
        return out

    @_timed
    def settle(self) -> None:
        """Simulate as far as every reported end that a rollback undid needs: take_corrections
        then holds all of them (the run is over, or the caller needs them now)."""
        self._settle(force=True)

    def _settle(self, force: bool) -> None:
        if not self._unsettled:
            return
        for h in sorted(self._unsettled):  # prune corrects an undone end before it forgets it
            c = self._collectives[h]
            if force or self._simulated_to_end(c):
                self._correct(c)

    @staticmethod
    def _simulated_to_end(c: "_Collective") -> bool:
        """Whether its end is known without simulating any further."""
        return c.end is not None or all(f.state == DONE for f in c.flows)

    def _correct(self, c: "_Collective") -> None:
        """An undone end simulated again: its correction, if it changed."""
        self._unsettled.discard(c.handle)
        new = self._end(c)
        if new != c.reported:
            self._corrections.append(Correction(c.handle, c.spec.label, c.reported, new))
            c.reported = new

    def take_rollbacks(self) -> list[RollbackRecord]:
        out, self._rollbacks = self._rollbacks, []
        return out

    @_timed
    def prune(self, horizon_ns: int) -> list[CollectiveInfo]:
        """Every participant's clock is past horizon_ns (so is every future start): simulate
        up to it, forget history before it, and retire the collectives that finished before
        it. Returns their final CollectiveInfo (with flows if config.record_flows); their
        handles are unknown afterwards."""
        self.advance_horizon(horizon_ns)
        h = self._horizon
        sim = self._sim
        self.run_before(h)
        retired = []
        for handle in sorted(self._collectives):
            c = self._collectives[handle]
            if all(f.state == DONE and f.done_t < h for f in c.flows):
                end = self._end(c)
                if end is not None and end <= h:
                    if handle in self._unsettled:  # its correction, before it is forgotten
                        self._correct(c)
                    retired.append(self._info(c, end, self.config.record_flows))
                    for f in c.flows:
                        sim.remove(f)
                    del self._collectives[handle]
                    continue
            early = [f for f in c.flows if f.state == DONE and f.done_t < h]
            if len(early) < len(c.flows):
                for f in early:
                    if self.config.record_flows:
                        c.pruned_records.extend(self._flow_records(c, [f]))
                    c.pruned_end = max(c.pruned_end, f.end_ns())
                    sim.remove(f)
                c.flows = [f for f in c.flows if not (f.state == DONE and f.done_t < h)]
        prune_history(sim, h)
        return retired

    # ---- information for the trace -----------------------------------------------------------

    @_timed
    def collective_info(self, handle: int) -> CollectiveInfo:
        """Algorithm, protocol, channels, bandwidths of a live collective (end_ns -1 while
        unknown in conservative mode)."""
        c = self._get(handle)
        return self._info(c, self._end(c), False)

    def flow_records(self, handle: int) -> list[FlowRecord]:
        c = self._get(handle)
        self._end(c)
        return c.pruned_records + self._flow_records(c, c.flows)

    def links(self) -> list[LinkInfo]:
        return self.topology.link_infos()

    @_timed
    def link_utilization(self, start_ns: int, end_ns: int,
                         links: list[int] | None = None) -> list[LinkSegment]:
        """Load on each link as piecewise-constant segments within [start_ns, end_ns), from
        the history still held (call before prune() forgets it). Segments of flows still
        running extend to their currently projected end."""
        wanted = None
        if links is not None:  # skip flows that touch none of them (with mirrored ranks, most)
            wanted = np.zeros(len(self.topology.capacity), dtype=bool)
            wanted[np.asarray(links, dtype=np.int64)] = True
        # flows of one routed group share their links: each group's wanted links and their
        # coefficients are picked once (None: it touches none of them)
        picked: dict[int, tuple[np.ndarray, np.ndarray] | None] = {}
        p_links, p_coefs, p_rates, p_t0, p_t1, p_count = [], [], [], [], [], []
        flows = self._sim.flows
        for fid in sorted(flows):
            f = flows[fid]
            if f.state == PENDING:
                continue
            all_links, all_coefs = f.loads
            key = id(all_links)
            sub = picked.get(key, False)
            if sub is False:
                if wanted is None:
                    sub = (all_links, all_coefs)
                else:
                    sel = wanted[all_links]
                    sub = (all_links[sel], all_coefs[sel]) if sel.any() else None
                picked[key] = sub
            if sub is None:
                continue
            seg_t, seg_rate = f.seg_t, f.seg_rate
            n = len(seg_t)
            if f.state == DONE:
                last_end = f.done_t
            else:
                drain = f.projected_drain()
                last_end = end_ns if drain is None else drain
            rates, t0s, t1s = [], [], []
            for k in range(n):
                t1 = seg_t[k + 1] if k + 1 < n else last_end
                lo, hi = max(seg_t[k], start_ns), min(t1, end_ns)
                if lo >= hi or seg_rate[k] <= 0:
                    continue
                rates.append(seg_rate[k])
                t0s.append(lo)
                t1s.append(hi)
            if rates:
                p_links.append(np.tile(sub[0], len(rates)))
                p_coefs.append(np.tile(sub[1], len(rates)))
                p_rates.extend(rates)
                p_t0.extend(t0s)
                p_t1.extend(t1s)
                p_count.extend([len(sub[0])] * len(rates))
        if not p_links:
            return []
        link = np.concatenate(p_links)
        counts = np.asarray(p_count)
        load = np.concatenate(p_coefs) * np.repeat(np.asarray(p_rates, dtype=np.float64), counts)
        t0, t1 = np.repeat(np.asarray(p_t0), counts), np.repeat(np.asarray(p_t1), counts)
        # Loads are summed in integer units (_LOAD_UNITS per GB/s): every + cancels its - exactly,
        # so a level does not depend on which other segments were summed before it (on how
        # the history was cut into windows).
        quanta = np.rint(load * _LOAD_UNITS).astype(np.int64)
        ev_link = np.concatenate([link, link])
        ev_time = np.concatenate([t0, t1])
        ev_delta = np.concatenate([quanta, -quanta])
        order = np.lexsort((ev_time, ev_link))
        ev_link, ev_time, ev_delta = ev_link[order], ev_time[order], ev_delta[order]
        level = np.cumsum(ev_delta)  # every + has its -, so the sum restarts at 0 per link
        at = np.flatnonzero((ev_link[:-1] == ev_link[1:]) & (ev_time[:-1] < ev_time[1:]) & (level[:-1] > 0))
        cap = self.topology.capacity
        gbps = level[at] / _LOAD_UNITS
        share = gbps / cap[ev_link[at]]
        return [LinkSegment(lk, t_a, t_b, g, u) for lk, t_a, t_b, g, u in
                zip(ev_link[at].tolist(), ev_time[at].tolist(), ev_time[at + 1].tolist(),
                    gbps.tolist(), share.tolist())]

    def stats(self) -> NetworkStats:
        sim = self._sim
        return NetworkStats(
            live_collectives=len(self._collectives),
            live_flows=len(sim.flows),
            history_segments=sum(len(f.seg_t) for f in sim.flows.values()),
            islands=len(sim.islands),
            route_cache_entries=len(self._plans),
            event_batches=sim.batches,
            rollbacks=self._rollback_count,
        )

    @property
    def live_flows(self) -> int:
        """Flows the network holds (submitted, not yet forgotten by prune)."""
        return len(self._sim.flows)

    @property
    def rollback_count(self) -> int:
        return self._rollback_count

    @property
    def event_batches(self) -> int:
        """Event batches the flow simulator processed so far, re-simulation included: a cheap
        measure of progress, read from another thread (the server's keepalives)."""
        return self._sim.batches

    # ---- internals ------------------------------------------------------------------------

    def _get(self, handle: int) -> _Collective:
        try:
            return self._collectives[handle]
        except KeyError:
            if 0 <= handle < self._next_handle:
                raise KeyError(f"collective {handle} was retired by prune()") from None
            raise KeyError(f"no collective {handle}") from None

    def _end(self, c: _Collective) -> int | None:
        if c.end is not None:
            return c.end
        sim = self._sim
        if self.config.mode == "optimistic":
            for f in c.flows:
                sim.run_until_done(f)
        else:
            ends = [c.pruned_end]
            for f in c.flows:
                if f.state != DONE:
                    sim.run_before(sim.island_of(f), self._horizon)
                if f.state == DONE:
                    ends.append(f.end_ns())
                    continue
                drain = f.projected_drain() if f.state == ACTIVE else None
                if drain is None or drain > self._horizon:
                    return None  # a submission at the horizon could still slow it down
                ends.append(drain + f.latency_ns)
            if any(f.state != DONE for f in c.flows):
                return max(ends)
        c.end = max([c.pruned_end] + [f.end_ns() for f in c.flows])
        return c.end

    def _roll_back(self, late: list[_Collective], island) -> None:
        """Late newcomers of one island: rewind what they can change (rollback.py) to the
        earliest one's start, and correct the ends already reported."""
        first = min(late, key=lambda c: (c.start, c.handle))
        scope = rollback_scope(self._sim, [f for c in late for f in c.flows], first.start)
        affected = roll_back(self._sim, scope, first.start)
        if not affected:
            return  # nothing had simulated past the newcomers' start on their links
        network_time = max(i.processed_until for i in self._sim.islands.values())
        from_ns = island.processed_until
        handles = sorted({f.handle for f in affected})
        for h in handles:
            c = self._collectives[h]
            c.end = None
            if c.reported is not None:
                # its new end is found when the network simulates that far anyway: a later
                # arrival may undo it again before anyone needs it (take_corrections, settle)
                self._unsettled.add(h)
        self._rollbacks.append(RollbackRecord(
            seq=self._rollback_count, handle=first.handle, label=first.spec.label,
            network_time_ns=network_time, from_ns=from_ns, to_ns=first.start,
            flows_rolled_back=len(affected), undone=tuple(h for h in handles if h in self._unsettled)))
        self._rollback_count += 1

    def _validated(self, spec: CollectiveSpec) -> CollectiveSpec:
        if not isinstance(spec, CollectiveSpec):
            raise TypeError(f"expected a CollectiveSpec, got {type(spec).__name__}")
        if spec.op not in OPS:
            raise ValueError(f"op: {spec.op!r} is not allowed (allowed: {', '.join(OPS)})")
        if spec.transport not in TRANSPORTS:
            raise ValueError(f"transport: {spec.transport!r} is not allowed (allowed: {', '.join(TRANSPORTS)})")
        if isinstance(spec.nbytes, bool) or not isinstance(spec.nbytes, (int, np.integer)) \
                or spec.nbytes < 0:
            raise ValueError(f"nbytes: must be an integer >= 0, got {spec.nbytes!r}")
        ranks = spec.ranks
        if type(ranks) is not tuple or not all(type(r) is int for r in ranks):
            ranks = tuple(int(r) for r in ranks)
        n = self.topology.num_gpus
        if not ranks:
            raise ValueError("ranks: empty")
        if min(ranks) < 0 or max(ranks) >= n:
            bad = [r for r in ranks if not 0 <= r < n]
            raise ValueError(f"ranks: GPU {bad[0]} does not exist (cluster has GPUs 0..{n - 1})")
        if len(set(ranks)) != len(ranks):
            raise ValueError(f"ranks: a GPU appears twice in {ranks}")
        root = spec.root
        if spec.op in ("broadcast", "reduce"):
            if root is None or root not in ranks:
                raise ValueError(f"root: {spec.op} needs a root among ranks, got {root!r}")
        if spec.op == "send_recv" and len(ranks) != 2:
            raise ValueError(f"ranks: send_recv takes (sender, receiver), got {ranks}")
        split = spec.split_bytes
        if split is not None:
            if spec.op != "all_to_all":
                raise ValueError("split_bytes: only for all_to_all")
            split = tuple(tuple(int(x) for x in row) for row in split)
            if len(split) != len(ranks) or any(len(row) != len(ranks) for row in split) \
                    or any(x < 0 for row in split for x in row):
                raise ValueError(f"split_bytes: must be a {len(ranks)}x{len(ranks)} matrix of "
                                 "byte counts >= 0")
        if ranks is spec.ranks and type(spec.nbytes) is int and split is None:
            return spec  # already plain ints: the engine's specs are
        return replace(spec, ranks=ranks, nbytes=int(spec.nbytes), split_bytes=split)

    def _choose(self, spec: CollectiveSpec) -> _Choice:
        """Algorithm and protocol, the way NCCL picks them: the smallest time NCCL's own model
        predicts (tuning.predicted_time_us); a userbuffers transfer is not NCCL's."""
        if spec.transport == USERBUFFERS:
            return self._routed(spec, USERBUFFERS, "Simple")
        if spec.op in ("send_recv", "all_to_all"):
            return self._routed(spec, P2P, "")
        # A run repeats the same collectives every step, and mirrored ranks repeat each one on
        # their own groups: the choice depends on nothing else than this key.
        chosen_key = (spec.op, spec.ranks, spec.nbytes)
        best = self._chosen.get(chosen_key)
        if best is not None:
            return self._routed(spec, *best)
        comm = self._communicator(spec.ranks)
        key = (spec.op, spec.ranks)
        candidates = self._candidates.get(key)
        if candidates is None:
            candidates = self._candidates[key] = self._candidate_list(spec.op, comm)
            if len(self._candidates) > _CACHE_SIZE:
                self._candidates.popitem(last=False)
        const = self.config.constants
        cc = self.cluster.gpu_spec.capability[0]
        best, best_time = None, None
        for algorithm, protocol in candidates:
            latency = self._latency_us(spec.op, algorithm, protocol, comm)
            t = predicted_time_us(spec.op, algorithm, protocol, comm.shape, spec.nbytes,
                                  latency, const, cc)
            if best_time is None or t < best_time:
                best, best_time = (algorithm, protocol), t
        self._chosen[chosen_key] = best
        if len(self._chosen) > _CHOSEN_SIZE:
            self._chosen.popitem(last=False)
        return self._routed(spec, *best)

    def _communicator(self, ranks: tuple[int, ...]) -> coll.Communicator:
        comm = self._communicators.get(ranks)
        if comm is None:
            comm = self._communicators[ranks] = coll.communicator(ranks, self.topology)
            if len(self._communicators) > _CACHE_SIZE:
                self._communicators.popitem(last=False)
        return comm

    def _latency_us(self, op: str, algorithm: str, protocol: str, comm: coll.Communicator) -> float:
        return collective_latency_us(op, algorithm, protocol, comm.shape, self.config.constants,
                                     comm.intra_hop_ns / 1e3, comm.inter_hop_ns / 1e3)

    def _candidate_list(self, op: str, comm: coll.Communicator) -> list[tuple[str, str]]:
        nvswitch = self.topology.nvswitch
        nodes, nvls = comm.shape.n_nodes, self.cluster.node.nvls
        algos = self._algorithms.allowed(op, runnable_algorithms(op, nodes, comm.min_ppn, nvls))
        if self._algorithms.text is None or not algos:
            algos = default_algorithms(op, nodes, comm.min_ppn, nvls)
        pairs = [(a, p) for a in algos
                 for p in self._protocols.allowed(op, runnable_protocols(a, nvswitch))]
        if not pairs:  # the protocol override excludes everything: ignore it, like NCCL
            pairs = [(a, p) for a in algos for p in runnable_protocols(a, nvswitch)]
        return pairs

    def _routed(self, spec: CollectiveSpec, algorithm: str, protocol: str) -> _Choice:
        if algorithm in (P2P, USERBUFFERS):
            key = (spec.op, spec.ranks, spec.nbytes, spec.split_bytes, algorithm)
        else:
            key = (spec.op, spec.ranks, spec.root, algorithm, protocol)
        choice = self._plans.get(key)
        if choice is not None:
            self._plans.move_to_end(key)
            return choice
        choice = self._plan(spec, algorithm, protocol)
        self._plans[key] = choice
        self._plan_entries += _entries(choice)
        while self._plan_entries > _CACHE_LINK_ENTRIES and len(self._plans) > 1:
            _, old = self._plans.popitem(last=False)
            self._plan_entries -= _entries(old)
        return choice

    def _plan(self, spec: CollectiveSpec, algorithm: str, protocol: str) -> _Choice:
        topo, const = self.topology, self.config.constants
        if algorithm == P2P:
            plan = coll.p2p_plan(spec, topo, const)
        elif algorithm == USERBUFFERS:
            plan = coll.userbuffers_plan(spec, topo, const)
        else:
            comm = self._communicator(spec.ranks)
            ll_cap = const.ll_max_busbw(comm.shape.n_nodes, self.cluster.gpu_spec.capability[0])
            if algorithm == "ring":
                plan = coll.ring_plan(spec, protocol, topo, const, ll_cap)
            elif algorithm == "tree":
                plan = coll.tree_plan(spec, protocol, topo, const, ll_cap)
            elif algorithm == "nvls":
                plan = coll.nvls_plan(spec, topo, const)
            else:
                plan = coll.nvls_tree_plan(spec, topo, const)
            latency_ns = int(round(self._latency_us(spec.op, algorithm, protocol, comm) * 1e3))
            for g in plan.groups:
                g.latency_ns = latency_ns
        routed = self._route_groups(plan.groups)
        latency = max((g.latency_ns for g in routed), default=0)
        return _Choice(plan.algorithm, plan.protocol, routed, latency, sum(len(g.members[0]) for g in routed))

    def _route_groups(self, groups: list[coll.FlowGroup]) -> list[_RoutedGroup]:
        """Route every transfer of every group at once, and fold each group's routes into
        one load coefficient per link."""
        if not groups:
            return []
        topo = self.topology
        sizes = np.array([len(g.src) for g in groups])
        gid = np.repeat(np.arange(len(groups)), sizes)
        src = np.concatenate([g.src for g in groups])
        dst = np.concatenate([g.dst for g in groups])
        salt = np.repeat(np.array([g.salt for g in groups], dtype=np.int64), sizes)
        weight = np.concatenate([g.weight for g in groups])
        member, link, share = topo.route_many(src, dst, salt, self.config.pxn)
        key = gid[member] * topo.n_links + link
        uniq, inverse = np.unique(key, return_inverse=True)
        coefs = np.bincount(inverse, weights=share * weight[member])
        group_of, link_of = uniq // topo.n_links, uniq % topo.n_links
        bounds = np.searchsorted(group_of, np.arange(len(groups) + 1))
        out = []
        scale = topo.solve_scale
        for i, g in enumerate(groups):
            a, b = bounds[i], bounds[i + 1]
            links, loads = link_of[a:b].copy(), coefs[a:b].copy()
            s = scale[links]
            keep = s > 0
            solve = links[keep]
            out.append(_RoutedGroup(links=solve, coefs=loads[keep] * s[keep],
                                    cap=g.cap, latency_ns=g.latency_ns, fraction=g.fraction,
                                    fixed_bytes=g.fixed_bytes,
                                    members=(g.src, g.dst, g.payload, g.salt), link_list=solve.tolist(),
                                    loads=(links, loads)))
        return out

    def _flow_records(self, c: _Collective, flows: list[Flow]) -> list[FlowRecord]:
        out = []
        for f in flows:
            src, dst, payload, salt = f.members
            member, link, _ = self.topology.route_many(src, dst, salt, self.config.pxn)
            order = np.argsort(member, kind="stable")
            bounds = np.searchsorted(member[order], np.arange(len(src) + 1))
            end = f.end_ns() if f.state == DONE else -1
            for i in range(len(src)):
                links = tuple(int(x) for x in link[order[bounds[i]:bounds[i + 1]]])
                out.append(FlowRecord(c.handle, int(src[i]), int(dst[i]),
                                      int(round(f.nbytes * payload[i])), c.start, end, links))
        return out

    def _info(self, c: _Collective, end: int | None, with_flows: bool) -> CollectiveInfo:
        n = len(c.spec.ranks)
        duration = (end - c.start) if end is not None else 0
        nbytes = 4 if c.spec.op == "barrier" else c.spec.nbytes
        algbw = nbytes / duration if duration > 0 else 0.0
        flows = None
        if with_flows:
            flows = tuple(c.pruned_records + self._flow_records(c, c.flows))
        return CollectiveInfo(
            handle=c.handle, label=c.spec.label, op=c.spec.op, nbytes=c.spec.nbytes,
            n_ranks=n, algorithm=c.algorithm, protocol=c.protocol, channels=c.channels,
            transfers=c.transfers, start_ns=c.start, end_ns=end if end is not None else -1,
            latency_ns=c.latency_ns, algbw=algbw, busbw=algbw * coll.bus_factor(c.spec.op, n),
            flows=flows)


def _entries(choice: _Choice) -> int:
    return sum(len(g.links) + len(g.loads[0]) for g in choice.groups)


def _content_key(spec: CollectiveSpec, choice: _Choice) -> tuple:
    """What a collective's flows are made of, for the canonical flow order: two collectives
    with equal keys (and starts) have identical flows, so their relative order is moot."""
    return (spec.op, spec.nbytes, spec.ranks, spec.root if spec.root is not None else -1,
            spec.split_bytes or (), choice.algorithm, choice.protocol)
