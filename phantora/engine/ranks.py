"""What the engine knows about each rank: who it is, and the state its records built up.

A rank's records only ever touch its own RankState, which is why ranks can be fed to the engine
in any interleaving (phantora/engine/engine.py). Pure data: no trace, no placement. The types a
RankState holds live here or in other data modules (never in a component that reads or writes
them), so every component can import this module while it imports only data modules.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from phantora.cost import KernelEstimate
from phantora.engine.comm_log import CommLog
from phantora.engine.data_loading import LoaderTimeline, PinMemoryThreads
from phantora.engine.deferred import Action, EventRecord
from phantora.engine.graphs import RankGraphs
from phantora.engine.routing_log import RoutingDecision
from phantora.engine.timeline import RankTimeline, Stream
from phantora.ops import OpSignature


class CallError(Exception):
    """A call the user's script made cannot be answered; the message is raised there."""


class DeferredJoinError(CallError):
    """A collective joined after its call was answered (R_JOIN) cannot be: the rank's next
    call raises the message."""


@dataclass
class RankInfo:
    rank: int
    node: int
    local_rank: int
    pid: int  # OS pid of the rank process (for messages only; the trace uses `trace_pid`)
    # The node's GPUs the process sees, cuda:i being devices[i] (CUDA_VISIBLE_DEVICES); () all.
    devices: tuple[int, ...] = ()
    # False: the rank is a guess (no RANK in the environment) that init_process_group settles
    # (rank_identity.py); until then another process may claim it.
    certain: bool = True
    trace_pid: int = 0  # the process's trace pid, fixed for the run (rank_identity.py): rank + 1 if free

    def physical_gpu(self, device: int) -> int:
        return self.devices[device] if 0 <= device < len(self.devices) else device


@dataclass
class DeviceMemory:
    allocated: int = 0
    reserved: int = 0
    peak_allocated: int = 0
    peak_reserved: int = 0


@dataclass
class WaitTarget:
    """What a host wait or a call waits for: a stream's or a device's tail, an event, an op's
    end, or a collective's end (host_waits.py finds its time)."""

    kind: str  # "stream" | "device" | "event" | "op" | "work"
    stream: Stream | None = None
    device: int = 0
    action: Action | None = None
    work: int = 0


@dataclass
class HostWait:
    """A host wait not finished yet (RankState.blocked): host_waits.py finishes it."""

    name: str  # of the cuda_runtime slice it writes ("" for a blocking copy: the op's slice covers it)
    target: WaitTarget
    start_ns: int
    op_slice: tuple[str, int, dict[str, Any], int] | None = None  # (name, begin, args, flow) of a blocking op


@dataclass
class RankState:
    info: RankInfo
    timeline: RankTimeline
    sigs: dict[int, tuple[OpSignature, KernelEstimate]] = field(default_factory=dict)
    nvtx: list[tuple[str, int]] = field(default_factory=list)
    memory: dict[int, DeviceMemory] = field(default_factory=dict)
    kernels: int = 0
    ops: int = 0
    gpu_busy_ns: int = 0
    flops: float = 0.0
    ooms: list[str] = field(default_factory=list)
    finished: bool = False
    comm_streams: dict[tuple[int, str, tuple[int, ...], bool], int] = field(default_factory=dict)  # -> stream id
    collectives: int = 0
    steps: int = 0
    step_end_ns: int = 0
    actions: deque[Action] = field(default_factory=deque)  # GPU work in program order, until placed
    event_src: dict[int, EventRecord] = field(default_factory=dict)  # event id -> its latest record
    comm_log: dict[int, CommLog] = field(default_factory=dict)  # device -> its collectives (comm_log.py)
    join_handles: dict[int, int] = field(default_factory=dict)  # R_JOIN handle -> the work it joined
    blocked: HostWait | None = None  # the host waits for a time not known yet
    blocked_call: WaitTarget | None = None  # a call waits for a time not known yet
    graphs: RankGraphs = field(default_factory=RankGraphs)  # CUDA graphs (phantora/engine/graphs.py)
    # MoE routing decisions, the latest per (layer, sub, experts) (phantora/engine/routing_log.py)
    routing: dict[tuple[int, int, int], RoutingDecision] = field(default_factory=dict)
    # the one-off start-up costs this rank has paid, by key (phantora/engine/startup.py)
    startup_paid: set[tuple[Any, ...]] = field(default_factory=set)
    step_spent: dict[str, int] = field(default_factory=dict)  # the host's time by use (timeline.spent) at the last step
    loaders: dict[int, LoaderTimeline] = field(default_factory=dict)  # DataLoader iterators (engine/data_loading.py)
    pin_threads: PinMemoryThreads = field(default_factory=PinMemoryThreads)  # their pin-memory threads
