"""GPU work that waits to be placed, and how early it could run.

The engine places a rank's GPU work on its streams only once every time it depends on is
known: a collective's end is read from the network when no later submission can change it
(or when the rank's host must wait for it, see Engine). Until then the work waits on its
stream, in stream order, with the host time it was launched at; placed later, it gets the
times it would have got had the final ends been known at launch.

`replay_lower_bounds` runs a rank's waiting work with lower bounds in place of the unknown
ends. It tells the engine how early the rank could still start a collective, which is what
proves an end final (finality.py). Pure: no torch, no engine state.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from phantora.engine.timeline import Stream, op_span


class Action:
    """One piece of GPU-side work in a rank's program order (seq), on one stream."""

    __slots__ = ("seq", "stream", "placed", "tail_ns", "enqueued_ns")

    def __init__(self, seq: int, stream: Stream) -> None:
        self.seq = seq
        self.stream = stream
        self.placed = False
        self.tail_ns: int | None = None  # the stream's tail once this is placed
        self.enqueued_ns = 0  # the host clock when it joined its stream's queue (Placement.enqueue)


class OpWork(Action):
    """The kernels of one aten op."""

    __slots__ = ("sig", "est", "launch_ns", "flow", "device", "slows", "end_ns")

    def __init__(self, seq: int, stream: Stream, sig: Any, est: Any, launch_ns: int, flow: int, device: int,
                 slows: bool) -> None:
        super().__init__(seq, stream)
        self.sig, self.est, self.launch_ns, self.flow, self.device, self.slows = sig, est, launch_ns, flow, device, slows
        self.end_ns: int | None = None


class GraphReplay(Action):
    """One cudaGraphLaunch (phantora/engine/graphs.py): the captured kernels, back to back; or
    one part of it, for a graph that holds collectives (only the first part is the target of the
    launch's arrow: `arrow`)."""

    __slots__ = ("graph_id", "nodes", "replay", "launch_ns", "flow", "device", "slows", "end_ns", "duration_ns",
                 "arrow")

    def __init__(self, seq: int, stream: Stream, graph_id: int, nodes: list[Any], replay: int, launch_ns: int,
                 flow: int, device: int, slows: bool, arrow: bool = True) -> None:
        super().__init__(seq, stream)
        self.graph_id, self.replay, self.arrow = graph_id, replay, arrow
        self.nodes = list(nodes)  # a later reset or recapture must not change a launched replay
        self.launch_ns, self.flow, self.device, self.slows = launch_ns, flow, device, slows
        self.duration_ns = sum(n.est.duration_ns for n in self.nodes)
        self.end_ns: int | None = None


class EventRecord(Action):
    """cudaEventRecord: the event completes when the stream reaches it."""

    __slots__ = ("event_id", "host_ns", "time_ns")

    def __init__(self, seq: int, stream: Stream, event_id: int, host_ns: int) -> None:
        super().__init__(seq, stream)
        self.event_id, self.host_ns = event_id, host_ns
        self.time_ns: int | None = None


class EventWait(Action):
    """cudaStreamWaitEvent on the record that was the event's latest when it was called."""

    __slots__ = ("source",)

    def __init__(self, seq: int, stream: Stream, source: EventRecord | None) -> None:
        super().__init__(seq, stream)
        self.source = source


class WorkWait(Action):
    """Work.wait() on a collective: the stream waits for its end (the host does not)."""

    __slots__ = ("work",)

    def __init__(self, seq: int, stream: Stream, work: int) -> None:
        super().__init__(seq, stream)
        self.work = work


class Arrive(Action):
    """A member's collective call reaching its communication stream. ProcessGroupNCCL makes
    that stream wait for the caller's current stream first: for the work queued on it at the
    call (`current_dep`), or, if none was, for its tail then (`current_tail`, plus the end of
    the collective in flight on it, `current_inflight`). Work launched on the current stream
    after the call may be placed first; it does not count."""

    __slots__ = ("call", "work", "current", "host_ns", "ready_ns", "current_dep", "current_tail", "current_inflight")

    def __init__(self, seq: int, stream: Stream, call: Any, work: int, current: Stream, host_ns: int) -> None:
        super().__init__(seq, stream)
        self.call, self.work, self.current, self.host_ns = call, work, current, host_ns
        self.ready_ns: int | None = None
        self.current_dep: Action | None = current.queue[-1] if current is not stream and current.queue else None
        self.current_tail = current.tail_ns
        self.current_inflight = current.inflight if current is not stream else None


@dataclass
class LowerBounds:
    tails: dict[int, int]  # id(stream) -> lower bound of its tail after all its waiting work
    times: dict[int, int]  # id(action) -> lower bound of its end (ops), time (records), ready (arrivals)
    arrivals: dict[int, int]  # work -> lower bound of this rank's ready time for it


def replay_lower_bounds(actions: list[Action], launch_latency_ns: int,
                        end_lb: Callable[[int, int], int], kernel_gap_ns: int = 0) -> LowerBounds:
    """Place `actions` (a rank's waiting work, in program order) with lower bounds:
    end_lb(work, member_ready_lb) bounds a collective's end from below, kernels are not
    slowed by communication. Every time a placement computes is a max or a sum of these, so
    each result bounds the real one from below."""
    tails: dict[int, int] = {}
    times: dict[int, int] = {}
    arrivals: dict[int, int] = {}
    after: dict[int, int] = {}  # id(action) -> lower bound of its stream's tail after it

    def tail(s: Stream) -> int:
        t = tails.get(id(s))
        if t is None:
            t = s.tail_ns if s.inflight is None else max(s.tail_ns, end_lb(s.inflight, s.tail_ns))
            tails[id(s)] = t
        return t

    for a in actions:
        if a.placed:
            continue
        s = a.stream
        if isinstance(a, OpWork):
            _, end = op_span(a.launch_ns, tail(s), a.est.duration_ns, a.est.kernels, launch_latency_ns, kernel_gap_ns)
            tails[id(s)] = times[id(a)] = end
        elif isinstance(a, GraphReplay):  # its kernels back to back
            end = max(a.launch_ns + launch_latency_ns, tail(s)) + a.duration_ns
            tails[id(s)] = times[id(a)] = end
        elif isinstance(a, EventRecord):
            times[id(a)] = max(a.host_ns + launch_latency_ns, tail(s))
        elif isinstance(a, EventWait):
            src = a.source
            if src is not None:
                t = src.time_ns if src.placed else times.get(id(src), 0)
                tails[id(s)] = max(tail(s), t or 0)
        elif isinstance(a, WorkWait):
            tails[id(s)] = max(tail(s), end_lb(a.work, 0))
        elif isinstance(a, Arrive):
            if a.current is s:
                current = tail(s)
            elif a.current_dep is not None:
                dep = a.current_dep
                current = (dep.tail_ns or 0) if dep.placed else after.get(id(dep), 0)
            else:
                current = a.current_tail
                if a.current_inflight is not None:
                    current = max(current, end_lb(a.current_inflight, current))
            ready = max(a.host_ns + launch_latency_ns, current, tail(s))
            times[id(a)] = arrivals[a.work] = ready
            tails[id(s)] = max(ready, end_lb(a.work, ready))
        after[id(a)] = tail(s)
    return LowerBounds(tails, times, arrivals)
