"""Placing a rank's GPU work on its stream timelines, lazily (phantora/engine/deferred.py).

Work is enqueued on its stream in program order and placed, in stream order, as soon as every
time it depends on is known: the stream's tail, the event it waits on, and the ends of the
collectives it depends on (a WorkWait, the next collective on a communication stream, a kernel
that NCCL kernels may slow). A collective's end is asked of the collective lifecycle
(collective_lifecycle.py, the next stage: placing a member's arrival hands it on there), which
answers only once the end is final unless `force` (a host must wait for it). Placing writes each
kernel's slice (trace_events.py).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from itertools import islice

from phantora.cost import COPY_D2H, COPY_H2D
from phantora.engine.collective_lifecycle import CollectiveLifecycle
from phantora.engine.deferred import Action, Arrive, EventRecord, EventWait, GraphReplay, OpWork, WorkWait
from phantora.engine.ranks import RankState
from phantora.engine.timeline import Stream, TimingConfig, op_span
from phantora.engine.trace_events import TraceEvents


def _union_ns(spans: list[tuple[int, int]]) -> int:
    """Total length of the union of [begin, end) spans."""
    total, reach = 0, None
    for b, e in sorted(spans):
        if reach is None or b > reach:
            total += e - b
            reach = e
        elif e > reach:
            total += e - reach
            reach = e
    return total


@dataclass
class _Why:
    """What the attempts to place streams in one top-level place_stream call waited for."""

    works: set[int] = field(default_factory=set)  # collectives whose end was asked and not known
    time_ns: int | None = None  # the earliest horizon at which an end asked for may be readable
    wanted: set[int] = field(default_factory=set)  # the times _comm_overlap wanted final
    cycle: bool = False  # the rank's streams wait on each other: tried at every call
    touched: dict[int, tuple[RankState, Stream]] = field(default_factory=dict)  # id(stream) -> stream
    failed: set[int] = field(default_factory=set)  # id() of the streams whose placement stopped short


@dataclass
class _Waiting:
    """A stream whose waiting work could not be placed, and what it waits for (`_Why`)."""

    st: RankState
    stream: Stream
    works: set[int]
    wanted: set[int]
    cycle: bool


class Placement:
    def __init__(self, timing: TimingConfig, trace: TraceEvents) -> None:
        self.timing = timing
        self.trace = trace
        # Set by the Engine once both exist: ends are read from it, and arrivals reported to it
        # (which may in turn place other ranks' streams: the two call each other at run time; the
        # lifecycle calls back through its ArrivalQueue port, without importing this module).
        self.collectives: CollectiveLifecycle
        self._seq = 0  # program order of GPU work, over all ranks
        self._placing: set[int] = set()  # id() of the streams being placed
        self.wanted: set[int] = set()  # times up to which a kernel needs the network to be final
        # Incremental retries (module docstring), by id(stream):
        self._waiting: dict[int, _Waiting] = {}
        self._on_work: dict[int, set[int]] = {}  # collective work -> streams that wait for its end
        self._on_time: list[tuple[int, int, int]] = []  # heap of (horizon, seq, stream) to try again at
        self._retry: dict[int, tuple[RankState, Stream]] = {}  # streams to try at the next call
        self._cycles: dict[int, tuple[RankState, Stream]] = {}  # streams to try at every call
        self._why: _Why | None = None  # collects what the current top-level attempt waits for
        self._heap_seq = 0
        # what place_waiting has seen of the collectives: works submitted, ends read, dropped, rollbacks
        self._seen_unread: set[int] = set()
        self._seen_ends = 0
        self._seen_dropped = 0
        self._seen_rollbacks = 0

    def next_seq(self) -> int:
        self._seq += 1
        return self._seq

    def stream(self, st: RankState, device: int, stream_id: int) -> Stream:
        """The rank's stream, its track named when it is first used."""
        stream, new = st.timeline.stream(device, stream_id)
        if new:
            self.trace.stream_track(st.info, stream)
        return stream

    def enqueue(self, st: RankState, action: Action) -> None:
        action.enqueued_ns = st.timeline.host_ns
        st.actions.append(action)
        action.stream.queue.append(action)
        if len(action.stream.queue) == 1:
            self.place_stream(st, action.stream, None, force=False)

    def place_stream(self, st: RankState, stream: Stream, upto: Action | None, force: bool) -> bool:
        """Place `stream`'s waiting work in order, through `upto` (all of it, and the end of the
        collective in flight on it, if None). False when it needs an end that cannot be read yet
        (force: read ends that are not final yet; False only for collectives some member has
        not joined)."""
        if upto is not None and upto.placed:
            return True
        if self._why is not None:  # nested in another stream's placement
            self._why.touched[id(stream)] = (st, stream)
            return self._place_stream(st, stream, upto, force)
        why = self._why = _Why()
        why.touched[id(stream)] = (st, stream)
        try:
            return self._place_stream(st, stream, upto, force)
        finally:
            self._why = None
            self._note(why, force)

    def _place_stream(self, st: RankState, stream: Stream, upto: Action | None, force: bool) -> bool:
        done = self._place_stream_work(st, stream, upto, force)
        if not done and self._why is not None:
            self._why.failed.add(id(stream))
        return done

    def _place_stream_work(self, st: RankState, stream: Stream, upto: Action | None, force: bool) -> bool:
        if id(stream) in self._placing:  # the program waits on itself: a real GPU hangs too
            if self._why is not None:
                self._why.cycle = True
            return False
        self._placing.add(id(stream))
        try:
            while True:
                if stream.inflight is not None and (stream.queue or upto is None):
                    if self._end(stream.inflight, force) is None:
                        return False
                    stream.inflight = None
                if not stream.queue:
                    return True
                action = stream.queue[0]
                if not self._place_action(st, action, force):
                    return False
                stream.queue.popleft()
                action.placed = True
                action.tail_ns = stream.tail_ns
                if action is upto:
                    return True
        finally:
            self._placing.discard(id(stream))

    def place_waiting(self, ranks: dict[int, RankState], force: bool) -> None:
        """Place what can be placed on every stream (force: reading ends not final yet). Without
        force, only the streams whose wait may be over (module docstring) are tried."""
        if force:
            for st in ranks.values():
                for s in list(st.timeline.streams.values()):
                    self.place_stream(st, s, None, force=True)
                self._pop_placed(st)
            return
        first = True
        while True:
            todo = self._due(first)
            first = False
            if not todo:
                return
            for st, s in sorted(todo.values(), key=lambda x: (x[0].info.trace_pid, x[1].track)):
                if s.queue or s.inflight is not None:
                    self.place_stream(st, s, None, force=False)
                self._pop_placed(st)

    @staticmethod
    def _pop_placed(st: RankState) -> None:
        while st.actions and st.actions[0].placed:
            st.actions.popleft()

    # --- what waiting streams wait for (module docstring) -------------------------------------
    def _end(self, work: int, force: bool) -> int | None:
        end = self.collectives.end(work, force)
        if end is None:
            self._waits_for(work, None)
        return end

    def _clipped_end(self, work: int, t: int, force: bool) -> int | None:
        end = self.collectives.clipped_end(work, t, force)
        if end is None:
            self._waits_for(work, t)
        return end

    def _waits_for(self, work: int, t: int | None) -> None:
        """The attempt under way needs the end of `work` (or, with t, min(end, t)), not known
        yet: it may be once the work is submitted, read or dropped, once the horizon reaches t,
        or, once submitted, once the horizon reaches its end as the network has it so far (or
        the next horizon: the network is not made to simulate ahead for this, which a later
        submission would roll back)."""
        why = self._why
        if why is None:
            return
        why.works.add(work)
        sub = self.collectives.unread.get(work)
        if sub is not None and sub.handle is not None:
            hint = self.collectives.end_hint(sub)
            if hint is not None:
                t = hint if t is None else min(t, hint)
        if t is not None:
            self._try_again_at(t)

    def _try_again_at(self, t: int) -> None:
        """The attempt under way may succeed once the horizon reaches t."""
        why = self._why
        if why is not None:
            why.time_ns = t if why.time_ns is None else min(why.time_ns, t)

    def _note(self, why: _Why, force: bool) -> None:
        """After a top-level attempt: every stream it touched that still has waiting work waits
        for what the attempt waited for (a superset of what each one waits for), or, if the
        attempt did not fail, is tried at the next call."""
        for key, (st, s) in why.touched.items():
            self._forget(key)
            if not (s.queue or s.inflight is not None):
                continue
            if force or key not in why.failed or not (why.works or why.time_ns is not None or why.cycle):
                self._retry[key] = (st, s)
                continue
            self._waiting[key] = _Waiting(st, s, set(why.works), set(why.wanted), why.cycle)
            for w in why.works:
                self._on_work.setdefault(w, set()).add(key)
            if why.time_ns is not None:
                self._heap_seq += 1
                heapq.heappush(self._on_time, (why.time_ns, self._heap_seq, key))
            if why.cycle:
                self._cycles[key] = (st, s)

    def _forget(self, key: int) -> None:
        """The stream is being tried: what it waited for is recomputed by the attempt."""
        self._retry.pop(key, None)
        self._cycles.pop(key, None)
        w = self._waiting.pop(key, None)
        if w is not None:
            for work in w.works:
                ws = self._on_work.get(work)
                if ws is not None:
                    ws.discard(key)
                    if not ws:
                        del self._on_work[work]
        # its entries in _on_time are skipped when popped (not in _waiting any more)

    def waiting_wanted(self) -> set[int]:
        """The times waiting kernels want the network final up to (finality.py's candidates)."""
        out = set(self.wanted)
        for w in self._waiting.values():
            out |= w.wanted
        return out

    def _due(self, cycles: bool) -> dict[int, tuple[RankState, Stream]]:
        """The streams whose wait may be over: to try now (with cycles: also those that wait on
        each other)."""
        colls = self.collectives
        due = dict(self._retry)
        self._retry.clear()
        if cycles:
            due.update(self._cycles)

        def wake(key: int) -> None:
            w = self._waiting.get(key)
            if w is not None:
                due[key] = (w.st, w.stream)

        changed: list[int] = []
        for work in reversed(colls.unread):  # submitted since the last call: at the end (insertion order)
            if work in self._seen_unread:
                break
            changed.append(work)
        self._seen_unread.update(changed)
        if len(self._seen_unread) > 2 * len(colls.unread) + 64:  # forget works read since (ids never return)
            self._seen_unread.intersection_update(colls.unread)
        new_ends = len(colls.work_end_ns) - self._seen_ends
        if new_ends > 0:
            changed += islice(reversed(colls.work_end_ns), new_ends)
            self._seen_ends = len(colls.work_end_ns)
        if len(colls.dropped) != self._seen_dropped:
            self._seen_dropped = len(colls.dropped)
            changed += [w for w in self._on_work if w in colls.dropped]
        net = colls.network
        rollbacks = net.rollback_count if net is not None else 0
        if rollbacks != self._seen_rollbacks:  # provisional ends may have moved
            self._seen_rollbacks = rollbacks
            changed += [w for w in self._on_work if w in colls.unread]
        for work in changed:
            for key in list(self._on_work.get(work, ())):
                wake(key)
        heap, final = self._on_time, colls.final_ns
        while heap and heap[0][0] <= final:
            wake(heapq.heappop(heap)[2])
        return due

    def _place_action(self, st: RankState, a: Action, force: bool) -> bool:
        s = a.stream
        if isinstance(a, OpWork):
            return self._place_op(st, a, force)
        if isinstance(a, GraphReplay):
            return self._place_replay(st, a, force)
        if isinstance(a, EventRecord):
            a.time_ns = max(a.host_ns + self.timing.launch_latency_ns, s.tail_ns)
            st.timeline.events[a.event_id] = a.time_ns
            return True
        if isinstance(a, EventWait):
            src = a.source
            if src is not None:
                if not src.placed and not self.place_stream(st, src.stream, src, force):
                    return False
                s.tail_ns = max(s.tail_ns, src.time_ns or 0)
            return True
        if isinstance(a, WorkWait):
            end = self._end(a.work, force)
            if end is None:
                return False
            s.tail_ns = max(s.tail_ns, end)
            return True
        assert isinstance(a, Arrive)
        current = self._current_tail(st, a, force)
        if current is None:
            return False
        a.ready_ns = max(a.host_ns + self.timing.launch_latency_ns, current, s.tail_ns)
        self.collectives.reached(st.info.rank, a)
        return True

    def _current_tail(self, st: RankState, a: Arrive, force: bool) -> int | None:
        """The tail of the caller's current stream as of the collective call (Arrive)."""
        s = a.stream
        if a.current is s:
            return s.tail_ns
        dep = a.current_dep
        if dep is not None:
            if not self.place_stream(st, a.current, dep, force):
                return None
            return dep.tail_ns
        if a.current_inflight is None:
            return a.current_tail
        end = self._end(a.current_inflight, force)
        return None if end is None else max(a.current_tail, end)

    def _place_op(self, st: RankState, a: OpWork, force: bool) -> bool:
        s, est = a.stream, a.est
        start, raw_end = op_span(a.launch_ns, s.tail_ns, est.duration_ns, est.kernels,
                                 self.timing.launch_latency_ns, self.timing.kernel_gap_ns)
        slowed = 0
        if a.slows:
            overlap = self._comm_overlap(st, a.device, a.seq, start, raw_end, force)
            if overlap is None:
                return False
            slowed = int(self.timing.comm_slowdown * overlap)
        a.end_ns = s.tail_ns = raw_end + slowed
        st.gpu_busy_ns += est.duration_ns + slowed
        self.trace.op_kernels(st.info.trace_pid, a, start, slowed)
        return True

    def _place_replay(self, st: RankState, a: GraphReplay, force: bool) -> bool:
        """A CUDA graph replay: its kernels back to back from a launch latency after the launch,
        each slowed by concurrent communication as an eager kernel would be. Computed in full
        before anything is written, so a placement that must wait leaves no partial trace."""
        s = a.stream
        start = max(a.launch_ns + self.timing.launch_latency_ns, s.tail_ns)
        spans = []
        t = start
        for node in a.nodes:
            raw_end = t + node.est.duration_ns
            slowed = 0
            if a.slows and node.est.kind not in (COPY_D2H, COPY_H2D):
                overlap = self._comm_overlap(st, a.device, a.seq, t, raw_end, force)
                if overlap is None:
                    return False
                slowed = int(self.timing.comm_slowdown * overlap)
            spans.append((t, raw_end + slowed, slowed))
            t = raw_end + slowed
        a.end_ns = s.tail_ns = t
        for b, e, _ in spans:
            st.gpu_busy_ns += e - b
        self.trace.graph_replay(st.info.trace_pid, a, start, t, spans)
        return True

    def _want(self, t: int) -> None:
        """The attempt needs the network final up to t: finality.py tries t as a horizon, and
        the stream is tried again once the horizon reaches it (_comm_overlap then knows)."""
        self.wanted.add(t)
        if self._why is not None:
            self._why.wanted.add(t)
        self._try_again_at(t)

    def _comm_overlap(self, st: RankState, device: int, seq: int, start: int, end: int, force: bool) -> int | None:
        """How much of [start, end) the NCCL kernels of collectives this rank called on `device`
        before program position `seq` cover; None if an end it needs cannot be read yet."""
        log = st.comm_log.get(device)
        if not log:
            return 0
        c = self.collectives
        spans = []
        for a in log.settle(seq, c.work_end_ns, c.dropped):
            if not a.placed and a.host_ns + self.timing.launch_latency_ns >= end:
                continue  # its NCCL kernel cannot start before `end`
            if not a.placed and not force and end <= c.final_ns:
                # nor can it where `end` is final: the horizon is proven below every waiting
                # arrival's ready time (finality.py). Waiting for the arrival instead deadlocked
                # where its stream waits, through an event, on work queued behind this kernel
                # (TorchTitan's DeepSeek-V3 with EP over 2 nodes under --sync conservative).
                continue
            if not a.placed and not self.place_stream(st, a.stream, a, force):
                # It queues behind the collective in flight on its communicator (NCCL runs them
                # in order): if that one still runs at `end`, this one starts after.
                inflight = a.stream.inflight
                if inflight is not None and self._clipped_end(inflight, end, force) == end:
                    continue
                self._want(end)
                return None
            ready = a.ready_ns
            assert ready is not None
            if ready >= end:
                continue
            done = self._clipped_end(a.work, end, force)
            if done is None:
                self._want(end)
                return None
            if done > max(ready, start):
                spans.append((max(ready, start), done))
        spans += log.spans(seq, start, end)
        if len(log.settled) > log.prune_at:
            # forget collectives that ended before anything still to be placed can start (work
            # queued on a stream starts after its tail and after the host clock when the oldest
            # of it was queued; work not launched yet, after the host clock now: a stream idle
            # since early in the run, or one whose tail waits for a receive posted long ago, does
            # not hold the floor back)
            log.prune(min([st.timeline.host_ns] + [max(x.tail_ns, x.queue[0].enqueued_ns)
                                                   for x in st.timeline.streams.values()
                                                   if x.device == device and x.queue]))
        return _union_ns(spans)
