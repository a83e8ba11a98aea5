"""Rewinding flows to the past, and forgetting the past nobody can return to.

rollback_scope(seeds, t): late flows (the seeds) arrived whose start is not after their island's
last applied event. Which flows can they change? Flows influence each other only through links
they share while both are active, so from t on a late flow can change exactly the flows it shares
a link with that have an event at or after t, then the flows those share a link with, and so
on: the closure over shared links among the flows with events at or after t (not finished
before t). Everything outside it shares no link with anything inside it from t on, so its
history after t is what a run that had known the late flows all along would have computed too
(the rates of a connected component depend only on its flows: fluid.py). In a large run the
island (every flow that ever shared a link, up to the last prune) holds the whole cluster's
recent history while the closure is usually the late collective alone: a 64-GPU pipeline's
rollbacks found 177 flows with events after t in islands of 11,371, and a closure of 1 (at most 3).
So the closure is walked out from the seeds' links (FlowSimulator.flows_by_link) rather than
found by a scan of every flow with an event after t, unless it turns out to be most of the island.

roll_back(flows, t): those flows go back to the state "every event batch before t applied, none
at or after t":
  - flows that started at or after t become pending again (their history is dropped);
  - other flows drop the rate segments that begin at or after t, which leaves the segment
    that was current just before t, exactly as it was (remaining bytes, rate);
  - flows that finished at or after t are revived with that segment.
That is precisely the state a run that had known the late flow all along would have had just
before t (nothing before t depends on it), and re-simulating from there applies the same
batches to the same state: completion times come out bit-identical (see fluid.py). The island
keeps its processed_until (flows outside the scope may have events up to it): a later arrival
before it is then checked the same way, and finds nothing to rewind if it shares no links.

prune_history(h): once no submission can start before h, no rollback can reach before h
either. A flow needs only the last segment that begins before h (the one a rollback to h would
restore) and those after it; flows finished before h are gone for good (the
caller removes them). Islands are then rebuilt so that islands that were tied together only
by forgotten flows split again. Memory is thus bounded by what happens after h.
"""

from __future__ import annotations

import bisect
import heapq

import numpy as np

from phantora.net.fluid import ACTIVE, DONE, PENDING, Flow, FlowSimulator
from phantora.net.maxmin import unique_ids


# Beyond this many flows looked at, the closure is most of its island (an expert-parallel
# all-to-all ties every GPU's links together): one vectorized pass over the island's candidates
# is then cheaper than walking flow by flow (bench_net's ep a2a at 512 GPUs: 17 s against 37 s
# walking every time).
_WALK_LIMIT = 4096


def rollback_scope(sim: FlowSimulator, seeds: list[Flow], t: int) -> list[Flow]:
    """The flows a rollback to t for these late flows must rewind (the seeds included), in fid
    order: the closure over shared links among the flows with an event at or after t (not done
    before t). Walked out from the seeds' links while that looks at few flows; else found by one
    pass over the island."""
    scope = _walk_from_seeds(sim, seeds, t)
    if scope is None:
        return _scan_island(sim, seeds, t)
    return sorted(scope.values(), key=lambda f: f.fid)


def _walk_from_seeds(sim: FlowSimulator, seeds: list[Flow], t: int) -> dict[int, Flow] | None:
    """The closure by a walk over the links it reaches, a frontier at a time (the flows kept on
    a link: FlowSimulator.flows_by_link, and kept_wide for flows with many links); None once the
    walk has looked at more than _WALK_LIMIT flows."""
    scope = {f.fid: f for f in seeds}
    flows, by_link, kept_narrow = sim.flows, sim.flows_by_link, sim.kept_narrow
    kept_wide, seen = sim.kept_wide, sim.link_seen
    touched: list[np.ndarray] = []
    frontier = seeds
    looked_at = 0
    try:
        while frontier:
            reached = (frontier[0].links if len(frontier) == 1
                       else unique_ids(np.concatenate([f.links for f in frontier]), len(seen)))
            reached = reached[~seen[reached]]
            if not len(reached):
                break
            seen[reached] = True
            touched.append(reached)
            found: list[int] = []
            for link in reached[kept_narrow[reached]].tolist():
                found.extend(by_link[link])
            if kept_wide:
                found.extend(kept_wide.touching(reached))
            looked_at += len(found)
            if looked_at > _WALK_LIMIT:
                return None
            frontier = []
            for fid in found:
                if fid in scope:
                    continue
                f = flows[fid]
                if f.state == DONE and f.done_t < t:
                    continue
                scope[fid] = f
                frontier.append(f)
        return scope
    finally:
        for links in touched:
            seen[links] = False


def _scan_island(sim: FlowSimulator, seeds: list[Flow], t: int) -> list[Flow]:
    """The closure from every flow of the seeds' island with an event at or after t, in numpy."""
    island = seeds[0].island
    candidates = [sim.flows[fid] for fid in sim.live] + [sim.flows[fid] for fid in sim.done_by_time.fids_from(t)]
    candidates = [f for f in candidates if f.island == island]
    if not candidates:
        return sorted(seeds, key=lambda f: f.fid)
    owner = np.repeat(np.arange(len(candidates)), [len(f.links) for f in candidates])
    links = np.concatenate([f.links for f in candidates])
    reached_link = np.zeros(len(sim.capacity), dtype=bool)
    inside = np.zeros(len(candidates), dtype=bool)
    seed_fids = {f.fid for f in seeds}
    frontier = np.array([i for i, f in enumerate(candidates) if f.fid in seed_fids], dtype=np.int64)
    while len(frontier):
        inside[frontier] = True
        reached_link[np.concatenate([candidates[i].links for i in frontier])] = True
        hit = np.flatnonzero(np.bincount(owner[reached_link[links]], minlength=len(candidates)))
        frontier = hit[~inside[hit]]
    return sorted((candidates[i] for i in np.flatnonzero(inside)), key=lambda f: f.fid)


def roll_back(sim: FlowSimulator, flows: list[Flow], t: int) -> list[Flow]:
    """Rewind these flows (a rollback_scope) to just before t; returns those whose state changed."""
    affected, deactivated, activated = [], [], []
    for f in flows:
        if f.state == PENDING:
            continue
        if f.state == DONE:
            sim.done_by_time.discard(f.done_t, f.fid)
            sim.live.add(f.fid)
        if f.start >= t:
            if f.state == ACTIVE:
                sim.deactivate(f)
                deactivated.append(f)
            f.state = PENDING
            f.seg_t.clear()
            f.seg_rem.clear()
            f.seg_rate.clear()
            f.done_t = -1
            f.version += 1
            heapq.heappush(sim.island_of(f).arrivals, (f.start, f.fid))
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
            activated.append(f)
            changed = True
        if changed:
            f.version += 1
            sim.queue_drain(f)
            affected.append(f)
    sim.count_links(deactivated, -1)
    sim.count_links(activated, 1)
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
    """Index of the last segment beginning before t (seg_t is sorted, seg_t[0] < t)."""
    return bisect.bisect_left(seg_t, t) - 1
