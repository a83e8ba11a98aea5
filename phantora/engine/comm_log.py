"""A rank's collectives on one device, kept for the question every kernel asks when it is placed:
how much of [start, end) do the NCCL kernels of collectives called before it cover?
(Placement._comm_overlap; the answer slows the kernel by --comm-slowdown.)

A collective is `open` until it is placed and its end is read, in program order: those are the
ones whose placement a kernel may have to attempt, or whose end it may have to wait for, in
that order. Then it is `settled`: a fixed [ready, end) span, kept sorted by end, so a kernel
only visits the spans still running at its start. A pipeline stage runs far ahead of its GPU
and keeps hundreds of collectives that way; visiting all of them at every kernel was most of
the simulator's time (Megatron-LM's interleaved schedule, 8 stages).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sortedcontainers import SortedList

from phantora.engine.deferred import Arrive


@dataclass
class CommLog:
    open: list[Arrive] = field(default_factory=list)  # program order
    settled: SortedList = field(default_factory=SortedList)  # (end, seq, ready) of placed ones, by end
    prune_at: int = 64  # settled spans at which those that can no longer matter are dropped

    def append(self, arrive: Arrive) -> None:
        self.open.append(arrive)

    def __len__(self) -> int:
        return len(self.open) + len(self.settled)

    def settle(self, seq: int, ends: dict[int, int], dropped: set[int]) -> list[Arrive]:
        """Move the collectives called before program position `seq` whose end is known (0 for
        a dropped one) to `settled`; the open ones called before `seq`, in program order."""
        still, n = [], 0
        for a in self.open:
            if a.seq > seq:
                break
            n += 1
            if a.placed:
                end = ends.get(a.work)
                if end is None and a.work in dropped:
                    end = 0
                if end is not None:
                    assert a.ready_ns is not None
                    self.settled.add((end, a.seq, a.ready_ns))
                    continue
            still.append(a)
        if len(still) < n:
            self.open[:n] = still
        return still

    def spans(self, seq: int, start: int, end: int) -> list[tuple[int, int]]:
        """The parts of [start, end) the settled collectives called before `seq` cover."""
        out = []
        for done, s, ready in self.settled.irange((start + 1,)):
            if s > seq or ready >= end:
                continue
            done = min(done, end)
            if done > max(ready, start):
                out.append((max(ready, start), done))
        return out

    def prune(self, floor: int) -> None:
        """Drop the settled spans that end before `floor`, the earliest any kernel still to be
        placed on this device can start; next time at twice what is left."""
        del self.settled[:self.settled.bisect_left((floor,))]
        self.prune_at = max(64, 2 * len(self.settled))
