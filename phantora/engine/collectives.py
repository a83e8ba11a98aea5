"""Matching collectives across ranks: each rank's call joins the others with the same key.

A rank's process group numbers its collectives per group (as NCCL's sequence numbers do), so
the n-th collective of a group (by name: groups with the same ranks are distinct communicators)
on every member is the same collective. Point-to-point ops are matched per group and (sender,
receiver) pair. A collective is complete when every member has arrived;
members that disagree on what the collective is (op, size, dtype, root, reduction) are a bug
in the script that would hang or corrupt data on real GPUs, and are reported with every
member's call site. Pure bookkeeping: no torch, no times beyond what the caller passes in.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

from phantora.net.records import OPS
from phantora.roles import rank_group

P2P_OPS = ("send", "recv")
CollectiveKey = tuple


class CollectiveMismatch(Exception):
    """Members of one collective called different things. The message names each member."""

    def __init__(self, message: str, ranks: tuple[int, ...]) -> None:
        super().__init__(message)
        self.ranks = ranks


@dataclass(frozen=True)
class CollectiveCall:
    """One rank's call of a collective, as the rank's process group reports it.

    group: global ranks of the group, in group order; for send/recv (sender, receiver).
    seq: this rank's count of earlier collectives in the group (or on this send/recv pair).
    nbytes: nccl-tests convention (phantora/net/records.py CollectiveSpec).
    root: global rank of the root (broadcast, reduce), else None.
    """

    rank: int
    op: str
    group: tuple[int, ...]
    seq: int
    nbytes: int
    dtype: str = ""
    reduce_op: str = ""
    root: int | None = None
    device: int = 0
    stream: int = 0
    site: str = ""
    group_name: str = ""
    # all_to_all: bytes this rank sends to / receives from each member, in group order (empty:
    # nbytes split evenly). Split sizes differ per rank when tokens are routed to experts.
    send_splits: tuple[int, ...] = ()
    recv_splits: tuple[int, ...] = ()
    mirrored: bool = False  # made for a mirrored rank from its representative's call (mirrors.py)
    # "nccl", or "userbuffers": Transformer Engine's comm+GEMM overlap moves the same bytes with its
    # own copies and kernels, issued from C++ (a launch's host cost, not an NCCL call's), on copy
    # engines or on SMs its GEMMs leave it (so --comm-slowdown does not slow the kernels beside it)
    transport: str = "nccl"

    @classmethod
    def from_wire(cls, rank: int, d: dict[str, Any]) -> "CollectiveCall":
        op = str(d["op"])
        if op not in OPS and op not in P2P_OPS:
            raise ValueError(f"unknown collective op {op!r}")
        root = d.get("root")
        group = rank_group([int(r) for r in d["group"]])  # shared with the mirrors' calls: hashes once (roles.py)
        send, recv = (tuple(int(x) for x in d.get(k) or ()) for k in ("send_splits", "recv_splits"))
        for name, splits in (("send_splits", send), ("recv_splits", recv)):
            if splits and (len(splits) != len(group) or min(splits) < 0):
                raise ValueError(f"{name}: {len(splits)} sizes for a group of {len(group)} ranks")
        return cls(rank, op, group, int(d["seq"]), int(d["nbytes"]),
                   str(d.get("dtype", "")), str(d.get("reduce_op", "")), None if root is None else int(root),
                   int(d.get("device", 0)), int(d.get("stream", 0)), str(d.get("site", "")),
                   str(d.get("group_name", "")), send, recv, transport=str(d.get("transport", "nccl")))

    def sends(self) -> tuple[int, ...]:
        """all_to_all: bytes sent to each member, in group order."""
        if self.send_splits:
            return self.send_splits
        n = len(self.group)
        return (self.nbytes // n,) * n

    @property
    def key(self) -> CollectiveKey:
        # Sequence numbers count per process group, and two groups may have the same ranks
        # (new_group([0, 1]) next to a 2-rank world): each is its own NCCL communicator.
        if self.op in P2P_OPS:
            return ("p2p", self.group_name, self.group, self.seq)
        return (self.group_name, self.group, self.seq)

    @property
    def net_op(self) -> str:
        return "send_recv" if self.op in P2P_OPS else self.op

    def describe(self) -> str:
        what = f"{self.op}({self.nbytes:,} bytes"
        if self.send_splits or self.recv_splits:
            what += f", send {list(self.sends())}, receive {list(self.recv_splits) or 'even'}"
        if self.dtype:
            what += f", {self.dtype}"
        if self.reduce_op:
            what += f", {self.reduce_op}"
        if self.root is not None:
            what += f", root {self.root}"
        return what + ")"


@dataclass
class PendingCollective:
    key: CollectiveKey
    members: tuple[int, ...]
    arrivals: dict[int, CollectiveCall] = field(default_factory=dict)
    ready_ns: dict[int, int] = field(default_factory=dict)  # member -> when its stream reaches the collective
    first_wall_s: float = field(default_factory=time.monotonic)

    def missing(self) -> list[int]:
        return [r for r in self.members if r not in self.arrivals]

    def complete(self) -> bool:
        """Has every member joined? (join() admits members only, once each: a count suffices,
        where `missing()` would cost a pass over 1,000 members at each of their joins.)"""
        return len(self.arrivals) == len(self.members)


# A member that keeps sending yet never joins (a loop polling work.is_completed() on another
# collective) is given up on after this many timeouts of waiting: no wait is without end.
WAIT_CEILING = 10


class CollectiveMatcher:
    def __init__(self) -> None:
        self.pending: dict[CollectiveKey, PendingCollective] = {}
        # What waits are timed with (first_wall_s, overdue). The simulator's server sets the
        # seconds it has spent waiting for the ranks: while it is busy simulating, ranks wait
        # for it, not for a missing member, and that is no reason to give up on one.
        self.clock: Callable[[], float] = time.monotonic
        # When a rank's process last sent anything, on `clock`'s scale (the server sets it; a
        # mirrored rank is heard through its representative). A collective times out when a
        # member it waits for has been silent for the timeout, not when it has merely waited that
        # long: on a loaded machine a pipeline stage may run minutes of forward work before it
        # posts the receive its neighbour waits in, as its GPU would in milliseconds.
        self.heard: Callable[[int], float] = lambda rank: float("-inf")

    def join(self, call: CollectiveCall) -> PendingCollective:
        """Register one member's call (on the host: its stream may reach the collective later).
        The collective, complete once every member has joined; members that disagree raise
        CollectiveMismatch when the last one joins."""
        if call.rank not in call.group:
            raise CollectiveMismatch(
                f"rank {call.rank} called {call.describe()} on a group it is not in ({list(call.group)})", (call.rank,))
        p = self.pending.get(call.key)
        if p is None:
            p = self.pending[call.key] = PendingCollective(call.key, tuple(dict.fromkeys(call.group)),
                                                           first_wall_s=self.clock())
        if call.rank in p.arrivals:
            raise CollectiveMismatch(f"rank {call.rank} joined collective {call.key} twice", (call.rank,))
        p.arrivals[call.rank] = call
        if p.complete():
            del self.pending[call.key]
            _check_agreement(p)
        return p

    def arrive(self, call: CollectiveCall, ready_ns: int) -> PendingCollective | None:
        """join() with the member's stream ready at ready_ns; the collective once every member is in."""
        p = self.join(call)
        p.ready_ns[call.rank] = ready_ns
        return p if p.complete() else None

    def waiting_for(self, rank: int) -> list[PendingCollective]:
        """Collectives some members joined that `rank` has not (e.g. because it exited)."""
        return [p for p in self.pending.values() if rank in p.members and rank not in p.arrivals]

    def overdue(self, timeout_s: float, now_s: float | None = None) -> list[PendingCollective]:
        now = self.clock() if now_s is None else now_s
        return [p for p in self.pending.values() if now - p.first_wall_s > timeout_s
                and (now - max(map(self.heard, p.missing()), default=float("-inf")) > timeout_s
                     or now - p.first_wall_s > WAIT_CEILING * timeout_s)]

    def drop(self, key: CollectiveKey) -> None:
        self.pending.pop(key, None)


def _check_agreement(p: PendingCollective) -> None:
    calls = [p.arrivals[r] for r in p.members]
    if calls[0].op in P2P_OPS:
        send, recv = p.arrivals.get(calls[0].group[0]), p.arrivals.get(calls[0].group[1])
        ok = (send is not None and recv is not None and send.op == "send" and recv.op == "recv"
              and send.nbytes == recv.nbytes)
    elif calls[0].op == "all_to_all" and any(c.send_splits or c.recv_splits for c in calls):
        _check_splits(p, calls)
        return
    else:
        first = calls[0]
        ok = all((c.op, c.nbytes, c.dtype, c.reduce_op, c.root) == (first.op, first.nbytes, first.dtype, first.reduce_op,
                                                                    first.root) for c in calls)
    if ok:
        return
    lines = [f"  rank {c.rank}: {c.describe()} at {c.site or '<unknown call site>'}" for c in calls]
    what = "point-to-point pair" if calls[0].op in P2P_OPS else f"collective #{calls[0].seq} of group {list(calls[0].group)}"
    raise CollectiveMismatch(
        f"mismatched collective: the ranks disagree on {what} (on real GPUs this hangs or corrupts data):\n"
        + "\n".join(lines), tuple(p.members))


def _check_splits(p: PendingCollective, calls: list[CollectiveCall]) -> None:
    """all_to_all with split sizes: every member calls all_to_all with one dtype, and what member i
    expects from member j is what j sends to i (a mismatch hangs or corrupts data on NCCL). A
    mirrored member's receive sizes are its representative's, not its own: not checked."""
    first = calls[0]
    problems = [f"  rank {c.rank}: {c.describe()} at {c.site or '<unknown call site>'}" for c in calls
                if (c.op, c.dtype) != (first.op, first.dtype)]
    if not problems:
        for i, c in enumerate(calls):
            if c.mirrored or not c.recv_splits:
                continue
            for j, other in enumerate(calls):
                sent = other.sends()[i]
                if c.recv_splits[j] != sent:
                    problems.append(f"  rank {c.rank} expects {c.recv_splits[j]:,} bytes from rank {other.rank}, which "
                                    f"sends it {sent:,} (at {c.site or '?'} and {other.site or '?'})")
    if problems:
        raise CollectiveMismatch(
            f"mismatched all_to_all: collective #{first.seq} of group {list(first.group)} has split sizes that do not "
            "agree across ranks (on real GPUs this hangs or corrupts data):\n" + "\n".join(problems[:8])
            + (f"\n  ... {len(problems) - 8} more" if len(problems) > 8 else ""), tuple(p.members))


def split_matrix(calls: list[CollectiveCall]) -> tuple[tuple[int, ...], ...] | None:
    """all_to_all: bytes member i sends to member j (CollectiveSpec.split_bytes), or None when every
    member sends the same to every other (the even case the network splits itself)."""
    rows = tuple(c.sends() for c in calls)
    flat = {x for row in rows for x in row}
    return None if len(flat) <= 1 else rows
