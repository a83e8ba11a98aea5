"""A rank interrupted while it waits for the simulator (Ctrl-C lands in a call) keeps a usable
connection: the program's `finally:` blocks and atexit handlers still synchronize, destroy their
process group and say goodbye. Before, the next call read the interrupted call's reply and failed
with "protocol error: reply to call N, expected N+1". A send cut short cannot be resumed (the
simulator holds half a message); the calls after it say so."""

from __future__ import annotations

import os
import signal
import socket
import threading
import time

import pytest

from interpose.client import SimClient, SimulatorGone
from phantora import protocol as P


def _calls(sock: socket.socket, n: int) -> list[list]:
    """The next n calls the client sent (records-only batches skipped)."""
    buf, calls = P.MessageBuffer(), []
    while len(calls) < n:
        data = sock.recv(1 << 16)
        assert data, "the client closed the connection"
        calls += [call for _, call in buf.feed(data) if call is not None]
    return calls


def test_a_call_after_an_interrupted_call_gets_its_own_reply():
    client = SimClient("unused", dict, timeout_s=10)
    ours, theirs = socket.socketpair()
    ours.settimeout(10)  # as _connect sets it
    client._sock = ours
    first_call_id = []

    def simulator() -> None:
        (first,) = _calls(theirs, 1)
        first_call_id.append(first[0])
        os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C while the rank waits for this reply
        time.sleep(0.2)
        P.send_message(theirs, [P.KEEPALIVE, None, {"busy_s": 1.0}])
        P.send_message(theirs, [first[0], True, "first"])  # late: the rank stopped waiting
        (second,) = _calls(theirs, 1)
        P.send_message(theirs, [second[0], True, "second"])

    theirs.settimeout(10)  # a client that never calls again fails the test, not hangs it
    # Python's own SIGINT handler, as in a user's program (pytest-xdist's workers ignore SIGINT)
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    t = threading.Thread(target=simulator, daemon=True)
    t.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            client.call(P.C_NOW)
            time.sleep(5)  # the interrupt is delivered between bytecodes; never reached
        assert first_call_id
        assert client.call(P.C_NOW) == "second"  # the cleanup's call: its own reply
    finally:
        signal.signal(signal.SIGINT, before)
        t.join(5)
        ours.close()
        theirs.close()


def test_a_half_sent_message_leaves_a_rank_that_says_why_it_cannot_go_on():
    client = SimClient("unused", dict, timeout_s=2)
    ours, theirs = socket.socketpair()
    ours.settimeout(2)  # as _connect sets it

    class Interrupted:
        """Sends part of the length prefix, then Ctrl-C arrives in the next send."""
        sends = 0

        def send(self, data: memoryview) -> int:
            self.sends += 1
            if self.sends > 1:
                raise KeyboardInterrupt
            return ours.send(bytes(data[:3]))

    client._sock = Interrupted()  # type: ignore[assignment]
    try:
        with pytest.raises(KeyboardInterrupt):
            client.call(P.C_NOW)
        client._sock = ours
        with pytest.raises(SimulatorGone, match="interrupted in the middle of a message to the simulator"):
            client.call(P.C_NOW)
        client.close()  # the goodbye is skipped, not sent after half a message
        theirs.settimeout(2)
        received = b""
        while chunk := theirs.recv(100):  # to the end of the stream: close() closed it
            received += chunk
        assert len(received) == 3
    finally:
        ours.close()
        theirs.close()
