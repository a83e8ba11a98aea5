"""The process that hosts the job's c10d store (rank 0 where no agent does) is answered its
goodbye only once every other rank process is done, so that a rank still behind it in wall time
can read through the store what was sent to it (server.py `_store_host`,
interpose/distributed/process_group.py `_keep_hosted_store`). Keepalives tell it the simulator
is not hung meanwhile; a stopped run answers it at once."""

from __future__ import annotations

import socket
import time

import pytest

from phantora import protocol as P
from phantora.simulator.server import Connection, SimulatorServer

from engine.test_collectives import two_rank_engine  # noqa: E402

HOSTS_STORE = {"hosts_store": True}


def _frames(sock: socket.socket, wait_s: float) -> list[list]:
    """What arrives within wait_s (keepalives keep coming, so the wait is a deadline)."""
    deadline = time.monotonic() + wait_s
    buf, out = P.MessageBuffer(), []
    while (left := deadline - time.monotonic()) > 0:
        sock.settimeout(left)
        try:
            data = sock.recv(1 << 16)
        except socket.timeout:
            break
        if not data:
            break
        out += buf.feed(data)
    return out


def _replies(sock: socket.socket, wait_s: float = 0.2) -> list[list]:
    return [f for f in _frames(sock, wait_s) if f[0] != P.KEEPALIVE]


@pytest.fixture
def two_processes():
    """A server over a two-rank engine with both ranks' processes connected: per rank, (its
    connection, the process's end)."""
    e = two_rank_engine()
    server = SimulatorServer(e, keepalive_s=0.05)
    pairs = [socket.socketpair() for _ in range(2)]
    conns = [Connection(ours, rank=r) for r, (ours, _) in enumerate(pairs)]
    server.connections.extend(conns)
    try:
        yield e, server, [(c, theirs) for c, (_, theirs) in zip(conns, pairs)]
    finally:
        for pair in pairs:
            for s in pair:
                s.close()
        server.close()


def test_the_store_hosts_goodbye_waits_for_the_other_rank_to_say_goodbye(two_processes):
    e, server, [(c0, s0), (c1, s1)] = two_processes
    server._handle(c0, [[], [7, P.C_BYE, HOSTS_STORE]])
    assert e.ranks[0].finished  # done as far as the simulation goes
    frames = _frames(s0, 0.3)
    assert frames and all(f[0] == P.KEEPALIVE for f in frames)  # kept waiting, told it is not a hang
    server._handle(c1, [[], [3, P.C_BYE, {}]])
    assert _replies(s1) == [[3, True, None]]
    assert _replies(s0) == [[7, True, None]]


def test_the_store_hosts_goodbye_is_answered_when_the_other_process_is_gone(two_processes):
    _, server, [(c0, s0), (c1, _)] = two_processes
    server._handle(c0, [[], [7, P.C_BYE, HOSTS_STORE]])
    assert _replies(s0) == []
    server._close(c1)  # it died without a goodbye
    assert _replies(s0) == [[7, True, None]]


def test_a_goodbye_without_the_store_and_the_last_goodbye_are_answered_at_once(two_processes):
    _, server, [(c0, s0), (c1, s1)] = two_processes
    server._handle(c1, [[], [3, P.C_BYE, {}]])
    assert _replies(s1) == [[3, True, None]]
    server._handle(c0, [[], [7, P.C_BYE, HOSTS_STORE]])  # nobody left to wait for
    assert _replies(s0) == [[7, True, None]]


def test_a_stopped_run_answers_the_store_host_at_once(two_processes):
    _, server, [(c0, s0), _] = two_processes
    server._handle(c0, [[], [7, P.C_BYE, HOSTS_STORE]])
    server.stop()
    assert _replies(s0) == [[7, True, None]]
