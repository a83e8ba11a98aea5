"""Rewinding an island to the past, and forgetting the past nobody can return to.

roll_back(t): a flow arrived whose start t is not after the island's last applied event.
The island goes back to the state "every event batch before t applied, none at or after t":
  - flows that started at or after t become pending again (their history is dropped);
  - other flows drop the rate segments that begin at or after t, which leaves the segment
    that was current just before t, exactly as it was (remaining bytes, rate);
  - flows that finished at or after t are revived with that segment.
That is precisely the state a run that had known the late flow all along would have had just
before t (nothing before t depends on it), and re-simulating from there applies the same
batches to the same state: completion times come out bit-identical (see fluid.py).

prune_history(h): once no submission can start before h, no rollback can reach before h
either. A flow needs only the last segment that begins before h (the one a rollback to h would
restore) and those after it; flows finished before h are gone for good (the
caller removes them). Islands are then rebuilt so that islands that were tied together only
by forgotten flows split again. Memory is thus bounded by what happens after h.
"""

from __future__ import annotations

import heapq

from phantora.net.fluid import ACTIVE, DONE, PENDING, Flow, FlowSimulator, Island, last_event_time


def roll_back(sim: FlowSimulator, island: Island, t: int) -> list[Flow]:
    """Rewind `island` to just before t; returns the flows whose state changed."""
    affected = []
    last = -1
    for fid in sorted(island.fids):
        f = sim.flows[fid]
        if f.state == PENDING:
            continue
        if f.start >= t:
            if f.state == ACTIVE:
                sim.deactivate(f)
            f.state = PENDING
            f.seg_t.clear()
            f.seg_rem.clear()
            f.seg_rate.clear()
            f.done_t = -1
            f.version += 1
            heapq.heappush(island.arrivals, (f.start, f.fid))
            affected.append(f)
            continue
        changed = False
        while f.seg_t[-1] >= t:
            f.seg_t.pop()
            f.seg_rem.pop()
            f.seg_rate.pop()
            changed = True
        if f.state == DONE and f.done_t >= t:
            f.state = ACTIVE
            f.done_t = -1
            sim.activate(f)
            changed = True
        if changed:
            f.version += 1
            sim.queue_drain(f)
            affected.append(f)
        last = max(last, last_event_time(f))
    island.processed_until = last
    return affected


def prune_history(sim: FlowSimulator, horizon: int) -> None:
    """Drop rate segments no rollback to a time >= horizon can need; rebuild islands."""
    for f in sim.flows.values():
        seg_t = f.seg_t
        if len(seg_t) > 1 and seg_t[1] < horizon:
            # keep the last segment that begins before the horizon, and the later ones
            k = _last_before(seg_t, horizon)
            del seg_t[:k]
            del f.seg_rem[:k]
            del f.seg_rate[:k]
    sim.rebuild_islands()


def _last_before(seg_t: list[int], t: int) -> int:
    lo, hi = 0, len(seg_t)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if seg_t[mid] < t:
            lo = mid
        else:
            hi = mid
    return lo
