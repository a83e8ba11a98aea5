"""A representative is held while it runs more than PACE_LEAD collectives ahead of its witness
(--ranks auto; server.py `_pace`): nothing else waits for a witness, whose late collectives would
each roll the network back. The simulated answers do not depend on it."""

from __future__ import annotations

import select
import socket

import pytest

from phantora import protocol as P
from phantora.simulator import server as server_mod
from phantora.simulator.server import Connection, SimulatorServer

from engine.test_mirrors import all_reduce, mirrored_engine  # noqa: E402
from engine.test_server_joins import _no_reply, _replies  # noqa: E402

LEAD = 4


@pytest.fixture
def rep_and_witness(monkeypatch):
    """4 ranks, --ranks auto: rank 0 runs (ranks 1 and 2 mirror it) and rank 3 is its witness;
    tensor-parallel pairs (0, 1) and (2, 3), so the witness's pair holds a mirror and itself."""
    monkeypatch.setattr(server_mod, "PACE_LEAD", LEAD)
    e = mirrored_engine(4, "auto")
    for r in (0, 3):
        e.apply(r, [[P.R_GROUP, "tp0", [0, 1]], [P.R_GROUP, "tp1", [2, 3]]])
    server = SimulatorServer(e)
    pairs = [socket.socketpair() for _ in range(2)]
    try:
        yield e, server, [(Connection(ours, rank=r), theirs) for r, (ours, theirs) in zip((0, 3), pairs)]
    finally:
        for pair in pairs:
            for s in pair:
                s.close()
        server.close()


def _call(rank: int, seq: int) -> dict:
    group, name = ((0, 1), "tp0") if rank == 0 else ((2, 3), "tp1")
    return dict(all_reduce(group, name, rank), seq=seq)


def test_a_representative_far_ahead_of_its_witness_waits_for_it_and_the_ends_do_not_change(rep_and_witness):
    e, server, [(c0, s0), (c3, s3)] = rep_and_witness
    witness = e.mirrors.witness
    calls = 2 * LEAD + 2
    for seq in range(calls):
        server._handle(c0, [[], [seq + 1, P.C_COLLECTIVE, _call(0, seq)]])
    server._handle(c0, [[], [calls + 1, P.C_NOW]])
    # LEAD + 1 applied, then rank 0 is held: its later collectives are answered with handles
    # (they join once it goes on) and its clock read waits
    assert 0 in server._paced and witness.lead(0) == LEAD + 1
    assert len(_replies(s0, calls)) == calls and _no_reply(s0)
    leads, answered_after = [], None
    for seq in range(calls):  # the witness runs: rank 0 goes on, and is held again, never more than LEAD + 1 ahead
        server._handle(c3, [[], [seq + 1, P.C_COLLECTIVE, _call(3, seq)]])
        leads.append(witness.lead(0))
        if answered_after is None and select.select([s0], [], [], 0.05)[0]:  # a reply waits (not read yet)
            answered_after = seq + 1
            [(call_id, ok, _now)] = _replies(s0, 1)
            assert (call_id, ok) == (calls + 1, True)
    # its clock read is answered once all its joins are in, the witness within LEAD + 1 of them
    assert answered_after is not None and answered_after >= calls - (LEAD + 1)
    assert max(leads) <= LEAD + 1 and server.pace_holds >= 2 and 0 not in server._paced
    assert witness.lead(0) == 0
    _replies(s3, calls)
    e.place_all()
    paced_ends = sorted(e.collective_end_ns(w) for w in range(1, 2 * calls + 1) if e.collectives.handed_out(w))
    assert len(paced_ends) == 2 * calls and None not in paced_ends
    unpaced = mirrored_engine(4, "auto")  # the same calls, rank 0's all before the witness's
    for r in (0, 3):
        unpaced.apply(r, [[P.R_GROUP, "tp0", [0, 1]], [P.R_GROUP, "tp1", [2, 3]]])
    for rank in (0, 3):
        for seq in range(calls):
            unpaced.join_collective(rank, _call(rank, seq))
    unpaced.place_all()
    assert paced_ends == sorted(unpaced.collective_end_ns(w) for w in range(1, 2 * calls + 1) if unpaced.collectives.handed_out(w))


def test_a_representative_whose_witness_ended_is_not_held(rep_and_witness):
    e, server, [(c0, s0), (c3, s3)] = rep_and_witness
    for seq in range(LEAD + 1):
        server._handle(c0, [[], [seq + 1, P.C_COLLECTIVE, _call(0, seq)]])
    assert 0 in server._paced
    e.finish_rank(3)
    server._check_pacing(0.0)
    assert 0 not in server._paced and 0 in server._unpaced
    server._handle(c0, [[], [LEAD + 2, P.C_COLLECTIVE, _call(0, LEAD + 1)]])
    server._handle(c0, [[], [LEAD + 3, P.C_NOW]])
    assert [r[0] for r in _replies(s0, LEAD + 3)][-1] == LEAD + 3
