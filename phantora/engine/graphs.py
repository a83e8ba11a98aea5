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
  * Collectives inside a capture are refused (CollectiveLifecycle.join): NCCL kernels in a
    graph would need matching replays across ranks, which phantora does not simulate.

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
class CapturedGraph:
    graph_id: int
    device: int
    stream_id: int  # the stream the capture began on
    nodes: list[GraphNode] = field(default_factory=list)
    streams: set[tuple[int, int]] = field(default_factory=set)  # (device, stream) capturing into it
    capturing: bool = True
    replays: int = 0

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
