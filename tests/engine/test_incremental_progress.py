"""Property: the engine's incremental progress (finality.py, placement.py) leaves nothing that a
from-scratch pass would do. For random programs fed in random orders: after every
place_waiting, trying to place every stream of every rank again (as place_waiting did before it
was incremental) places nothing and reads or submits no collective; after every progress(), the
cheap bound from the heaps equals the minimum over every rank and every waiting arrival, and the
held ranks are exactly those a scan of every rank finds."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from phantora.engine import engine as engine_module
from phantora.engine import placement as placement_module
from phantora.engine.finality import _NEVER

from engine.test_sync_property import programs, run  # noqa: E402


def full_pass_changes(e: engine_module.Engine) -> list[str]:
    """What placing every stream of every rank (as progress did before it was incremental) changes."""
    colls = e.collectives
    ends, unread = dict(colls.work_end_ns), set(colls.unread)
    changed = []
    # as if nested in another placement: the pass leaves what each stream is noted to wait for as it is
    e.placement._why = placement_module._Why()
    for rank in e.ranks.values():
        for s in list(rank.timeline.streams.values()):
            if not (s.queue or s.inflight is not None):
                continue
            before = (len(s.queue), s.inflight, s.tail_ns)
            e.placement.place_stream(rank, s, None, force=False)
            if (len(s.queue), s.inflight, s.tail_ns) != before:
                changed.append(f"rank {rank.info.rank} stream {s.stream_id}: {before} -> "
                               f"{(len(s.queue), s.inflight, s.tail_ns)}")
    e.placement._why = None
    if colls.work_end_ns != ends or set(colls.unread) != unread:
        changed.append(f"ends read {set(colls.work_end_ns) - set(ends)}, submitted {set(colls.unread) - unread}")
    return changed


def scanned_cheap_bound(e: engine_module.Engine) -> int:
    f = e.finality
    if not f.ranks or len(f.ranks) < f.expected_ranks:
        return e.collectives.final_ns
    lat = f.timing.launch_latency_ns
    bound = min((r.timeline.host_ns + lat for r in f.ranks.values() if not f._done(r)), default=_NEVER)
    return min([bound] + [a.host_ns + lat for a in e.collectives.arrivals.values()])


def checked_run(progs, colls, seed: int, sync: str) -> list[str]:
    problems: list[str] = []
    progress = engine_module.Engine.progress
    place_waiting = placement_module.Placement.place_waiting
    engines: list[engine_module.Engine] = []

    def checked_progress(self: engine_module.Engine) -> None:
        engines[:] = [self]
        progress(self)
        if self.finality._cheap_bound() != scanned_cheap_bound(self):
            problems.append(f"cheap bound {self.finality._cheap_bound()} != scan {scanned_cheap_bound(self)}")
        held = {id(r) for r in self.ranks.values() if not r.finished and (r.blocked or r.blocked_call)}
        if {id(r) for r in self.waits.blocked_ranks()} != held:
            problems.append("held ranks differ from a scan")

    def checked_place_waiting(self: placement_module.Placement, ranks, force: bool) -> None:
        place_waiting(self, ranks, force)
        if not force and engines and engines[0].placement is self and self._why is None:
            problems.extend(full_pass_changes(engines[0]))

    engine_module.Engine.progress = checked_progress  # type: ignore[method-assign]
    placement_module.Placement.place_waiting = checked_place_waiting  # type: ignore[method-assign]
    try:
        run(progs, colls, seed, sync)
    finally:
        engine_module.Engine.progress = progress  # type: ignore[method-assign]
        placement_module.Placement.place_waiting = place_waiting  # type: ignore[method-assign]
    return problems


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(programs(), st.integers(0, 2**16), st.sampled_from(["conservative", "optimistic"]))
def test_incremental_progress_leaves_nothing_a_full_pass_would_place(prog_colls, seed, sync):
    progs, colls = prog_colls
    assert checked_run(progs, colls, seed, sync) == []
