"""A simulator busy with one long piece of work (a rollback re-simulating seconds of a large
network) keeps its ranks waiting without failing them: it sends keepalives while its network makes
progress, and a rank's call skips them (protocol.KEEPALIVE); a simulator that stops progressing
sends none, so the ranks' call timeout still ends a hang."""

from __future__ import annotations

import socket
import threading
import time
from types import SimpleNamespace

import pytest

from interpose.client import SimClient
from phantora import protocol as P
from phantora.simulator.server import Connection, SimulatorServer

from engine.test_collectives import two_rank_engine  # noqa: E402


def _frames(sock: socket.socket, wait_s: float) -> list[list]:
    sock.settimeout(wait_s)
    buf, out = P.MessageBuffer(), []
    try:
        while True:
            data = sock.recv(1 << 16)
            if not data:
                break
            out += buf.feed(data)
    except socket.timeout:
        pass
    return out


@pytest.fixture
def busy_server():
    """A server whose serving thread is 'busy' on one round of messages, over a stub network
    whose progress the test sets; rank 0 connected."""
    e = two_rank_engine()
    e.network = SimpleNamespace(event_batches=0)
    server = SimulatorServer(e, keepalive_s=0.05)
    ours, theirs = socket.socketpair()
    server.connections.append(Connection(ours, rank=0))
    server._busy_since = time.monotonic()
    try:
        yield e, server, theirs
    finally:
        server._busy_since = None
        ours.close()
        theirs.close()
        server.close()


def test_a_rank_hears_keepalives_while_the_busy_simulators_network_progresses(busy_server):
    e, server, theirs = busy_server
    deadline = time.monotonic() + 0.6
    while time.monotonic() < deadline:
        e.network.event_batches += 1
        time.sleep(0.01)
    frames = _frames(theirs, 0.1)
    assert len(frames) >= 3
    assert all(f[0] == P.KEEPALIVE and f[1] is None and f[2]["busy_s"] > 0 for f in frames)


def test_a_simulator_that_stops_progressing_sends_no_keepalive(busy_server):
    _, _, theirs = busy_server
    assert _frames(theirs, 0.6) == []


def test_a_waiting_call_skips_keepalives_and_reads_its_reply():
    client = SimClient("unused", dict, timeout_s=5)
    ours, theirs = socket.socketpair()
    client._sock = ours

    def simulator() -> None:
        buf, got = P.MessageBuffer(), []
        while not got:
            got = buf.feed(theirs.recv(1 << 16))
        _, (call_id, *_) = got[0]
        for _ in range(3):
            P.send_message(theirs, [P.KEEPALIVE, None, {"busy_s": 30.0}])
        P.send_message(theirs, [call_id, True, 42])

    t = threading.Thread(target=simulator)
    t.start()
    try:
        assert client._roundtrip([], [7, P.C_NOW]) == 42
    finally:
        t.join(5)
        ours.close()
        theirs.close()
