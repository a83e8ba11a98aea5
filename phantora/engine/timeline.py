"""One rank's timelines: its host clock, the CUDA streams of its devices, and its events.

The time model (DESIGN.md): the host clock advances by each call's modelled host cost; a GPU
op launched at host time h on stream s starts at max(h + launch latency, end of the previous
work on s, events s waits on) and lasts its estimated duration; synchronisations move the
host clock to the completion time they wait for. All times are integer ns since simulation
start. Nothing here knows about torch, sockets or file formats.
"""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any

from phantora.cost.host_bench import python_scale


@dataclass(frozen=True)
class TimingConfig:
    launch_latency_ns: int = 2_500  # from a launch call returning to the kernel starting on an idle GPU
    sync_overhead_ns: int = 4_000  # host cost of a cudaStreamSynchronize/cudaDeviceSynchronize that returns
    event_record_host_ns: int = 2_000  # host cost of cudaEventRecord / cudaStreamWaitEvent
    event_query_host_ns: int = 1_000
    # Compute kernels that run while an NCCL kernel occupies SMs on the same GPU are this
    # fraction slower for the overlapping part. NCCL takes 16-32 of an H100's 132 SMs; 0.1 is
    # an assumption, not a measurement (`phantora trace --comm-slowdown`).
    comm_slowdown: float = 0.1
    # Modelled host costs (phantora/cost/host.py) times this: the simulated host's speed against
    # the host the model was fitted on (cost/host.py HostSpec; `phantora trace --host`).
    host_speed: float = 1.0
    # The program's own host time (interpose/host/host_time.py): "measured" charges the CPU time each
    # rank process measured between phantora's entries, times this machine's speed against the
    # reference host (cost/host_bench.py: each rank measures it, RankTimeline.speed_probes;
    # python_scale before it has); "modelled" ignores the measurements and charges the fitted
    # per-op model of cost/host.py (PythonOverhead): bit-identical traces.
    host_time: str = "modelled"
    python_scale: float = 1.0
    # Charge the one-off costs of a fresh process (phantora/cost/startup.py): CUDA context, kernel
    # module loads, cuBLAS/cuDNN handles, cudaMalloc of segments, NCCL communicators.
    startup_costs: bool = False
    # Idle time a busy stream leaves between the end of one kernel and the start of the next
    # (GPUSpec.kernel_gap_ns; 0 in unit tests of the engine).
    kernel_gap_ns: int = 0


@dataclass
class Stream:
    device: int
    stream_id: int
    track: int  # trace thread id of this stream's track
    tail_ns: int = 0  # when the last work placed on this stream finishes
    # GPU work launched on this stream but not placed yet: it waits (in stream order) for a
    # collective end the engine cannot read yet (Placement.place_stream).
    queue: deque[Any] = field(default_factory=deque)
    inflight: int | None = None  # collective work placed on it whose end is not read yet


@dataclass
class GpuWork:
    """One piece of GPU work placed on a stream."""

    stream: Stream
    start_ns: int
    end_ns: int


def op_span(launch_ns: int, tail_ns: int, duration_ns: int, kernels: int, launch_latency_ns: int,
            kernel_gap_ns: int) -> tuple[int, int]:
    """Start and end (before any slowdown by communication) of an op's kernels on a stream whose
    work so far ends at tail_ns: a launch latency after the launch at the earliest, and a busy
    stream leaves kernel_gap_ns after its last kernel and between the op's own kernels (the op's
    slice covers them and their gaps). Placement and the finality proof's lower bounds both use
    it, so a bound is never later than the placement it bounds."""
    busy_until = tail_ns + kernel_gap_ns if tail_ns else 0
    start = max(launch_ns + launch_latency_ns, busy_until)
    return start, start + duration_ns + kernel_gap_ns * max(0, kernels - 1)


@dataclass
class RankTimeline:
    rank: int
    config: TimingConfig = field(default_factory=TimingConfig)
    host_ns: int = 0
    streams: dict[tuple[int, int], Stream] = field(default_factory=dict)
    events: dict[int, int] = field(default_factory=dict)  # event id -> completion time
    first_stream_track: int = 10
    # host time by what it was spent on (the summary's HOST_USES, HOST_WAITS), since the rank started: steps write their share
    spent: Counter[str] = field(default_factory=Counter)
    # this machine's Python benchmark as the rank measured it (ms), latest last (cost/host_bench.py)
    speed_probes: list[float] = field(default_factory=list)

    def stream(self, device: int, stream_id: int) -> tuple[Stream, bool]:
        """The stream, and whether it was created by this call (so a caller can name its track)."""
        key = (device, stream_id)
        s = self.streams.get(key)
        if s is not None:
            return s, False
        s = Stream(device, stream_id, track=self.first_stream_track + len(self.streams))
        self.streams[key] = s
        return s, True

    # --- host ---------------------------------------------------------------------------------
    def advance_host(self, ns: int, what: str = "sleep") -> None:
        """Time that passes on the host whatever its speed (the user's own sleeps)."""
        ns = max(0, ns)
        self.host_ns += ns
        self.spent[what] += ns

    def charge_host(self, ns: int, what: str = "launch") -> int:
        """A modelled host cost, scaled by the simulated host's speed; the time it took."""
        ns = max(0, round(ns * self.config.host_speed))
        self.host_ns += ns
        self.spent[what] += ns
        return ns

    def host_speed_probe(self, bench_ms: float) -> None:
        self.speed_probes.append(bench_ms)

    @property
    def python_scale(self) -> float:
        """Measured Python here -> on the reference host: the rank's latest benchmark, or the
        configured scale before it sent one."""
        if self.config.host_time == "counted":
            return 1.0
        return python_scale(self.speed_probes[-1]) if self.speed_probes else self.config.python_scale

    def charge_python(self, python_ns: int) -> int:
        """The program's Python time its process reported (interpose/host/host_time.py), on the simulated
        host; the time it took. Counted: already on the reference host; measured: CPU time here, scaled;
        modelled: nothing."""
        if self.config.host_time == "counted":
            return self.charge_host(max(0, python_ns), "python")
        if self.config.host_time != "measured":
            return 0
        return self.charge_host(round(max(0, python_ns) * self.python_scale), "python")

    def wait_host_until(self, t_ns: int, overhead_ns: int = 0, what: str = "wait") -> None:
        """Block the host until t_ns (if later), then pay overhead_ns."""
        waited = max(0, t_ns - self.host_ns)
        self.spent[what] += waited
        self.spent["launch"] += overhead_ns
        self.host_ns = max(self.host_ns, t_ns) + overhead_ns

    # --- GPU work -----------------------------------------------------------------------------
    def enqueue(self, stream: Stream, launch_ns: int, duration_ns: int) -> GpuWork:
        start = max(launch_ns + self.config.launch_latency_ns, stream.tail_ns)
        end = start + duration_ns
        stream.tail_ns = end
        return GpuWork(stream, start, end)

    def record_event(self, event_id: int, stream: Stream) -> int:
        """cudaEventRecord: the event completes when the stream reaches it."""
        t = max(self.host_ns + self.config.launch_latency_ns, stream.tail_ns)
        self.events[event_id] = t
        return t

    def wait_event(self, event_id: int, stream: Stream) -> None:
        """cudaStreamWaitEvent: later work on the stream starts after the event. Waiting on an
        event that was never recorded is a no-op, as in CUDA."""
        t = self.events.get(event_id)
        if t is not None and t > stream.tail_ns:
            stream.tail_ns = t

    def device_idle_ns(self, device: int) -> int:
        return max((s.tail_ns for s in self.streams.values() if s.device == device), default=0)

    def gpu_end_ns(self) -> int:
        return max((s.tail_ns for s in self.streams.values()), default=0)
