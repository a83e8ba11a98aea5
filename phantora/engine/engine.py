"""The simulator's engine: applies the record stream of every rank to its timelines, asks the
cost model for kernel times, answers calls, and writes everything to a trace sink.

Records arrive per rank in program order (phantora/protocol.py). A rank's records only touch
that rank's timeline, so ranks can be fed in any interleaving.

Collectives do not block the rank that issues them, as NCCL's do not: a rank joins, gets its
work id at once, and runs ahead. Its communication stream's tail is unknown until every member
has joined; a record that needs it (waiting on the work, synchronising the device, the next
collective on that stream) cannot be applied yet. `apply` then stops and says how far it got;
the caller keeps the rest and retries when `take_unblocked` names the rank.

Once every member has joined, the collective goes to the network, but its end is read only
when something needs it (a record above, a compute kernel that the NCCL kernel may slow, a
stream query, the end of the run): submissions that arrive in between with an earlier start
(from ranks behind in simulated time) still move it, and what depends on it is placed at the
corrected end. A correction to an end already read is a stale reply: counted, and shown on the
simulator track, while what was placed from it stays.
"""

from __future__ import annotations

import sys
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable

import orjson
from intervaltree import IntervalTree

from phantora import protocol as P
from phantora.cost import COPY_D2H, COPY_H2D, NO_GPU_WORK, Estimator, KernelEstimate
from phantora.cost.host import HOST_COSTS, host_event_ns, python_overhead_ns
from phantora.engine.collectives import CollectiveCall, CollectiveMatcher, CollectiveMismatch, PendingCollective
from phantora.engine.timeline import RankTimeline, Stream, TimingConfig
from phantora.hardware import GPUSpec
from phantora.net.network import Network
from phantora.net.records import CollectiveSpec
from phantora.ops import OpSignature, TensorMeta
from phantora.trace import TraceSink

HOST_TRACK = 1
STEP_TRACK = 2  # "ProfilerStep#N" slices, one per optimizer step (the name Kineto and HTA use)
# Records that may need a collective's completion time (Engine._needs_unresolved).
_MAY_WAIT_ON_COLLECTIVES = frozenset((P.R_WORK_WAIT, P.R_SYNC_DEVICE, P.R_SYNC_STREAM, P.R_EVENT_RECORD))
_MAX_ARG_SHAPES = 16
SIMULATOR_PID = 0  # trace process for rollback corrections and stale replies
ROLLBACK_TRACK, CORRECTION_TRACK = 1, 2  # its threads
_SIMULATOR_TRACKS = {ROLLBACK_TRACK: "network rollbacks", CORRECTION_TRACK: "corrections to ends already used"}
NETWORK_PID = 1_000_000  # trace process for the network's link counters
_NCCL_OPS = {"all_reduce": "AllReduce", "all_gather": "AllGather", "reduce_scatter": "ReduceScatter",
             "broadcast": "Broadcast", "reduce": "Reduce", "all_to_all": "SendRecv", "send_recv": "SendRecv",
             "barrier": "AllReduce"}
_NCCL_DTYPES = {"bfloat16": "bf16", "float16": "f16", "float32": "f32", "float64": "f64", "int64": "i64",
                "int32": "i32", "int8": "i8", "uint8": "u8", "float8_e4m3fn": "f8e4m3", "float8_e5m2": "f8e5m2"}
_NCCL_REDUCE = {"sum": "Sum", "avg": "Sum", "product": "Prod", "min": "MinMax", "max": "MinMax",
                "premul_sum": "PreMulSum"}


def nccl_kernel_name(op: str, dtype: str, reduce_op: str, algorithm: str, protocol: str) -> str:
    """The kernel name NCCL 2.2x shows in profiles, e.g. ncclDevKernel_AllReduce_Sum_bf16_RING_LL."""
    base = _NCCL_OPS[op]
    if base == "SendRecv":
        return "ncclDevKernel_SendRecv"
    if op == "barrier":
        dtype, reduce_op = "float32", "sum"
    parts = ["ncclDevKernel", base]
    if base in ("AllReduce", "ReduceScatter", "Reduce"):
        parts.append(_NCCL_REDUCE.get(reduce_op, "Sum"))
    parts += [_NCCL_DTYPES.get(dtype, dtype or "u8"), algorithm.upper(), protocol.upper().replace("SIMPLE", "SIMPLE")]
    return "_".join(parts)


def _overlap_ns(busy: IntervalTree, start: int, end: int) -> int:
    """How much of [start, end) some interval in `busy` covers."""
    covered = sorted((max(start, iv.begin), min(end, iv.end)) for iv in busy.overlap(start, end))
    total, reach = 0, start
    for b, e in covered:
        if e > reach:
            total += e - max(b, reach)
            reach = e
    return total


class CallError(Exception):
    """A call the user's script made cannot be answered; the message is raised there."""


@dataclass
class RankInfo:
    rank: int
    node: int
    local_rank: int
    pid: int  # OS pid of the rank process (for messages only; the trace uses `trace_pid`)

    @property
    def trace_pid(self) -> int:
        return self.rank + 1


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
    comm_streams: dict[tuple[int, tuple[int, ...], bool], int] = field(default_factory=dict)  # -> stream id
    comm_busy: dict[int, IntervalTree] = field(default_factory=dict)  # device -> NCCL kernels' [start, end)
    collectives: int = 0
    steps: int = 0
    step_end_ns: int = 0


@dataclass
class EngineSummary:
    simulated_ns: int
    ranks: int
    ops: int
    kernels: int
    gpu_busy_ns: int
    flops: float
    peak_allocated: dict[tuple[int, int], int]  # (rank, device) -> bytes
    peak_reserved: dict[tuple[int, int], int]
    unknown_ops: dict[str, int]
    warnings: list[str]
    ooms: int = 0
    collectives: int = 0
    comm_busy_ns: int = 0
    rollbacks: int = 0
    stale_replies: int = 0
    largest_stale_error_ns: int = 0
    kernels_by_estimator: dict[str, int] = field(default_factory=dict)  # args.estimator label -> kernels


@dataclass
class _SubmittedCollective:
    """A collective every member joined, whose end has not been read yet."""

    pending: PendingCollective
    start_ns: int  # when its last member's communication stream reaches it
    handle: int | None  # in the network; None: a single GPU (or no network), it ends at its start


def _copy_flags(sig: OpSignature) -> tuple[bool, TensorMeta | None, TensorMeta | None]:
    """(non_blocking, source, destination) of a copy op, from the schema's argument order."""
    name = sig.name
    if name == "aten::copy_":  # copy_(self, src, non_blocking=False): self is the destination
        dst, src = sig.args[0], sig.args[1]
        nb = bool(sig.args[2]) if len(sig.args) > 2 else False
        return nb, src if isinstance(src, TensorMeta) else None, dst if isinstance(dst, TensorMeta) else None
    if name == "aten::_to_copy":  # (self, *, dtype, layout, device, pin_memory, non_blocking, memory_format)
        src = sig.args[0]
        nb = bool(sig.args[5]) if len(sig.args) > 5 else False
        dst = sig.outputs[0] if sig.outputs else None
        return nb, src if isinstance(src, TensorMeta) else None, dst
    if name == "aten::_local_scalar_dense":  # .item(): a blocking 1-element D2H copy
        return False, None, None
    outs = sig.tensors_out()
    ins = sig.tensors_in()
    return False, ins[0] if ins else None, outs[0] if outs else None


def host_waits_for_copy(sig: OpSignature, est: KernelEstimate) -> bool:
    """Does the host block until this copy has finished on the GPU?

    Mirrors CUDA: D2H is synchronous unless non_blocking into pinned memory; H2D from pageable
    memory is staged synchronously; non_blocking H2D from pinned memory is asynchronous; a copy
    with non_blocking=False ends with a stream synchronisation in PyTorch."""
    if est.kind not in (COPY_D2H, COPY_H2D):
        return False
    nb, src, dst = _copy_flags(sig)
    if not nb:
        return True
    host_side = dst if est.kind == COPY_D2H else src
    return not (host_side is not None and host_side.pinned)


def _shape_args(sig: OpSignature) -> tuple[list[Any], list[str]]:
    shapes, dtypes = [], []
    for t in sig.tensors_in()[:_MAX_ARG_SHAPES]:
        shapes.append(list(t.shape))
        dtypes.append(t.dtype)
    n = len(sig.tensors_in())
    if n > _MAX_ARG_SHAPES:
        shapes.append(f"... {n - _MAX_ARG_SHAPES} more tensors")
    return shapes, dtypes


class Engine:
    def __init__(
        self,
        gpu: GPUSpec,
        estimator: Estimator,
        sink: TraceSink,
        timing: TimingConfig | None = None,
        warn: Callable[[str], None] | None = None,
        network: Network | None = None,
    ) -> None:
        self.gpu = gpu
        self.estimator = estimator
        self.sink = sink
        self.timing = timing or TimingConfig()
        self.ranks: dict[int, RankState] = {}
        self._estimates: dict[bytes, KernelEstimate] = {}
        self._flow_ids = 0
        self.unknown_ops: Counter[str] = Counter()
        self.kernels_by_estimator: Counter[str] = Counter()
        self.warnings: list[str] = []
        self.network = network
        self.gpus_per_node = network.cluster.gpus_per_node if network is not None else 8
        self.matcher = CollectiveMatcher()
        self.work_end_ns: dict[int, int] = {}  # collective work id -> completion time
        self.unresolved_works: set[int] = set()  # joined by some members, not all
        self._unread: dict[int, _SubmittedCollective] = {}  # work id -> all joined, end not read yet
        self._handle_works: dict[int, int] = {}  # network handle -> work id (names corrections)
        self._key_works: dict[Any, int] = {}  # collective key -> its work id, until it runs
        self._unblocked: set[int] = set()
        self._work_ids = 0
        self.comm_busy_ns = 0
        self.stale_replies = 0
        self.largest_stale_error_ns = 0
        self._rollbacks_written = 0
        self._simulator_tracks: set[int] = set()
        # (collective key, rank) -> host begin and end of that rank's call, until the collective runs
        self._collective_launches: dict[tuple[Any, int], tuple[int, int, CollectiveCall]] = {}
        self._warn = warn or (lambda msg: print(f"phantora: warning: {msg}", file=sys.stderr, flush=True))

    # --- ranks --------------------------------------------------------------------------------
    def add_rank(self, info: RankInfo) -> RankState:
        if info.rank in self.ranks:
            raise CallError(
                f"two processes claim rank {info.rank} (pids {self.ranks[info.rank].info.pid} and {info.pid}); "
                "each rank process must have a distinct RANK"
            )
        state = RankState(info, RankTimeline(info.rank, self.timing))
        self.ranks[info.rank] = state
        pid = info.trace_pid
        self.sink.process(pid, f"rank {info.rank} · node {info.node} · GPU {info.local_rank} · {self.gpu.aliases[0].upper()}", info.rank)
        self.sink.thread(pid, HOST_TRACK, "host (aten op launches)", 0)
        return state

    # --- records ------------------------------------------------------------------------------
    def apply(self, rank: int, records: list[list[Any]]) -> int:
        """Apply records in order; the number applied. Fewer than all: the next one needs a
        collective some member has not joined yet (retry after take_unblocked names the rank)."""
        st = self.ranks[rank]
        for i, rec in enumerate(records):
            kind = rec[0]
            if kind in _MAY_WAIT_ON_COLLECTIVES:
                if self._needs_unresolved(st, rec):
                    return i
                self._read_needed(st, rec)
            if kind == P.R_OP:
                self._op(st, rec[1], rec[2], rec[3])
            elif kind == P.R_SIG:
                self._define_sig(st, rec[1], rec[2])
            elif kind == P.R_MEM:
                self._memory(st, rec[1], rec[2], rec[3])
            elif kind == P.R_EVENT_RECORD:
                tl = st.timeline
                stream = self._stream(st, rec[2], rec[3])
                tl.advance_host(self.timing.event_record_host_ns)
                tl.record_event(rec[1], stream)
            elif kind == P.R_EVENT_WAIT:
                st.timeline.advance_host(self.timing.event_record_host_ns)
                st.timeline.wait_event(rec[1], self._stream(st, rec[2], rec[3]))
            elif kind == P.R_SYNC_DEVICE:
                self._host_sync(st, "cudaDeviceSynchronize", st.timeline.device_idle_ns(rec[1]))
            elif kind == P.R_SYNC_STREAM:
                self._host_sync(st, "cudaStreamSynchronize", self._stream(st, rec[1], rec[2]).tail_ns)
            elif kind == P.R_SYNC_EVENT:
                self._host_sync(st, "cudaEventSynchronize", st.timeline.events.get(rec[1], 0))
            elif kind == P.R_NVTX_PUSH:
                st.nvtx.append((str(rec[1]), st.timeline.host_ns))
                # The range is written when it closes (R_NVTX_POP, finish_rank); announced now so
                # sinks that write begin events in time order can start it here.
                self.sink.open_slice(st.info.trace_pid, HOST_TRACK, str(rec[1]), st.timeline.host_ns, "nvtx")
            elif kind == P.R_NVTX_POP:
                if st.nvtx:
                    name, start = st.nvtx.pop()
                    self.sink.slice(st.info.trace_pid, HOST_TRACK, name, start, st.timeline.host_ns - start, "nvtx")
            elif kind == P.R_SLEEP:
                st.timeline.advance_host(int(rec[1]))
            elif kind == P.R_STEP:
                self._step_marker(st)
            elif kind == P.R_HOST:
                self._host_event(st, str(rec[1]), int(rec[2]))
            elif kind == P.R_WORK_WAIT:
                self._work_wait(st, int(rec[1]), int(rec[2]), int(rec[3]), bool(rec[4]))
            elif kind == P.R_STREAM:
                self._stream(st, rec[1], rec[2])
            elif kind == P.R_WARN:
                self._warn_once(str(rec[1]))
            elif kind == P.R_OOM:
                st.ooms.append(str(rec[3]))
                self.sink.instant(st.info.trace_pid, HOST_TRACK, "CUDA out of memory", st.timeline.host_ns, "memory",
                                  {"device": rec[1], "requested_bytes": rec[2], "message": rec[3]})
            else:
                raise CallError(f"unknown record kind {kind!r} from rank {rank}")
        return len(records)

    def _needs_unresolved(self, st: RankState, rec: list[Any]) -> bool:
        kind = rec[0]
        if kind == P.R_WORK_WAIT:
            return int(rec[1]) in self.unresolved_works
        if kind == P.R_SYNC_DEVICE:
            return any(s.unresolved for s in st.timeline.streams.values() if s.device == rec[1])
        stream = st.timeline.streams.get((rec[1], rec[2]) if kind == P.R_SYNC_STREAM else (rec[2], rec[3]))
        return stream is not None and stream.unresolved > 0

    def _read_needed(self, st: RankState, rec: list[Any]) -> None:
        """Read the ends of the joined collectives this record waits on."""
        kind = rec[0]
        if kind == P.R_WORK_WAIT:
            self._read_collective(int(rec[1]))
        elif kind == P.R_SYNC_DEVICE:
            self._read_device(st, rec[1])
        else:
            stream = st.timeline.streams.get((rec[1], rec[2]) if kind == P.R_SYNC_STREAM else (rec[2], rec[3]))
            if stream is not None:
                self._read_stream(stream)

    def _read_stream(self, stream: Stream) -> None:
        for work in sorted(stream.unread):
            self._read_collective(work)

    def _read_device(self, st: RankState, device: int) -> None:
        for stream in list(st.timeline.streams.values()):
            if stream.device == device and stream.unread:
                self._read_stream(stream)

    def read_all_collectives(self) -> None:
        """Read every joined collective's end (the run is over: nothing can arrive before them)."""
        for work in sorted(self._unread):
            self._read_collective(work)

    def collective_end_ns(self, work: int) -> int | None:
        """When collective `work` completes (reading it from the network if not read yet); None
        while some member has not joined it, or for one that never ran."""
        self._read_collective(work)
        return self.work_end_ns.get(work)

    def take_unblocked(self) -> set[int]:
        """Ranks whose collectives completed since the last call (their held records may go on)."""
        ranks, self._unblocked = self._unblocked, set()
        return ranks

    def _warn_once(self, msg: str) -> None:
        if msg not in self.warnings:
            self.warnings.append(msg)
            self._warn(msg)

    def _define_sig(self, st: RankState, sig_id: int, wire: list[Any]) -> None:
        key = orjson.dumps(wire)
        sig = OpSignature.from_wire(wire)
        est = self._estimates.get(key)
        if est is None:
            est = self._estimates[key] = self.estimator.estimate(sig)
            if not est.known:
                if self.unknown_ops[sig.full_name] == 0:
                    self._warn(
                        f"no cost model for {sig.full_name}; it is timed as a memory-bound kernel "
                        f"({est.duration_ns / 1000:.1f} us for these shapes) and counted as unknown in the summary"
                    )
        st.sigs[sig_id] = (sig, est)

    def _stream(self, st: RankState, device: int, stream_id: int) -> Stream:
        stream, new = st.timeline.stream(device, stream_id)
        if new:
            label = "default stream" if stream_id == 0 else f"stream {stream_id}"
            self.sink.thread(st.info.trace_pid, stream.track, f"cuda:{device} {label}", stream.track)
        return stream

    def _next_flow(self) -> int:
        self._flow_ids += 1
        return self._flow_ids

    def _op(self, st: RankState, sig_id: int, stream_id: int, flags: int) -> None:
        sig, est = st.sigs[sig_id]
        tl = st.timeline
        st.ops += 1
        if not est.known:
            self.unknown_ops[sig.full_name] += 1
        device = sig.cuda_device()
        begin = tl.host_ns
        # The Python and autograd code around a GPU op runs before it is dispatched; the op's
        # host slice covers both, with the overhead in its args.
        overhead = python_overhead_ns(flags, est.kernels > 0) if device is not None else 0
        tl.advance_host(overhead)
        launch = tl.host_ns
        tl.advance_host(est.host_ns)
        pid = st.info.trace_pid
        if est.kind == NO_GPU_WORK or device is None or est.kernels == 0:
            self.sink.slice(pid, HOST_TRACK, sig.name, begin, tl.host_ns - begin, "cpu_op",
                            {"python_overhead_ns": overhead} if overhead else None)
            return
        stream = self._stream(st, device, stream_id)
        slows = self.timing.comm_slowdown and est.kind not in (COPY_D2H, COPY_H2D)
        if slows and self._unread:  # the NCCL kernels this one may overlap must have their ends
            self._read_device(st, device)
        work = tl.enqueue(stream, launch, est.duration_ns)
        slowed = 0
        if slows and st.comm_busy.get(device):
            slowed = int(self.timing.comm_slowdown * _overlap_ns(st.comm_busy[device], work.start_ns, work.end_ns))
            work.end_ns += slowed
            stream.tail_ns = work.end_ns
        if host_waits_for_copy(sig, est) or sig.name == "aten::_local_scalar_dense":
            tl.wait_host_until(work.end_ns, self.timing.sync_overhead_ns)
        st.kernels += est.kernels
        estimator = est.estimator if est.known else f"{est.estimator} (unknown op: generic)"
        self.kernels_by_estimator[estimator] += est.kernels
        st.gpu_busy_ns += est.duration_ns + slowed
        st.flops += est.flops
        flow = self._next_flow()
        shapes, dtypes = _shape_args(sig)
        self.sink.slice(pid, HOST_TRACK, sig.name, begin, tl.host_ns - begin, "cpu_op",
                        {"Input Dims": shapes, "correlation": flow, "python_overhead_ns": overhead}, flow_out=flow)
        cat = "kernel" if est.kind not in (COPY_D2H, COPY_H2D) else "gpu_memcpy"
        self.sink.slice(pid, stream.track, est.kernel_name, work.start_ns, work.end_ns - work.start_ns, cat, {
            "op": sig.full_name, "shapes": shapes, "dtypes": dtypes, "flops": est.flops, "bytes": est.bytes,
            "kernels": est.kernels, "estimator": estimator,
            "device": device, "stream": stream.stream_id, "correlation": flow,
            **({"slowed by concurrent communication ns": slowed} if slowed else {}),
        }, flow_in=flow)

    def _host_event(self, st: RankState, kind: str, count: int) -> None:
        tl = st.timeline
        start = tl.host_ns
        tl.advance_host(host_event_ns(kind, count))
        if kind != "module_call":  # module calls are too many and too short to show one by one
            self.sink.slice(st.info.trace_pid, HOST_TRACK, f"python: {kind}", start, tl.host_ns - start, "python",
                            {"count": count})

    def _step_marker(self, st: RankState) -> None:
        pid = st.info.trace_pid
        if st.steps == 0:
            self.sink.thread(pid, STEP_TRACK, "steps (optimizer.step)", 1)
        now = st.timeline.host_ns
        self.sink.slice(pid, STEP_TRACK, f"ProfilerStep#{st.steps}", st.step_end_ns, now - st.step_end_ns,
                        "user_annotation", {"step": st.steps})
        st.steps += 1
        st.step_end_ns = now

    def _host_sync(self, st: RankState, name: str, until_ns: int) -> None:
        tl = st.timeline
        start = tl.host_ns
        tl.wait_host_until(until_ns, self.timing.sync_overhead_ns)
        self.sink.slice(st.info.trace_pid, HOST_TRACK, name, start, tl.host_ns - start, "cuda_runtime")

    def _memory(self, st: RankState, device: int, allocated: int, reserved: int) -> None:
        mem = st.memory.setdefault(device, DeviceMemory())
        mem.allocated, mem.reserved = allocated, reserved
        mem.peak_allocated = max(mem.peak_allocated, allocated)
        mem.peak_reserved = max(mem.peak_reserved, reserved)
        self.sink.counter(st.info.trace_pid, f"cuda:{device} memory", st.timeline.host_ns,
                          {"allocated": allocated, "reserved": reserved})

    # --- calls --------------------------------------------------------------------------------
    def now(self, rank: int) -> int:
        return self.ranks[rank].timeline.host_ns

    def elapsed_ms(self, rank: int, start_event: int, end_event: int) -> float:
        events = self.ranks[rank].timeline.events
        if start_event not in events or end_event not in events:
            raise CallError("elapsed_time: both events must have been recorded before computing the elapsed time")
        return (events[end_event] - events[start_event]) / 1e6

    def query_event(self, rank: int, event_id: int) -> bool:
        tl = self.ranks[rank].timeline
        tl.advance_host(self.timing.event_query_host_ns)
        return tl.events.get(event_id, 0) <= tl.host_ns

    def query_stream(self, rank: int, device: int, stream_id: int) -> bool:
        st = self.ranks[rank]
        tl = st.timeline
        tl.advance_host(self.timing.event_query_host_ns)
        stream = self._stream(st, device, stream_id)
        self._read_stream(stream)
        return stream.tail_ns <= tl.host_ns

    # --- collectives ---------------------------------------------------------------------------
    def join_collective(self, rank: int, wire: dict[str, Any]) -> int | None:
        """One rank calls a collective: its work id, or None when the rank's communication
        stream still waits for an earlier collective (retry after take_unblocked names it).
        Runs the collective when this is the last member; CollectiveMismatch if they disagree."""
        st = self.ranks[rank]
        try:
            call = CollectiveCall.from_wire(rank, wire)
        except (KeyError, ValueError, TypeError) as e:
            raise CallError(f"malformed collective call from rank {rank}: {e}") from None
        comm = self._comm_stream(st, call)
        if comm.unresolved:
            return None
        self._read_stream(comm)  # NCCL runs a communicator's kernels in order: this one starts after
        tl = st.timeline
        launch_begin = tl.host_ns
        tl.advance_host(HOST_COSTS.collective_ns)
        self._collective_launches[(call.key, rank)] = (launch_begin, tl.host_ns, call)
        # Written by _write_collective_launch once the collective has run; announced now, when the
        # rank's host track reaches it.
        self.sink.open_slice(st.info.trace_pid, HOST_TRACK, f"nccl:{call.op}", launch_begin, "cpu_op", end_ns=tl.host_ns)
        current = self._stream(st, call.device, call.stream)
        # ProcessGroupNCCL makes its stream wait for the caller's current stream first.
        ready = max(tl.host_ns + self.timing.launch_latency_ns, current.tail_ns, comm.tail_ns)
        work = self._key_works.get(call.key)
        if work is None:
            self._work_ids += 1
            work = self._key_works[call.key] = self._work_ids
            self.unresolved_works.add(work)
        comm.unresolved += 1
        done = self.matcher.arrive(call, ready)
        if done is not None:
            self._submit_collective(done, self._key_works.pop(done.key))
        return work

    def _comm_stream(self, st: RankState, call: CollectiveCall) -> Stream:
        # Send and receive of a pair get a stream each: NCCL runs a batch_isend_irecv group's
        # send and receive to one peer concurrently.
        key = (call.device, call.group, call.net_op == "send_recv")
        sid = st.comm_streams.get(key)
        if sid is None:
            sid = st.comm_streams[key] = -1 - len(st.comm_streams)
        stream, new = st.timeline.stream(call.device, sid)
        if new:
            what = "p2p " + "->".join(map(str, call.group)) if call.net_op == "send_recv" else f"group {list(call.group)}"
            self.sink.thread(st.info.trace_pid, stream.track, f"cuda:{call.device} nccl {what}", stream.track)
        return stream

    def global_gpu(self, rank: int) -> int:
        info = self.ranks[rank].info
        return info.node * self.gpus_per_node + info.local_rank

    def _submit_collective(self, p: PendingCollective, work: int) -> None:
        """Every member has joined: hand the collective to the network; its end is read later
        (`_read_collective`), when something needs it."""
        first = p.arrivals[p.members[0]]
        start = max(p.ready_ns.values())
        gpus = tuple(self.global_gpu(r) for r in p.members)
        handle = None
        if self.network is not None and len(set(gpus)) > 1:
            spec = CollectiveSpec(first.net_op, max(first.nbytes, 1), gpus,
                                  root=self.global_gpu(first.root) if first.root is not None else None,
                                  label=f"{first.op} group {list(first.group)} #{first.seq}")
            handle = self.network.submit(spec, start)
            self._handle_works[handle] = work
            self._record_corrections()  # a rollback can change ends already read
        self._unread[work] = _SubmittedCollective(p, start, handle)
        self.unresolved_works.discard(work)
        self._unblocked.update(p.members)  # their held records can go on: the end can be read
        for r in p.members:
            stream = self._comm_stream(self.ranks[r], p.arrivals[r])
            stream.unresolved -= 1
            stream.unread.add(work)

    def _read_collective(self, work: int) -> None:
        """Read a submitted collective's end from the network and place it: the NCCL kernel on
        each member's communication stream, the stream tails, the trace. No-op if already read."""
        sub = self._unread.pop(work, None)
        if sub is None:
            return
        p, start = sub.pending, sub.start_ns
        calls = [p.arrivals[r] for r in p.members]
        first = calls[0]
        info = None
        if sub.handle is not None:
            assert self.network is not None
            end = self.network.finish_time(sub.handle)
            info = self.network.collective_info(sub.handle)
            self._record_corrections()
        else:
            end = start  # one member (or no network): nothing moves
        self.work_end_ns[work] = end
        algorithm = info.algorithm if info else "ring"
        protocol = info.protocol if info else "simple"
        name = nccl_kernel_name(first.net_op if first.op != "barrier" else "barrier", first.dtype, first.reduce_op,
                                algorithm, protocol)
        flow = self._next_flow()
        places = []
        for call in calls:
            st = self.ranks[call.rank]
            stream = self._comm_stream(st, call)
            ready = p.ready_ns[call.rank]
            stream.tail_ns = max(stream.tail_ns, end)
            stream.unread.discard(work)
            if end > ready:
                st.comm_busy.setdefault(call.device, IntervalTree()).addi(ready, end)
            st.collectives += 1
            self.comm_busy_ns += end - ready
            launch = self._write_collective_launch(st, call)
            self.sink.slice(st.info.trace_pid, stream.track, name, ready, end - ready, "kernel", {
                "op": call.op, "bytes": call.nbytes, "dtype": call.dtype, "group ranks": list(call.group),
                "seq": call.seq, "root": call.root, "algorithm": algorithm, "protocol": protocol,
                "bus bandwidth GB/s": round(info.busbw, 2) if info else None,
                "waited for peers ns": start - ready, "network ns": end - start, "call site": call.site,
                "collective": work, "correlation": launch,
            }, flow_in=launch)
            places.append((st.info.trace_pid, stream.track, ready))
        src = places[0]
        for i, (pid, track, ready) in enumerate(places[1:]):
            # Perfetto meets flow events in time order and drops an arrow whose end it meets before
            # its start (stat flow_end_without_start): a recv often waits from before its send.
            # Each member's slice lasts from its ready time to `end`, so a point no earlier than
            # the source's is still inside it.
            self.sink.flow(flow * 1000 + i, f"{first.op} #{first.seq}", src, (pid, track, max(ready, src[2])))

    def _write_collective_launch(self, st: RankState, call: CollectiveCall, ran: bool = True) -> int | None:
        """The host slice of `call` (ProcessGroupNCCL enqueuing the NCCL kernel), written once the
        collective has run so that it links to its kernel like an aten op does; the flow id, or
        None for a collective that never ran."""
        span = self._collective_launches.pop((call.key, call.rank), None)
        if span is None:
            return None
        launch = self._next_flow() if ran else None
        args = {"group ranks": list(call.group), "seq": call.seq, "call site": call.site}
        if launch is None:
            args["never ran"] = True
        else:
            args["correlation"] = launch
        self.sink.slice(st.info.trace_pid, HOST_TRACK, f"nccl:{call.op}", span[0], span[1] - span[0], "cpu_op", args,
                        flow_out=launch)
        return launch

    def _simulator_track(self, tid: int) -> int:
        if not self._simulator_tracks:
            self.sink.process(SIMULATOR_PID, "simulator (rollbacks, corrections)", -1)
        if tid not in self._simulator_tracks:
            self._simulator_tracks.add(tid)
            self.sink.thread(SIMULATOR_PID, tid, _SIMULATOR_TRACKS[tid], tid)
        return tid

    def _record_corrections(self) -> None:
        """Rollbacks, and completion times the network changed after the engine read them:
        written to the trace; the latter counted as stale replies (what was placed from the old
        end stays: the engine reads an end only when something needs it)."""
        net = self.network
        assert net is not None
        for rb in net.take_rollbacks():
            tid = self._simulator_track(ROLLBACK_TRACK)
            self._rollbacks_written += 1
            self.sink.instant(SIMULATOR_PID, tid, f"rollback: {rb.label}", rb.to_ns, "rollback", {
                "network time ns": rb.network_time_ns, "rolled back from ns": rb.from_ns, "to ns": rb.to_ns,
                "flows rolled back": rb.flows_rolled_back,
                "corrections": [[c.label, c.old_end_ns, c.new_end_ns] for c in rb.corrections],
            })
        for c in net.take_corrections():
            self.stale_replies += 1
            error = c.new_end_ns - c.old_end_ns
            self.largest_stale_error_ns = max(self.largest_stale_error_ns, abs(error))
            self.sink.instant(SIMULATOR_PID, self._simulator_track(CORRECTION_TRACK), f"correction: {c.label}",
                              c.new_end_ns, "correction", {
                                  "collective": self._handle_works.get(c.handle), "old end ns": c.old_end_ns,
                                  "new end ns": c.new_end_ns, "error ns": error,
                                  "stale": "dependents were placed at the old end",
                              })

    def _work_wait(self, st: RankState, work: int, device: int, stream_id: int, host_blocks: bool) -> None:
        end = self.work_end_ns.get(work)
        if end is None:
            return
        stream = self._stream(st, device, stream_id)
        stream.tail_ns = max(stream.tail_ns, end)
        if host_blocks:
            self._host_sync(st, "ProcessGroupNCCL barrier", end)

    def abandon_collectives(self, rank: int) -> list[tuple[list[int], str]]:
        """`rank` ended: every collective it never joined fails for the members waiting in it."""
        failed = []
        for p in self.matcher.waiting_for(rank):
            call = next(iter(p.arrivals.values()))
            waiting = sorted(p.arrivals)
            failed.append((waiting, f"rank {rank} exited without joining {call.describe()} (collective #{call.seq} "
                                    f"of group {list(call.group)}) that rank(s) {waiting} are waiting in"))
            self._drop(p)
        return failed

    def _drop(self, p: PendingCollective) -> None:
        for call in p.arrivals.values():
            self._write_collective_launch(self.ranks[call.rank], call, ran=False)
        self.matcher.drop(p.key)
        work = self._key_works.pop(p.key, None)
        self.unresolved_works.discard(work)  # waits on it become no-ops; its members are failing

    def overdue_collectives(self, timeout_s: float) -> list[tuple[list[int], str]]:
        failed = []
        for p in self.matcher.overdue(timeout_s):
            call = next(iter(p.arrivals.values()))
            waiting = sorted(p.arrivals)
            failed.append((waiting, f"timed out after {timeout_s:.0f} s waiting for rank(s) {p.missing()} to join "
                                    f"{call.describe()} (collective #{call.seq} of group {list(call.group)}, called at "
                                    f"{call.site}); rank(s) {waiting} joined. A rank that skips a collective, or "
                                    f"calls collectives in a different order, hangs a real job the same way."))
            self._drop(p)
        return failed

    # --- end ----------------------------------------------------------------------------------
    def finish_rank(self, rank: int) -> None:
        st = self.ranks[rank]
        if st.finished:
            return
        st.finished = True
        end = st.timeline.host_ns
        while st.nvtx:  # ranges still open when the process ended
            name, start = st.nvtx.pop()
            self.sink.slice(st.info.trace_pid, HOST_TRACK, name, start, end - start, "nvtx", {"unclosed": True})

    def summary(self) -> EngineSummary:
        self.read_all_collectives()
        peak_alloc, peak_res = {}, {}
        for r, st in self.ranks.items():
            for d, m in st.memory.items():
                peak_alloc[(r, d)] = m.peak_allocated
                peak_res[(r, d)] = m.peak_reserved
        return EngineSummary(
            simulated_ns=max((max(st.timeline.host_ns, st.timeline.gpu_end_ns()) for st in self.ranks.values()), default=0),
            ranks=len(self.ranks),
            ops=sum(st.ops for st in self.ranks.values()),
            kernels=sum(st.kernels for st in self.ranks.values()),
            gpu_busy_ns=sum(st.gpu_busy_ns for st in self.ranks.values()),
            flops=sum(st.flops for st in self.ranks.values()),
            peak_allocated=peak_alloc,
            peak_reserved=peak_res,
            unknown_ops=dict(self.unknown_ops),
            warnings=list(self.warnings),
            ooms=sum(len(st.ooms) for st in self.ranks.values()),
            collectives=sum(st.collectives for st in self.ranks.values()),
            comm_busy_ns=self.comm_busy_ns,
            rollbacks=self._rollbacks_written,
            stale_replies=self.stale_replies,
            largest_stale_error_ns=self.largest_stale_error_ns,
            kernels_by_estimator=dict(self.kernels_by_estimator),
        )

    def _write_link_counters(self) -> None:
        """Each link's load over the run as counters. Written at the end, when rollbacks can no
        longer change them."""
        if self.network is None:
            return
        end = max((max(st.timeline.host_ns, st.timeline.gpu_end_ns()) for st in self.ranks.values()), default=0)
        segments = self.network.link_utilization(0, end + 1)
        if not segments:
            return
        names = {info.link: info.name for info in self.network.links()}
        self.sink.process(NETWORK_PID, "network", 1_000_000)
        for i, seg in enumerate(segments):  # sorted by link, then time
            name = f"link {names[seg.link]}"
            self.sink.counter(NETWORK_PID, name, seg.start_ns,
                              {"utilization": round(seg.utilization, 6), "GB/s": round(seg.load, 3)})
            nxt = segments[i + 1] if i + 1 < len(segments) else None
            if nxt is None or nxt.link != seg.link or nxt.start_ns != seg.end_ns:
                self.sink.counter(NETWORK_PID, name, seg.end_ns, {"utilization": 0.0, "GB/s": 0.0})

    def close(self, metadata: dict[str, Any]) -> None:
        try:
            self.read_all_collectives()
        except Exception as e:  # the trace must still close on every path
            self._warn(f"collectives not read from the network: {type(e).__name__}: {e}")
        for (_, rank), (_, _, call) in list(self._collective_launches.items()):  # collectives still waiting
            self._write_collective_launch(self.ranks[rank], call, ran=False)
        for r in list(self.ranks):
            self.finish_rank(r)
        try:
            self._write_link_counters()
        except Exception as e:  # the trace must still close on every path
            self._warn(f"link counters not written: {type(e).__name__}: {e}")
        self.sink.close(metadata)
