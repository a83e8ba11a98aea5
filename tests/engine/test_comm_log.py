"""CommLog: the spans a kernel sees from the settled collectives are those a pass over every
collective finds, before and after pruning below the floor."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from phantora.engine.comm_log import CommLog
from phantora.engine.deferred import Arrive
from phantora.engine.timeline import Stream


def _arrive(seq: int, work: int, ready: int | None) -> Arrive:
    s = Stream(0, 1, 1)
    a = Arrive(seq, s, None, work, s, host_ns=0)
    if ready is not None:
        a.placed, a.ready_ns = True, ready
    return a


def _every_span(entries, seq, start, end):
    """The pass over every collective that Placement._comm_overlap made before CommLog."""
    out = []
    for a_seq, ready, done in entries:
        if a_seq > seq or ready >= end:
            continue
        done = min(done, end)
        if done > max(ready, start):
            out.append((max(ready, start), done))
    return sorted(out)


spans_st = st.lists(st.tuples(st.integers(0, 1_000), st.integers(0, 500)), min_size=1, max_size=60)
queries_st = st.lists(st.tuples(st.integers(0, 80), st.integers(0, 1_200), st.integers(1, 400)), max_size=20)


@given(spans_st, queries_st, st.integers(0, 1_200))
def test_settled_spans_match_a_pass_over_every_collective_and_pruning_keeps_them(spans, queries, floor):
    log, ends, entries = CommLog(), {}, []
    for i, (ready, length) in enumerate(spans):
        log.append(_arrive(i, work=i + 1, ready=ready))
        ends[i + 1] = ready + length
        entries.append((i, ready, ready + length))
    assert log.settle(len(spans), ends, set()) == [] and not log.open
    for seq, start, length in queries:
        assert sorted(log.spans(seq, start, start + length)) == _every_span(entries, seq, start, start + length)
    log.prune(floor)
    for seq, start, length in queries:
        start = max(start, floor)  # no kernel still to be placed starts before the floor
        assert sorted(log.spans(seq, start, start + length)) == _every_span(entries, seq, start, start + length)


def test_settle_keeps_the_open_collectives_in_program_order_and_stops_at_seq():
    log = CommLog()
    unplaced, unread, read, later = _arrive(1, 10, None), _arrive(2, 20, 5), _arrive(3, 30, 7), _arrive(9, 40, 8)
    dropped = _arrive(4, 50, 9)
    for a in (unplaced, unread, read, dropped, later):
        log.append(a)
    assert log.settle(5, {30: 12, 40: 20}, {50}) == [unplaced, unread]
    assert log.open == [unplaced, unread, later]  # `later` (seq 9) is not looked at yet
    assert list(log.settled) == [(0, 4, 9), (12, 3, 7)]  # a dropped collective never ran: it covers nothing
    assert log.spans(5, 8, 20) == [(8, 12)]
