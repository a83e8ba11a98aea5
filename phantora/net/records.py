"""Everything that crosses the boundary of phantora.net: plain frozen dataclasses, no behaviour.

Units: times are integer nanoseconds of simulated time; byte counts are integers; bandwidths
are GB/s (1e9 bytes per second, the unit nccl-tests prints), which is also bytes per ns.
"""

from __future__ import annotations

from dataclasses import dataclass

OPS = (
    "all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce",
    "all_to_all", "send_recv", "barrier",
)


@dataclass(frozen=True)
class CollectiveSpec:
    """One NCCL operation, as the engine hands it to the network.

    nbytes follows the nccl-tests convention (the "size" column), so that algorithm and bus
    bandwidth come out the way nccl-tests reports them:
      all_reduce, broadcast, reduce: the buffer size.
      all_gather: the OUTPUT size (n_ranks x the per-rank input).
      reduce_scatter: the INPUT size (n_ranks x the per-rank output).
      all_to_all: one rank's whole send buffer; each peer gets nbytes / n_ranks (the rank's
        own slice stays local). For all_to_allv give split_bytes instead.
      send_recv: the message size; ranks = (sender, receiver).
      barrier: ignored; modelled as torch's ProcessGroupNCCL barrier, a 4-byte all_reduce.
    ranks: global GPU indices (node * gpus_per_node + local index) in group order.
    root: global GPU index of the root for broadcast and reduce, else None.
    split_bytes: all_to_allv only; split_bytes[i][j] = bytes ranks[i] sends to ranks[j].
    label: free text carried into trace records (e.g. "tp allreduce layer 3").
    transport: "nccl", or "userbuffers": Transformer Engine's comm+GEMM overlap moves the same
      bytes inside one node with copy-engine copies (send_recv) or its own kernels reading and
      writing the peers' memory (all_gather, reduce_scatter), not NCCL's protocol
      (collectives.userbuffers_plan).
    """

    op: str
    nbytes: int
    ranks: tuple[int, ...]
    root: int | None = None
    label: str = ""
    split_bytes: tuple[tuple[int, ...], ...] | None = None
    transport: str = "nccl"


TRANSPORTS = ("nccl", "userbuffers")


@dataclass(frozen=True)
class Correction:
    """A completion time that finish_time had already returned and a rollback changed."""

    handle: int
    label: str
    old_end_ns: int
    new_end_ns: int


@dataclass(frozen=True)
class RollbackRecord:
    """One rollback: a collective arrived with a start earlier than simulated network time.

    network_time_ns: how far the network had simulated anywhere when the late one arrived.
    from_ns / to_ns: the rolled-back part of the network had simulated up to from_ns and was
    rewound to just before to_ns (the late collective's start).
    flows_rolled_back: flows whose state was rewound (reset, truncated or revived).
    undone: collectives whose reported end it undid; their corrections (if the end changed)
    come from Network.take_corrections once the network has simulated them again.
    """

    seq: int
    handle: int
    label: str
    network_time_ns: int
    from_ns: int
    to_ns: int
    flows_rolled_back: int
    undone: tuple[int, ...]  # handles of collectives whose reported end it undid


@dataclass(frozen=True)
class FlowRecord:
    """One point-to-point transfer inside a collective. src/dst are global GPU indices;
    -1 stands for the node's NVSwitch (NVLS traffic goes GPU -> switch -> GPUs)."""

    handle: int
    src: int
    dst: int
    nbytes: int
    start_ns: int
    end_ns: int
    links: tuple[int, ...]


@dataclass(frozen=True)
class CollectiveInfo:
    """What the trace shows for one collective.

    channels: flow groups modelled (one per distinct NCCL channel pattern; for an all-to-all one
      per round of NCCL's point-to-point schedule and transfer size; see collectives.py).
    transfers: point-to-point transfers those groups stand for.
    algbw / busbw: GB/s as nccl-tests defines them (size / time, times the op's bus factor).
    """

    handle: int
    label: str
    op: str
    nbytes: int
    n_ranks: int
    algorithm: str
    protocol: str
    channels: int
    transfers: int
    start_ns: int
    end_ns: int
    latency_ns: int
    algbw: float
    busbw: float
    flows: tuple[FlowRecord, ...] | None = None


@dataclass(frozen=True)
class LinkInfo:
    """One directed link. capacity is what NCCL traffic can use (line rate x efficiency)."""

    link: int
    name: str
    kind: str
    line_rate: float
    capacity: float
    latency_ns: float


@dataclass(frozen=True)
class LinkSegment:
    """Load on one link, constant over [start_ns, end_ns). load is in GB/s of link capacity
    (protocol overhead included); utilization = load / capacity."""

    link: int
    start_ns: int
    end_ns: int
    load: float
    utilization: float


@dataclass(frozen=True)
class NetworkStats:
    """Sizes of the live state, to check that memory stays bounded."""

    live_collectives: int
    live_flows: int
    history_segments: int
    islands: int
    route_cache_entries: int
    event_batches: int  # processed since the start, re-simulation after rollbacks included
    rollbacks: int
