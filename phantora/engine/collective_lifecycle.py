"""A collective's life in the engine, from each member's call to its end on every member's stream.

1. join: a rank calls it (`join`); it gets its work id at once and runs ahead, as with NCCL. Its
   call is matched with the other members' (collectives.py) and queued on the rank's
   communication stream as an Arrive (placement.py places it).
2. reached: a member's communication stream reaches it (its ready time). When every member's
   has, it is submitted to the network, starting when the last one is ready.
3. read: its end is read from the network once it is final (no collective submitted later can
   start before it: `final_ns`, proven by finality.py), or earlier when a host must wait for it
   (`end(work, force=True)`, counted in `early_reads`). Reading places its NCCL kernel on every
   member's stream and writes them to the trace.
4. failures: a collective some member never joins (it exited, or the timeout passed) is dropped:
   the waiting members fail, and waits on it are no-ops.

A network rollback can change an end after it was read: such a correction is written to the
trace and counted as a stale reply (what was placed from the old end stays).

The network forgets its history before `final_ns` as the run goes (`prune_network`): flows that
ended before it no longer tie islands together, so a late arrival rolls back only the flows it
shares links with since then (not every flow since the start of the run, once one collective over
all GPUs tied everything together), and the network's memory is bounded by what is not final yet.

Placement (placement.py) is the stage before this one: it imports this module, places each
member's arrival and hands it on (`reached`). Two calls go back to it, through the
`ArrivalQueue` port the Engine passes in (this module never imports placement): a join queues
its arrival on the caller's streams (a collective call is a host record; its GPU side is placed
like any other work), and an end read before it is final places its members' arrivals first.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from phantora.cost.host import HOST_COSTS
from phantora.cost.startup import NCCL_COMM_INIT, nccl_init_ns
from phantora.engine.collectives import (CollectiveCall, CollectiveMatcher, CollectiveMismatch, PendingCollective,
                                         split_matrix)
from phantora.engine.comm_log import CommLog
from phantora.engine.deferred import Action, Arrive
from phantora.engine.graphs import CapturedGraph
from phantora.engine.mirrors import Mirrors
from phantora.engine.ranks import CallError, RankState
from phantora.engine.startup import pay_once
from phantora.engine.timeline import Stream
from phantora.engine.trace_events import TraceEvents, nccl_kernel_name
from phantora.net.network import Network
from phantora.net.records import CollectiveInfo, CollectiveSpec


class ArrivalQueue(Protocol):
    """Placement (placement.Placement), as the collective lifecycle calls back into it: where a
    join queues its arrival, and how a forced end places the arrivals it needs."""

    def stream(self, st: RankState, device: int, stream_id: int) -> Stream: ...

    def next_seq(self) -> int: ...

    def enqueue(self, st: RankState, action: Action) -> None: ...

    def place_stream(self, st: RankState, stream: Stream, upto: Action | None, force: bool) -> bool: ...


@dataclass
class SubmittedCollective:
    """A collective every member joined, whose end has not been read yet."""

    pending: PendingCollective
    start_ns: int  # when its last member's communication stream reaches it
    handle: int | None  # in the network; None: a single GPU (or no network), it ends at its start


class CollectiveLifecycle:
    def __init__(self, ranks: dict[int, RankState], network: Network | None, trace: TraceEvents,
                 placement: ArrivalQueue) -> None:
        self.ranks = ranks
        self.network = network
        self.gpus_per_node = network.cluster.gpus_per_node if network is not None else 8
        self.trace = trace
        self.placement = placement
        self.matcher = CollectiveMatcher()
        self.final_ns = 0  # proven: no collective submitted from now on starts before this (finality.py)
        self.work_end_ns: dict[int, int] = {}  # collective work id -> completion time
        self.unresolved_works: set[int] = set()  # joined by some members, not all
        self.joined: dict[int, PendingCollective] = {}  # work -> joined, not submitted yet
        self.arrivals: dict[tuple[int, int], Arrive] = {}  # (work, rank) -> that member's call, until placed
        self.unread: dict[int, SubmittedCollective] = {}  # work id -> all joined, end not read yet
        self.dropped: set[int] = set()  # collectives that never ran (a member never joined)
        self.network_failed = False  # the network raised: from then on collectives never run
        self._handle_works: dict[int, int] = {}  # network handle -> work id (names corrections)
        self._retired: dict[int, CollectiveInfo] = {}  # handle -> info, of unread ones the network forgot
        self._pruned_ns = 0  # the network's history before this is forgotten (link counters written)
        self.prune_min_flows = 512  # prune once this many flows, and as many as the network held, were added
        self.prunes = 0
        self._flows_at_prune = 0  # flows submitted to the network by then
        self._live_at_prune = 0  # flows it still held then
        self.sweep_min_unread = 1024  # read_final_mirrored scans once this many are unread
        self._unread_at_sweep = 0  # unread collectives left by the last read_final_mirrored
        self._key_works: dict[Any, int] = {}  # collective key -> its work id, until it runs
        self._work_ids = 0
        # (collective key, rank) -> host begin and end of that rank's call, until the collective runs
        self._launches: dict[tuple[Any, int], tuple[int, int, CollectiveCall]] = {}
        self.comm_busy_ns = 0
        self.early_reads = 0  # ends read before they were final (a host had to wait for them)
        self.rollbacks = 0
        self.stale_replies = 0
        self.largest_stale_error_ns = 0
        self._stale_errors: dict[int, int] = {}  # work -> its final end minus the end that was used
        # Mirrored ranks (mirrors.py): they join what their representative joins, and reach it
        # when their representative's stream does.
        self.mirrors: Mirrors | None = None
        self._mirror_links: dict[tuple[int, int], list[tuple[int, int]]] = {}  # (work, rep) -> [(work, mirror)]
        self._mirror_sources: dict[tuple[int, int], tuple[int, int]] = {}  # (work, mirror) -> (work, rep)
        self._lag_waits: dict[int, list[tuple[int, int]]] = {}  # rep's work -> [(mirror, its end)] to compare
        self._mirrors_works: dict[int, list[int]] = {}  # rep's work -> its mirrors' collectives on other groups
        self._read_when_joined: set[int] = set()  # such collectives to read once their last member joins

    def handed_out(self, work: int) -> bool:
        """Is `work` a work id this engine handed out?"""
        return 0 < work <= self._work_ids

    def global_gpu(self, rank: int) -> int:
        st = self.ranks.get(rank)
        where = st.info if st is not None or self.mirrors is None else self.mirrors.ranks[rank]  # node, local_rank
        return where.node * self.gpus_per_node + where.local_rank

    def mirror_source(self, work: int, rank: int) -> tuple[int, int]:
        """(work, rank) whose arrival `rank`'s arrival at `work` follows: its representative's
        for a mirrored rank, else itself."""
        return self._mirror_sources.get((work, rank), (work, rank))

    def runs(self, rank: int) -> bool:
        """Is `rank` a rank process (not a mirrored rank)?"""
        return rank in self.ranks

    # --- join ---------------------------------------------------------------------------------
    def join(self, st: RankState, wire: dict[str, Any]) -> int:
        """One rank calls a collective: its work id, at once (the rank's communication stream
        reaches it later, see Arrive). CollectiveMismatch once the members disagree."""
        rank = st.info.rank
        try:
            call = CollectiveCall.from_wire(rank, wire)
        except (KeyError, ValueError, TypeError) as e:
            raise CallError(f"malformed collective call from rank {rank}: {e}") from None
        graph = st.graphs.capture_on(call.device, call.stream)
        if graph is not None:  # recorded into the graph; each replay joins it (join_replayed)
            return self.capture(st, call, graph)
        work = self._match(call)
        comm = self.comm_stream(st, call)
        tl = st.timeline
        if len(call.group) > 1 and call.transport == "nccl":  # ProcessGroupNCCL makes the group's communicator at its first collective
            pay_once(st, self.trace, ("nccl", call.group_name, call.group), NCCL_COMM_INIT, ns=nccl_init_ns(len(call.group)),
                     args={"group ranks": len(call.group), "op": call.op})
        launch_begin = tl.host_ns
        tl.charge_host(HOST_COSTS.collective_ns if call.transport == "nccl" else HOST_COSTS.launch_ns)
        self._launches[(call.key, rank)] = (launch_begin, tl.host_ns, call)
        self.trace.collective_call_open(st.info.trace_pid, call, launch_begin, tl.host_ns)
        current = self.placement.stream(st, call.device, call.stream)
        self._queue(st, Arrive(self.placement.next_seq(), comm, call, work, current, tl.host_ns))
        return work

    def _queue(self, st: RankState, arrive: Arrive) -> None:
        """Queue a member's arrival on its streams (placement.py reaches it in stream order)."""
        work, call = arrive.work, arrive.call
        self.arrivals[(work, call.rank)] = arrive
        if call.transport == "nccl":  # the log is what slows the kernels beside it (Placement._comm_overlap)
            st.comm_log.setdefault(call.device, CommLog()).append(arrive)
        self.placement.enqueue(st, arrive)
        if work in self._read_when_joined:  # _read_mirrors_works
            p = self.joined.get(work)
            if p is None or p.complete():  # complete, or submitted already (placing it above)
                self._read_when_joined.discard(work)
                self.end(work, force=True)

    def _match(self, call: CollectiveCall) -> int:
        """Match `call`, and the calls of the ranks mirrored from its rank (mirrors.py), with the
        other members'; its work id. CollectiveMismatch once the members disagree, RolesRefuted
        or RanksDiverged when the ranks turn out not to be alike."""
        mirrored = []
        if self.mirrors is not None:
            mirrored = self.mirrors.calls_for(call)  # RolesRefuted
            self.mirrors.check_witness(call)  # RolesRefuted, RanksDiverged
        try:
            p = self.matcher.join(call)
            work = self._work_for(call.key, p)  # before its mirrors' joins, which may complete it
            links = [(self._work_for(mc.key, self.matcher.join(mc)), mc.rank) for mc in mirrored]
        except CollectiveMismatch as e:
            for key in {call.key, *(mc.key for mc in mirrored)}:
                dropped = self._key_works.pop(key, None)
                if dropped is not None:  # the members that joined never get to run it
                    self.dropped.add(dropped)
                    self.joined.pop(dropped, None)
                    self.unresolved_works.discard(dropped)
            e.ranks = tuple(r for r in e.ranks if r in self.ranks)  # mirrored ranks have no process to fail
            raise
        if links:
            self._mirror_links[(work, call.rank)] = links
            for w, m in links:
                self._mirror_sources[(w, m)] = (work, call.rank)
            others = [w for w, _ in links if w != work]
            if others:
                self._mirrors_works.setdefault(work, []).extend(others)
        return work

    def _work_for(self, key: Any, p: PendingCollective) -> int:
        """The work id of the collective `key` (a new one for its first member)."""
        work = self._key_works.get(key)
        if work is None:
            self._work_ids += 1
            work = self._key_works[key] = self._work_ids
            self.unresolved_works.add(work)
            self.joined[work] = p
        if p.complete():  # every member has joined
            self._key_works.pop(key, None)
            self.unresolved_works.discard(work)
        return work

    # --- CUDA graphs (graphs.py) -------------------------------------------------------------
    def capture(self, st: RankState, call: CollectiveCall, graph: CapturedGraph) -> int:
        """A collective called while its stream captures `graph`: recorded, not run. The call
        costs the host what an eager one does; the work id (< 0) names the captured node."""
        tl = st.timeline
        begin = tl.host_ns
        tl.charge_host(HOST_COSTS.collective_ns)
        work = st.graphs.capture_collective(graph, call)
        self.trace.host_slice(st.info.trace_pid, f"nccl:{call.op}", begin, tl.host_ns, "cpu_op",
                              {"captured into CUDA graph": graph.graph_id, "stream": call.stream,
                               "group ranks": list(call.group), "call site": call.site})
        return work

    def join_replayed(self, st: RankState, call: CollectiveCall, current: Stream, host_ns: int) -> int:
        """A replay of a CUDA graph launches a captured collective again: `call` carries the
        sequence number the rank's process group gave it at the replay, so it is matched across
        ranks as an eager call is. It runs on its communication stream after the work queued on
        the replay stream (`current`) before it; the replay's one launch (at `host_ns`) is the
        only host cost. Its work id; CollectiveMismatch once the members disagree."""
        work = self._match(call)
        self._queue(st, Arrive(self.placement.next_seq(), self.comm_stream(st, call), call, work, current, host_ns))
        return work

    def comm_stream(self, st: RankState, call: CollectiveCall) -> Stream:
        """The communication stream `call` runs on (one per device and communicator)."""
        # Send and receive of a pair get a stream each: NCCL runs a batch_isend_irecv group's
        # send and receive to one peer concurrently.
        key = (call.device, call.group_name, call.group, call.net_op == "send_recv")
        sid = st.comm_streams.get(key)
        if sid is None:
            sid = st.comm_streams[key] = -1 - len(st.comm_streams)
        stream, new = st.timeline.stream(call.device, sid)
        if new:
            what = "p2p " + "->".join(map(str, call.group)) if call.net_op == "send_recv" else f"group {list(call.group)}"
            if any(k[0] == call.device and k[2:] == key[2:] and k != key for k in st.comm_streams):
                what += f" (process group {call.group_name!r})"  # another group has the same ranks
            self.trace.comm_track(st.info.trace_pid, stream, what)
        return stream

    # --- reached, submitted -------------------------------------------------------------------
    def reached(self, rank: int, a: Arrive) -> None:
        """Member `rank`'s communication stream reached the collective (a.ready_ns is set): it
        is in flight there until its end is read; submitted once every member's is."""
        self.arrivals.pop((a.work, rank), None)
        p = self.joined.get(a.work)
        if p is None:  # dropped
            return
        a.stream.inflight = a.work
        p.ready_ns[rank] = a.ready_ns  # type: ignore[assignment]
        ready = []
        for w, m in self._mirror_links.pop((a.work, rank), ()):  # its mirrored ranks reach theirs with it
            pm = self.joined.get(w)
            if pm is not None:
                pm.ready_ns[m] = a.ready_ns  # type: ignore[assignment]
                if w != a.work and self._all_ready(pm):
                    ready.append((w, pm))
        if self._all_ready(p):
            ready.append((a.work, p))
        if ready:
            self._submit(ready)

    @staticmethod
    def _all_ready(p: PendingCollective) -> bool:
        return p.complete() and len(p.ready_ns) == len(p.members)

    def _submit(self, ready: list[tuple[int, PendingCollective]]) -> None:
        """Every member's stream has reached these collectives: hand them to the network, in one
        submission (the collectives of a representative's mirrored ranks start together: one
        rollback, not one each); each end is read later (`read`), when it is final or a host
        must wait for it."""
        if self.network_failed:
            for work, p in ready:
                self._never_ran(work, p)
            return
        specs, on_network = [], []
        for work, p in ready:
            first = p.arrivals[p.members[0]]
            start = max(p.ready_ns.values())
            gpus = tuple(self.global_gpu(r) for r in p.members)
            self.unread[work] = SubmittedCollective(p, start, None)
            if self.network is not None and len(set(gpus)) > 1:
                split = split_matrix([p.arrivals[r] for r in p.members]) if first.op == "all_to_all" else None
                specs.append((CollectiveSpec(first.net_op, max(first.nbytes, 1), gpus,
                                             root=self.global_gpu(first.root) if first.root is not None else None,
                                             label=f"{first.op} group {list(first.group)} #{first.seq}",
                                             split_bytes=split, transport=first.transport), start))
                on_network.append(work)
        if specs:
            assert self.network is not None
            for work, handle in zip(on_network, self.network.submit_many(specs)):
                self.unread[work].handle = handle
                self._handle_works[handle] = work
            self._record_corrections()  # a rollback can change ends already read
        for work, _ in ready:
            del self.joined[work]  # only now: if the network raised, give_up() still finds it

    # --- ends ---------------------------------------------------------------------------------
    def end(self, work: int, force: bool) -> int | None:
        """The end of collective `work`, read from the network if it is final (or `force`);
        None if it cannot be read yet. 0 for a collective that never ran."""
        end = self.work_end_ns.get(work)
        if end is not None:
            return end
        if work in self.dropped:
            return 0
        if work not in self.unread and not (force and self._force_arrivals(work)):
            return None
        sub = self.unread.get(work)
        if sub is None:
            return self.work_end_ns.get(work)
        if sub.handle is not None and not self._is_final(sub):
            if not force:
                return None
            self.early_reads += 1
        mirrors_works = self._mirrors_works.pop(work, None)
        self.read(work)
        if force and mirrors_works:
            self._read_mirrors_works(mirrors_works)
        return self.work_end_ns[work]

    def _read_mirrors_works(self, works: list[int]) -> None:
        """A representative's collective was read because a host waited for it (here or down a
        chain of waits): its mirrored ranks wait for theirs at the same point, so theirs are
        read too. One with a rank process among its members (the witness of --ranks auto, whose
        peers are mirrored) places that process's streams up to it. Without this only the
        finality horizon moved them, and a pipeline's hosts outrun it by seconds: a witness's
        collectives reached the network in one late burst, each a rollback of every flow on
        its links since (a Megatron-LM run of TP 4 x PP 8 at 64 GPUs)."""
        for w in works:
            p = self.joined.get(w)
            if p is not None and not p.complete():
                self._read_when_joined.add(w)  # the witness has not called it yet
                continue
            sub = self.unread.get(w)
            members = p.members if p is not None else sub.pending.members if sub is not None else ()
            if any(r in self.ranks for r in members):  # a collective of mirrored ranks only is read as it comes
                self.end(w, force=True)

    def clipped_end(self, work: int, t: int, force: bool) -> int | None:
        """min(end of `work`, t): known once the end is, or once nothing can start before t."""
        end = self.work_end_ns.get(work)
        if end is not None:
            return min(end, t)
        if work in self.dropped:
            return 0
        if t <= self.final_ns and not force:
            sub = self.unread.get(work)
            if sub is None or sub.handle is None:  # submitted later, so it starts (and ends) after t
                return t if sub is None else min(sub.start_ns, t)
            if self.provisional_end(sub) > t:  # type: ignore[operator]
                return t  # the network up to t is final: it still runs at t
        end = self.end(work, force)
        return None if end is None else min(end, t)

    def provisional_end(self, sub: SubmittedCollective) -> int | None:
        """Its end as the network has it now (a later submission may still move it)."""
        assert self.network is not None and sub.handle is not None
        retired = self._retired.get(sub.handle)
        return retired.end_ns if retired is not None else self.network.provisional_end(sub.handle)

    def end_hint(self, sub: SubmittedCollective) -> int | None:
        """When a collective that is not final yet may be: its end where the network has
        simulated that far, else just after the proven horizon (it ends later); nothing is
        simulated for it in optimistic mode (see _is_final)."""
        assert self.network is not None and sub.handle is not None
        retired = self._retired.get(sub.handle)
        if retired is not None:
            return retired.end_ns
        if self.network.config.mode != "optimistic":  # it never simulates past its horizon
            return self.network.provisional_end(sub.handle)
        end = self.network.known_end(sub.handle)
        return max(self.final_ns + 1, end if end is not None else 0)

    def _is_final(self, sub: SubmittedCollective) -> bool:
        """Its end is at or before the proven horizon: no later submission can move it. Asked of
        the network up to that horizon only (`end_by`), so nothing it simulates for this is ever
        rolled back."""
        assert self.network is not None and sub.handle is not None
        retired = self._retired.get(sub.handle)
        if retired is not None:
            return retired.end_ns <= self.final_ns
        if self.network.config.mode != "optimistic":
            end = self.network.provisional_end(sub.handle)
            return end is not None and end <= self.final_ns
        return self.network.end_by(sub.handle, self.final_ns) is not None

    def _force_arrivals(self, work: int) -> bool:
        """Place every member's arrival at `work` (reading ends early); False if some member
        has not joined it."""
        p = self.joined.get(work)
        if p is None or not p.complete():
            return False
        for r in p.members:
            w, source = self._mirror_sources.get((work, r), (work, r))  # a mirrored rank: its representative's
            a = self.arrivals.get((w, source))
            if a is not None and not self.placement.place_stream(self.ranks[source], a.stream, a, True):
                return False
        return work in self.unread or work in self.work_end_ns

    def read(self, work: int) -> None:
        """Read a submitted collective's end from the network and place it: the NCCL kernel on
        each member's communication stream, the stream tails, the trace. No-op if already read."""
        sub = self.unread.get(work)
        if sub is None:
            return
        p, start = sub.pending, sub.start_ns
        calls = [p.arrivals[r] for r in p.members]
        first = calls[0]
        info = None
        if sub.handle is not None:
            assert self.network is not None
            info = self._retired.pop(sub.handle, None)
            if info is None:
                end = self.network.finish_time(sub.handle)
                info = self.network.collective_info(sub.handle)
                self._record_corrections()
            else:  # final before the network forgot it
                end = info.end_ns
        else:
            end = start  # one member (or no network): nothing moves
        del self.unread[work]  # only now: if the network raised, give_up() still finds it
        self.work_end_ns[work] = end
        self._mirrors_works.pop(work, None)  # read as it came: its mirrors' collectives come as theirs do
        algorithm = info.algorithm if info else "ring"
        protocol = info.protocol if info else "simple"
        name = nccl_kernel_name(first.net_op if first.op != "barrier" else "barrier", first.dtype, first.reduce_op,
                                algorithm, protocol)
        flow = self.trace.next_flow()
        places = []
        for w, end_m in self._lag_waits.pop(work, ()):  # mirrored ranks whose collective was read first
            self.mirrors.lag(w, end_m - end)  # type: ignore[union-attr]
        for call in calls:
            st = self.ranks.get(call.rank)
            if st is None:  # a mirrored rank
                self._read_mirrored(call, work, name, p.ready_ns[call.rank], start, end)
                continue
            stream = self.comm_stream(st, call)
            ready = p.ready_ns[call.rank]
            stream.tail_ns = max(stream.tail_ns, end)
            if stream.inflight == work:
                stream.inflight = None
            st.collectives += 1
            self.comm_busy_ns += end - ready
            launch = self._write_launch(st, call)
            self.trace.collective_kernel(st.info.trace_pid, stream, name, call, ready, start, end, algorithm,
                                         protocol, info.busbw if info else None, work, launch)
            places.append((st.info.trace_pid, stream.track, ready))
        if places:  # none for a collective of mirrored ranks only
            self.trace.collective_arrows(flow, f"{first.op} #{first.seq}", places)

    def _read_mirrored(self, call: CollectiveCall, work: int, name: str, ready: int, start: int, end: int) -> None:
        assert self.mirrors is not None
        self.mirrors.collective(call, name, ready, start, end, work)
        source = self._mirror_sources.pop((work, call.rank), None)
        if source is None or source[0] == work:
            return
        rep_end = self.work_end_ns.get(source[0])
        if rep_end is not None:
            self.mirrors.lag(call.rank, end - rep_end)
        else:
            self._lag_waits.setdefault(source[0], []).append((call.rank, end))

    def read_final_mirrored(self) -> None:
        """Read the final ends of collectives whose members are all mirrored ranks. No host waits
        for them, so under optimistic sync they stayed unread, with their calls and network
        records, until the run ended: at 256 ranks with Transformer Engine's userbuffers rings
        (7 messages per GEMM, each mirrored to every rank) the simulator grew by 110 MB an
        iteration. A final end does not change, so reading it now writes what the end would.
        Amortized: a scan once the unread ones doubled since the last."""
        if self.mirrors is None or len(self.unread) < max(self.sweep_min_unread, 2 * self._unread_at_sweep):
            return
        for work in [w for w, sub in self.unread.items()
                     if sub.handle is not None and not any(r in self.ranks for r in sub.pending.members)
                     and self._is_final(sub)]:
            self.read(work)
        self._unread_at_sweep = len(self.unread)

    # --- the network's history ---------------------------------------------------------------
    def prune_network(self) -> None:
        """Let the network forget its history before `final_ns` (no submission can start
        before it), once at least as many flows were added as it held after the last time (so
        each flow is pruned over a bounded number of times). The link counters of that window
        are written first: nothing can change them any more."""
        net = self.network
        if net is None or self.network_failed or self.final_ns <= self._pruned_ns:
            return
        if net.flows_submitted - self._flows_at_prune < max(self.prune_min_flows, self._live_at_prune):
            return
        if all(st.finished for st in self.ranks.values()):
            return  # the run is closing: the rest is written up to its end (write_link_counters)
        h = self.final_ns
        net.run_before(h)
        self.trace.link_counters(net, self._pruned_ns, h, self._counter_nodes())
        for info in net.prune(h):
            work = self._handle_works.pop(info.handle, None)
            if work in self.unread:
                self._retired[info.handle] = info
        self._pruned_ns = h
        self.prunes += 1
        self._flows_at_prune = net.flows_submitted
        self._live_at_prune = net.live_flows

    def write_link_counters(self, end: int) -> None:
        """The link counters of the history not written yet, up to `end` (the run is over)."""
        if self.network is not None:
            self.trace.link_counters(self.network, self._pruned_ns, end + 1, self._counter_nodes())
            self.trace.close_link_counters()

    def _counter_nodes(self) -> set[int] | None:
        """The nodes whose links get counters: all, or with mirrored ranks the representatives'."""
        return {st.info.node for st in self.ranks.values()} if self.mirrors is not None else None

    def read_all(self) -> None:
        for work in sorted(self.unread):
            self.read(work)
        if self.network is not None:  # the run is over: every end a rollback undid, simulated again
            self.network.settle()
            self._record_corrections()

    def _write_launch(self, st: RankState, call: CollectiveCall, ran: bool = True) -> int | None:
        """The host slice of `call`, written once the collective has run so that it links to its
        kernel like an aten op does; the flow id, or None for a collective that never ran."""
        span = self._launches.pop((call.key, call.rank), None)
        if span is None:
            return None
        launch = self.trace.next_flow() if ran else None
        self.trace.collective_call(st.info.trace_pid, call, span[0], span[1], launch)
        return launch

    def write_unrun_launches(self) -> None:
        """The host slices of collectives still waiting when the run ends: they never ran."""
        for (_, rank), (_, _, call) in list(self._launches.items()):
            self._write_launch(self.ranks[rank], call, ran=False)

    def _record_corrections(self) -> None:
        """Rollbacks, and completion times the network changed after the engine read them:
        written to the trace; the latter counted as stale replies (what was placed from the old
        end stays: the engine reads an end only when something needs it)."""
        net = self.network
        assert net is not None
        for rb in net.take_rollbacks():
            self.rollbacks += 1
            self.trace.rollback(rb)
        for c in net.take_corrections():
            work = self._handle_works.get(c.handle)
            used = self.work_end_ns.get(work, c.old_end_ns) if work is not None else c.old_end_ns
            error = c.new_end_ns - used  # against the end that was used, over all its corrections
            self._stale_errors[work if work is not None else -c.handle] = error
            self.trace.correction(c, work, error)
        errors = [abs(e) for e in self._stale_errors.values() if e]
        self.stale_replies = len(errors)  # replies whose end is not the final one
        self.largest_stale_error_ns = max(errors, default=0)

    # --- failures -----------------------------------------------------------------------------
    def abandon(self, rank: int) -> list[tuple[list[int], str]]:
        """`rank` ended: every collective it never joined fails for the members waiting in it."""
        failed = []
        gone = [rank, *(self.mirrors.roles.mirrors_of(rank) if self.mirrors is not None and rank in self.ranks
                        and self.mirrors.roles.runs(rank) else ())]  # its mirrored ranks end with it
        waiting_for = {id(p): p for r in gone for p in self.matcher.waiting_for(r)}
        for p in waiting_for.values():
            call = next(iter(p.arrivals.values()))
            waiting = sorted(r for r in p.arrivals if r in self.ranks)
            failed.append((waiting, f"rank {rank} exited without joining {call.describe()} (collective #{call.seq} "
                                    f"of group {list(call.group)}) that rank(s) {waiting} are waiting in"))
            self._drop(p)
        return failed

    def overdue(self, timeout_s: float) -> list[tuple[list[int], str]]:
        """Collectives some member has not joined within `timeout_s` of wall time: they fail for
        the members waiting in them."""
        failed = []
        for p in self.matcher.overdue(timeout_s):
            call = next(iter(p.arrivals.values()))
            waiting = sorted(r for r in p.arrivals if r in self.ranks)
            failed.append((waiting, f"timed out after {timeout_s:.0f} s waiting for rank(s) {p.missing()} to join "
                                    f"{call.describe()} (collective #{call.seq} of group {list(call.group)}, called at "
                                    f"{call.site}); rank(s) {waiting} joined. A rank that skips a collective, or "
                                    f"calls collectives in a different order, hangs a real job the same way."))
            self._drop(p)
        return failed

    def give_up(self) -> int:
        """The simulator failed or the run was interrupted (anything that stopped it):
        collectives whose end was not read never ran, as if dropped, so that the GPU work queued
        behind them is still placed and written when the run is closed (no kernel left out, no
        dangling flow); how many."""
        self.network_failed = True
        stuck = {work: sub.pending for work, sub in self.unread.items()}
        stuck.update((w, p) for w, p in self.joined.items() if p.complete() and w not in self.unread)
        for work, p in stuck.items():
            self._never_ran(work, p)
        return len(stuck)

    def _never_ran(self, work: int, p: PendingCollective) -> None:
        self.unread.pop(work, None)
        for call in p.arrivals.values():
            if call.rank in self.ranks:
                self._write_launch(self.ranks[call.rank], call, ran=False)
        self.unresolved_works.discard(work)
        self.dropped.add(work)
        self.joined.pop(work, None)

    def drop_unjoined(self) -> None:
        """The run is over: collectives some member never joined never run."""
        for p in list(self.matcher.pending.values()):
            self._drop(p)

    def _drop(self, p: PendingCollective) -> None:
        for call in p.arrivals.values():
            if call.rank in self.ranks:
                self._write_launch(self.ranks[call.rank], call, ran=False)
        self.matcher.drop(p.key)
        work = self._key_works.pop(p.key, None)
        if work is not None:
            self.unresolved_works.discard(work)  # waits on it become no-ops; its members are failing
            self.dropped.add(work)
            self.joined.pop(work, None)
