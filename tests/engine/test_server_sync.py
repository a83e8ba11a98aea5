"""The simulator server with --sync conservative: a rank whose host waits for an end not
proven final is held (its call waits too), and answered once nothing has moved for stall_s."""

from __future__ import annotations

import socket
import time

from phantora import protocol as P
from phantora.simulator.server import Connection, SimulatorServer

from engine.test_collectives import TIMING, late_overlap_engine, network_answers  # noqa: E402
from phantora.trace import NullSink


def test_a_held_conservative_wait_is_answered_after_the_stall_timeout():
    e, a, a_start, b_start = late_overlap_engine(NullSink(), sync="conservative")
    a_alone, _ = network_answers(a_start, b_start)
    warnings = []
    e._warn = warnings.append
    server = SimulatorServer(e, stall_s=0.3)
    ours, theirs = socket.socketpair()
    try:
        conn = Connection(ours, rank=1)
        # rank 1 waits on A (a blocking Work.wait), then asks for the time
        server._handle(conn, [[[P.R_WORK_WAIT, a, 1, 0, 1]], [7, P.C_NOW]])
        assert 1 in server.held and e.host_blocked(1)  # rank 2, behind, could still slow A
        theirs.settimeout(0.05)
        try:
            theirs.recv(1)
            raise AssertionError("the held call was answered before the stall timeout")
        except socket.timeout:
            pass
        started = time.monotonic()
        while 1 in server.held and time.monotonic() - started < 5:
            server._poll(0.05)
        assert 1 not in server.held and time.monotonic() - started >= 0.2
        theirs.settimeout(5)
        buf = P.MessageBuffer()
        replies = []
        while not replies:
            replies = buf.feed(theirs.recv(1 << 16))
        call_id, ok, value = replies[0]
        assert (call_id, ok) == (7, True) and value == a_alone + TIMING.sync_overhead_ns
        assert e.early_reads == 1 and any("--sync conservative" in w for w in warnings)
    finally:
        ours.close()
        theirs.close()
        server.close()


def test_a_collective_waits_only_in_the_time_the_server_waits_for_the_ranks():
    # a member late to a collective while the simulator is busy (simulating 1,000 GPUs' flows) is
    # waiting for the simulator's answers, not missing: the collective timeout must not count it
    from engine.test_collectives import call, two_rank_engine

    e = two_rank_engine()
    server = SimulatorServer(e, collective_timeout_s=0.2)
    p = e.matcher.join(call(0))  # rank 0 joined, rank 1 has not
    time.sleep(0.3)  # the server busy, outside select
    assert e.matcher.overdue(0.2) == []
    started = time.monotonic()
    while time.monotonic() - started < 0.35:
        server._poll(0.05)  # waiting for the ranks: this time counts
    assert e.matcher.overdue(0.2) == [p]
    assert 0.3 <= server.waited_s <= 0.6


def test_the_server_raises_the_collectors_thresholds_while_it_serves_and_restores_them():
    import gc

    from engine.test_collectives import two_rank_engine
    from phantora.simulator.server import SERVE_GC_THRESHOLD

    before = gc.get_threshold()
    assert before != SERVE_GC_THRESHOLD
    server = SimulatorServer(two_rank_engine())
    seen = []

    def keep_going() -> bool:
        seen.append(gc.get_threshold())
        return len(seen) < 2

    try:
        server.serve(keep_going, poll_s=0.01)
    finally:
        server.close()
    assert seen == [SERVE_GC_THRESHOLD, SERVE_GC_THRESHOLD]
    assert gc.get_threshold() == before
