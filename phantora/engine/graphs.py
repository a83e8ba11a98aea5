"""CUDA graphs in the engine: what a rank captured, and how a replay runs.

The model (a real GPU does the same in these respects):
  * Capture (cudaStreamBeginCapture .. cudaStreamEndCapture) runs nothing on the GPU. The
    script's Python, the dispatcher and each launch call still run on the host, so each
    captured op costs the host what an eager launch costs; its kernels are recorded in the
    graph, in capture order, with their estimated durations.
  * Instantiation costs host time that grows with the node count.
  * A replay (cudaGraphLaunch) costs one launch on the host, whatever the graph holds, and
    puts all recorded kernels on the replay stream: the first one starts a launch latency
    after the call (or when the stream frees up), each next one when the previous ends.
    Kernels keep their modelled durations; a replay re-runs no Python.
  * Branches of a capture that forked to other streams (an event wait joins a stream to the
    capture) are replayed on the replay stream too, serialised in capture order: phantora
    does not model the concurrency inside a graph.
  * NCCL collectives called during a capture are recorded into the graph, not run
    (CollectiveLifecycle.capture): the call costs the host what an eager call costs, and hands
    out a work id (negative: it names the captured node, never a collective that runs). A
    Work.wait() on it while the graph captures is recorded too (GraphWait): the graph's stream
    waits there for that collective. Each replay launches every captured collective again, as
    a real replay does, with the same communicator: the rank's process group gives each one
    the group's next sequence number at the replay (interpose/device/cuda_graphs.py; a capture
    consumes none), so it is matched across ranks like any eager collective and the k-th
    replay on one rank meets the k-th on the others. Its NCCL kernel runs on the group's
    communication stream, after the graph's work captured before it (as ProcessGroupNCCL's
    stream waits for the caller's); the replay stream waits for its end where the capture
    waited, and at the replay's end for any it never waited on (a graph launch ends when all
    its nodes have). A replay that holds collectives is placed as several "graph replay"
    parts, split at its collectives and waits.

Pure bookkeeping: no torch, no trace, no timeline placement. Records: phantora/protocol.py
R_GRAPH_* and OP_CAPTURED; the engine applies them (HostRecords.graph, the OP_CAPTURED branch
of HostRecords.op) and places a replay (deferred.GraphReplay, Placement._place_replay). In the trace a
replay is a "cudaGraphLaunch" slice on the host track with an arrow to a "graph replay" slice
(args: graph, replay, ops, kernels) on the stream, which encloses the replayed kernels (args:
graph, graph replay); a captured op's host slice has args "captured into CUDA graph".
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any



class GraphError(Exception):
    """Records that do not describe a valid capture/replay sequence (a bug on the user side)."""


@dataclass
class GraphNode:
    """One captured op: its signature and kernel estimate, as for an eager op."""

    sig: Any  # phantora.ops.OpSignature
    est: Any  # phantora.cost.KernelEstimate


@dataclass
class GraphCollective:
    """A collective called during the capture: launched again by each replay."""

    call: Any  # phantora.engine.collectives.CollectiveCall, as the capture reported it
    position: int  # kernel nodes captured before it
    work: int  # the id the capture handed out (< 0)


@dataclass
class GraphWait:
    """Work.wait() on a captured collective during the capture: the graph's stream waits for it."""

    position: int
    collective: int  # index in CapturedGraph.collectives


@dataclass
class CapturedGraph:
    graph_id: int
    device: int
    stream_id: int  # the stream the capture began on
    nodes: list[GraphNode] = field(default_factory=list)
    streams: set[tuple[int, int]] = field(default_factory=set)  # (device, stream) capturing into it
    capturing: bool = True
    replays: int = 0
    comm: list[GraphCollective | GraphWait] = field(default_factory=list)  # in capture order

    @property
    def collectives(self) -> list[GraphCollective]:
        return [c for c in self.comm if isinstance(c, GraphCollective)]

    @property
    def kernels(self) -> int:
        return sum(n.est.kernels for n in self.nodes)

    @property
    def duration_ns(self) -> int:
        """GPU time of one replay without slowdown: the kernels run back to back."""
        return sum(n.est.duration_ns for n in self.nodes)


class RankGraphs:
    """The CUDA graphs of one rank: those it captured or is capturing, by graph id."""

    def __init__(self) -> None:
        self.graphs: dict[int, CapturedGraph] = {}
        self.capturing: dict[tuple[int, int], CapturedGraph] = {}  # (device, stream) -> its graph
        self._captured_works = 0  # captured collectives so far: their work ids are -1, -2, ...

    def begin(self, graph_id: int, device: int, stream_id: int) -> CapturedGraph:
        if (device, stream_id) in self.capturing:
            raise GraphError(f"stream {stream_id} of cuda:{device} is already capturing graph "
                             f"{self.capturing[(device, stream_id)].graph_id}")
        g = self.graphs[graph_id] = CapturedGraph(graph_id, device, stream_id)
        self.join(graph_id, device, stream_id)
        return g

    def join(self, graph_id: int, device: int, stream_id: int) -> None:
        g = self._get(graph_id)
        if not g.capturing:
            raise GraphError(f"graph {graph_id} is not capturing")
        g.streams.add((device, stream_id))
        self.capturing[(device, stream_id)] = g

    def end(self, graph_id: int) -> CapturedGraph:
        g = self._get(graph_id)
        g.capturing = False
        for key in g.streams:
            if self.capturing.get(key) is g:
                del self.capturing[key]
        return g

    def capture_collective(self, g: CapturedGraph, call: Any) -> int:
        """Record a collective into `g`, which is capturing; the work id handed out for it."""
        self._captured_works += 1
        work = -self._captured_works
        g.comm.append(GraphCollective(call, len(g.nodes), work))
        return work

    def capture_wait(self, g: CapturedGraph, work: int) -> bool:
        """Work.wait() on a stream capturing into `g`: recorded if `work` is one of g's
        collectives (False otherwise: a wait on something outside the graph)."""
        if work >= 0:
            return False
        for i, c in enumerate(g.collectives):
            if c.work == work:
                g.comm.append(GraphWait(len(g.nodes), i))
                return True
        return False

    def capture_on(self, device: int, stream_id: int) -> CapturedGraph | None:
        """The graph that stream is capturing into, if any."""
        return self.capturing.get((device, stream_id)) if self.capturing else None

    def replayable(self, graph_id: int) -> CapturedGraph:
        g = self._get(graph_id)
        if g.capturing:
            raise GraphError(f"graph {graph_id} is replayed while it is still being captured")
        return g

    def reset(self, graph_id: int) -> None:
        g = self.graphs.get(graph_id)
        if g is None:
            return
        if g.capturing:
            self.end(graph_id)
        del self.graphs[graph_id]

    def _get(self, graph_id: int) -> CapturedGraph:
        g = self.graphs.get(graph_id)
        if g is None:
            raise GraphError(f"unknown CUDA graph {graph_id}")
        return g
