"""Proving collective ends final, and placing what waited for them.

An end is final when no collective submitted later can start before it: every rank's clock is
past it, or the rank provably waits for something later. `progress` moves that horizon
(`CollectiveLifecycle.final_ns`) forward, then places the work waiting on streams (placement.py
reads the ends that are now final) and answers the host waits that can be answered
(host_waits.py).

Two bounds: a cheap one (each rank's next collective is ready a launch latency after its host
clock at the earliest) every time, and, when a rank is held waiting for an end (conservative
sync, or the run is closing) and the cheap one does not free it, a proof that replays each
rank's waiting work with lower bounds in place of unknown ends (deferred.replay_lower_bounds).

`progress` runs after every message, so the cheap bound is kept in two heaps instead of a scan
of every rank and every waiting arrival: a rank's bound and the host time of its waiting
arrivals only grow, so an entry that no longer holds the current value is only ever too low,
and is replaced when it reaches the top.
"""

from __future__ import annotations

import bisect
import heapq
from typing import Callable

from phantora.engine.collective_lifecycle import CollectiveLifecycle
from phantora.engine.deferred import Arrive, EventRecord, LowerBounds, replay_lower_bounds
from phantora.engine.host_waits import HostWaits
from phantora.engine.placement import Placement
from phantora.engine.ranks import RankState, WaitTarget
from phantora.engine.timeline import Stream, TimingConfig

_NEVER = 1 << 62  # a time no rank reaches (bound of a finished rank)


class Finality:
    def __init__(self, ranks: dict[int, RankState], timing: TimingConfig, placement: Placement,
                 collectives: CollectiveLifecycle, waits: HostWaits, sync: str) -> None:
        self.ranks = ranks
        self.timing = timing
        self.placement = placement
        self.collectives = collectives
        self.waits = waits
        self.sync = sync
        self.expected_ranks = 0  # WORLD_SIZE the ranks announced: nothing is final before all joined
        self.closing = False  # no rank calls anything any more; what they called still counts
        # The cheap bound's heaps (module docstring): (bound, seq, rank) and (host ns, seq, arrival)
        self._rank_heap: list[tuple[int, int, RankState]] = []
        self._known: set[int] = set()  # id() of the RankStates in _rank_heap
        self._arrival_heap: list[tuple[int, int, tuple[int, int], Arrive]] = []
        self._seen_arrivals: set[tuple[int, int]] = set()
        self._seq = 0

    def progress(self) -> None:
        """Prove more ends final, read them, place the work that waited for them, and finish the
        host waits and calls that can finish now (HostWaits.take_unblocked names their ranks)."""
        colls = self.collectives
        while True:  # ends while the horizon moves (it only moves forward)
            before = colls.final_ns
            self._advance_final(self._cheap_bound())
            self.placement.place_waiting(self.ranks, force=False)
            # Optimistic sync closes without proofs (Engine.read_all_collectives reads the rest
            # as it places it): a pipeline's remaining work is a chain of ends, each needing a
            # proof that replays every rank's waiting work, which at 64 GPUs took minutes.
            need_proof = self.sync == "conservative" and (self.closing or self.waits.blocked_ranks())
            if need_proof and not self.waits.resume_blocked():
                self._advance_final(self._proven_horizon())
                self.placement.place_waiting(self.ranks, force=False)
            self.waits.resume_blocked()
            if colls.final_ns == before:
                break

    def _advance_final(self, t: int) -> None:
        if t > self.collectives.final_ns:
            self.collectives.final_ns = t

    def _done(self, st: RankState) -> bool:
        """Will this rank call no more collectives?"""
        return st.finished or self.closing

    def _cheap_bound(self) -> int:
        """No collective can start before this: each rank's next one is ready a launch latency
        after its host clock at the earliest, and each waiting arrival after the host time it
        was called at."""
        if not self.ranks or len(self.ranks) < self.expected_ranks:
            return self.collectives.final_ns
        lat = self.timing.launch_latency_ns
        return min(self._min_rank_bound(lat), self._min_arrival_ns() + lat)

    def _rank_bound(self, st: RankState, lat: int) -> int:
        return _NEVER if self._done(st) else st.timeline.host_ns + lat

    def _min_rank_bound(self, lat: int) -> int:
        """min over ranks of _rank_bound; the heap holds one entry per rank."""
        heap = self._rank_heap
        if len(self._known) != len(self.ranks):  # ranks joined (a renamed rank keeps its state)
            for st in self.ranks.values():
                if id(st) not in self._known:
                    self._known.add(id(st))
                    self._seq += 1
                    heapq.heappush(heap, (self._rank_bound(st, lat), self._seq, st))
        while heap:
            bound, seq, st = heap[0]
            now = self._rank_bound(st, lat)
            if now == bound:
                return bound
            heapq.heapreplace(heap, (now, seq, st))
        return _NEVER

    def _min_arrival_ns(self) -> int:
        """min host_ns over the collectives' waiting arrivals (collective_lifecycle.arrivals)."""
        arrivals, heap, seen = self.collectives.arrivals, self._arrival_heap, self._seen_arrivals
        new = []
        for key in reversed(arrivals):  # added since the last call: at the end (insertion order)
            if key in seen:
                break
            new.append(key)
        for key in new:
            seen.add(key)
            self._seq += 1
            heapq.heappush(heap, (arrivals[key].host_ns, self._seq, key, arrivals[key]))
        while heap and arrivals.get(heap[0][2]) is not heap[0][3]:
            seen.discard(heapq.heappop(heap)[2])  # placed since (keys never return)
        return heap[0][0] if heap else _NEVER - self.timing.launch_latency_ns

    def _proven_horizon(self) -> int:
        """The latest time T proven to be before every future collective start, using lower
        bounds of what blocked ranks wait for (`_min_bound`). Tries the provisional ends of
        unread collectives as T, so a rank that waits directly for one does not hold it back."""
        colls = self.collectives
        t = colls.final_ns
        candidates = sorted({e for sub in colls.unread.values() if sub.handle is not None
                             for e in [colls.provisional_end(sub)] if e is not None and e > t}
                            | {x for x in self.placement.waiting_wanted() if x > t})
        self.placement.wanted.clear()
        changed = True
        while changed:
            changed = False
            bound = self._min_bound(t)
            if bound > t:
                t, changed = bound, True
            c = self._latest_proven(candidates[bisect.bisect_right(candidates, t):])
            if c is not None:
                t, changed = c, True
        return t

    def _latest_proven(self, candidates: list[int]) -> int | None:
        """A candidate c (sorted ascending) with _min_bound(c) >= c, found by galloping then
        bisecting (a few replays, where trying each would take one replay per candidate; with
        mirrored ranks there are thousands of unread ends at the end of a run). Each c it returns
        is proven on its own, whether or not the candidates before it are."""
        lo, step = -1, 1  # candidates[lo] is proven (-1: none yet)
        hi = len(candidates)  # candidates[hi] is not (len: none tried)
        while lo + step < hi:
            i = lo + step
            if self._min_bound(candidates[i]) >= candidates[i]:
                lo, step = i, step * 2
            else:
                hi = i
                break
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if self._min_bound(candidates[mid]) >= candidates[mid]:
                lo = mid
            else:
                hi = mid
        return candidates[lo] if lo >= 0 else None

    def _min_bound(self, t: int) -> int:
        """A lower bound of every future collective start, valid if no collective that is not
        final ends before t (its end is then bounded by min(provisional end, t)). If it is at
        least t, no collective starts before t (each step from an end to a start takes time)."""
        if not self.ranks or len(self.ranks) < self.expected_ranks:
            return self.collectives.final_ns
        lat = self.timing.launch_latency_ns
        # valid to start from: a rank's next collective is ready a launch latency after its host
        # clock, and each of its waiting arrivals a launch latency after it was called
        bounds = {r: (_NEVER if self._done(st) else st.timeline.host_ns + lat) for r, st in self.ranks.items()}
        for (_, r), a in self.collectives.arrivals.items():
            bounds[r] = min(bounds[r], a.host_ns + lat)
        arrivals: dict[tuple[int, int], int] = {}
        for _ in range(4):
            new_arrivals: dict[tuple[int, int], int] = {}
            new_bounds = {}
            for r, st in self.ranks.items():
                known = dict(arrivals)

                def end_lb(work: int, ready: int, r: int = r, known: dict = known) -> int:
                    return self._end_lower_bound(work, ready, t, r, bounds, known)
                lb = replay_lower_bounds(list(st.actions), lat, end_lb, self.timing.kernel_gap_ns)
                for w, ready in lb.arrivals.items():
                    new_arrivals[(w, r)] = known[(w, r)] = max(ready, known.get((w, r), 0))
                future = _NEVER if self._done(st) else st.timeline.host_ns + lat  # collectives it has not called yet
                waits = st.blocked.target if st.blocked is not None else st.blocked_call
                if waits is not None and not self._done(st):
                    future = max(future, self._target_lower_bound(st, waits, lb, end_lb)
                                 + self.timing.sync_overhead_ns + lat)
                new_bounds[r] = max(bounds[r], min([future, *lb.arrivals.values()]))
            arrivals = new_arrivals
            if new_bounds == bounds:
                break
            bounds = new_bounds
        return min(bounds.values())

    def _end_lower_bound(self, work: int, ready: int, t: int, me: int, bounds: dict[int, int],
                         arrivals: dict[tuple[int, int], int]) -> int:
        colls = self.collectives
        end = colls.work_end_ns.get(work)
        if end is not None:
            return end
        if work in colls.dropped:
            return 0
        sub = colls.unread.get(work)
        if sub is not None:
            if sub.handle is None:
                return sub.start_ns
            prov = colls.provisional_end(sub)
            return max(sub.start_ns, min(prov if prov is not None else t, t))
        p = colls.joined.get(work)
        if p is None:
            return ready
        lb = ready
        for m in p.members:  # it starts when its last member's stream reaches it
            if m in p.ready_ns:
                lb = max(lb, p.ready_ns[m])
            else:  # a mirrored rank reaches it when its representative reaches the representative's
                w, r = colls.mirror_source(work, m)
                lb = max(lb, arrivals.get((w, r), bounds.get(r, 0)))
        return lb

    def _target_lower_bound(self, st: RankState, target: WaitTarget, lb: LowerBounds,
                            end_lb: Callable[[int, int], int]) -> int:
        def tail(s: Stream) -> int:
            t = lb.tails.get(id(s))
            if t is not None:
                return t
            return s.tail_ns if s.inflight is None else max(s.tail_ns, end_lb(s.inflight, s.tail_ns))

        kind = target.kind
        if kind == "stream":
            assert target.stream is not None
            return tail(target.stream)
        if kind == "device":
            return max((tail(s) for s in st.timeline.streams.values() if s.device == target.device), default=0)
        if kind in ("event", "op"):
            a = target.action
            if a is None:
                return 0
            if a.placed:
                return (a.time_ns if isinstance(a, EventRecord) else a.end_ns) or 0  # type: ignore[attr-defined]
            return lb.times.get(id(a), 0)
        return end_lb(target.work, 0)
