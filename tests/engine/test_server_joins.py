"""A collective called while the rank's host waits is answered at once with a handle and joined
later, in program order (server.py `_answer_join`): the rank's process runs on, as a GPU host
runs on to its next synchronisation, instead of waiting at every collective it launches."""

from __future__ import annotations

import socket

import pytest

from phantora import protocol as P
from phantora.simulator.server import Connection, SimulatorServer

from engine.test_collectives import TIMING, two_rank_engine  # noqa: E402

WIRE = {"op": "all_reduce", "group": [0, 1], "nbytes": 1 << 20, "dtype": "float32", "reduce_op": "sum",
        "stream": 0, "site": "train.py:7 in step"}


def _replies(sock: socket.socket, n: int) -> list[list]:
    sock.settimeout(5)
    buf, out = P.MessageBuffer(), []
    while len(out) < n:
        out += buf.feed(sock.recv(1 << 16))
    return out


def _no_reply(sock: socket.socket) -> bool:
    sock.settimeout(0.05)
    try:
        sock.recv(1)
    except socket.timeout:
        return True
    return False


@pytest.fixture
def two_ranks():
    """A server over a two-rank engine and, per rank, (its connection, the process's end)."""
    e = two_rank_engine()
    server = SimulatorServer(e)
    pairs = [socket.socketpair() for _ in range(2)]
    try:
        yield e, server, [(Connection(ours, rank=r), theirs) for r, (ours, theirs) in enumerate(pairs)]
    finally:
        for pair in pairs:
            for s in pair:
                s.close()
        server.close()


def test_a_held_ranks_collective_is_answered_at_once_and_joins_in_program_order(two_ranks):
    e, server, [(c0, s0), (c1, s1)] = two_ranks
    first = e.join_collective(0, dict(WIRE, seq=0, device=0))
    # rank 0 synchronises (rank 1 has not joined the all-reduce), then calls the next one
    server._handle(c0, [[[P.R_SYNC_DEVICE, 0]], [1, P.C_COLLECTIVE, dict(WIRE, seq=1, device=0)]])
    assert 0 in server.held and e.host_blocked(0)
    [(call_id, ok, handle)] = _replies(s0, 1)
    assert (call_id, ok) == (1, True) and handle >= P.JOIN_HANDLE_BASE
    assert e.matcher.pending and len(e.matcher.pending) == 1  # the second has not joined yet
    # still held: it waits on the handle (a blocking Work.wait) and reads the clock
    server._handle(c0, [[[P.R_WORK_WAIT, handle, 0, 0, 1]], [2, P.C_NOW]])
    assert _no_reply(s0)
    server._handle(c1, [[], [1, P.C_COLLECTIVE, dict(WIRE, seq=0, device=1)]])
    assert _replies(s1, 1)[0][2] == first
    # rank 0's sync is over: its join of the second all-reduce went in, after the sync
    second = e.ranks[0].join_handles[handle]
    assert second not in (first, handle) and 0 in server.held
    server._handle(c1, [[], [2, P.C_COLLECTIVE, dict(WIRE, seq=1, device=1)]])
    assert _replies(s1, 1)[0][2] == second
    [(call_id, ok, now)] = _replies(s0, 1)
    assert (call_id, ok) == (2, True) and 0 not in server.held
    # the handle's wait read the second all-reduce's end, which starts after the first's
    assert now == e.collective_end_ns(second) + TIMING.sync_overhead_ns
    assert e.collective_end_ns(second) > e.collective_end_ns(first)


def test_a_deferred_join_that_fails_is_raised_at_the_ranks_next_call(two_ranks):
    e, server, [(c0, s0), (c1, s1)] = two_ranks
    e.join_collective(0, dict(WIRE, seq=0, device=0))
    server._handle(c0, [[[P.R_SYNC_DEVICE, 0]], [1, P.C_COLLECTIVE, {"op": "all_reduce"}]])  # malformed
    [(_, ok, handle)] = _replies(s0, 1)
    assert ok and handle >= P.JOIN_HANDLE_BASE
    server._handle(c0, [[[P.R_SLEEP, 5]], [2, P.C_NOW]])
    server._handle(c1, [[], [1, P.C_COLLECTIVE, dict(WIRE, seq=0, device=1)]])
    [(call_id, ok, message)] = _replies(s0, 1)
    assert (call_id, ok) == (2, False) and "malformed collective call from rank 0" in message
    assert server.rank_errors == [message] and not server.internal_errors
    assert 0 in server.failed and 0 not in server.held


def test_a_rank_that_is_not_held_still_gets_the_work_id_and_its_errors_at_the_call(two_ranks):
    e, server, [(c0, s0), _] = two_ranks
    server._handle(c0, [[], [1, P.C_COLLECTIVE, dict(WIRE, seq=0, device=0)]])
    [(_, ok, work)] = _replies(s0, 1)
    assert ok and 0 < work < P.JOIN_HANDLE_BASE and not e.ranks[0].join_handles
    server._handle(c0, [[], [2, P.C_COLLECTIVE, {"op": "all_reduce"}]])
    [(call_id, ok, message)] = _replies(s0, 1)
    assert (call_id, ok) == (2, False) and "malformed" in message and 0 not in server.failed
