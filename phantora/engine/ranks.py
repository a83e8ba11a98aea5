"""What the engine knows about each rank: who it is, and the state its records built up.

A rank's records only ever touch its own RankState, which is why ranks can be fed to the engine
in any interleaving (phantora/engine/engine.py). Pure data: no trace, no placement.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from phantora.cost import KernelEstimate
from phantora.engine.data_loading import LoaderTimeline
from phantora.engine.deferred import Action, Arrive, EventRecord
from phantora.engine.graphs import RankGraphs
from phantora.engine.timeline import RankTimeline
from phantora.ops import OpSignature

if TYPE_CHECKING:
    from phantora.engine.host_waits import HostWait, WaitTarget
    from phantora.engine.routing_log import RoutingDecision


class CallError(Exception):
    """A call the user's script made cannot be answered; the message is raised there."""


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
    comm_log: dict[int, list[Arrive]] = field(default_factory=dict)  # device -> its collectives, program order
    blocked: HostWait | None = None  # the host waits for a time not known yet
    blocked_call: WaitTarget | None = None  # a call waits for a time not known yet
    graphs: RankGraphs = field(default_factory=RankGraphs)  # CUDA graphs (phantora/engine/graphs.py)
    # MoE routing decisions, the latest per (layer, sub, experts) (phantora/engine/routing_log.py)
    routing: dict[tuple[int, int, int], RoutingDecision] = field(default_factory=dict)
    # the one-off start-up costs this rank has paid, by key (phantora/engine/startup.py)
    startup_paid: set[tuple[Any, ...]] = field(default_factory=set)
    step_spent: dict[str, int] = field(default_factory=dict)  # the host's time by use (timeline.spent) at the last step
    loaders: dict[int, LoaderTimeline] = field(default_factory=dict)  # DataLoader iterators (engine/data_loading.py)
