"""The simulator's engine: applies the record stream of every rank to its timelines, asks the
cost model for kernel times, answers calls, and writes everything to a trace sink.

Records arrive per rank in program order (phantora/protocol.py). A rank's records only touch
that rank's timeline, so ranks can be fed in any interleaving.

Collectives do not block the rank that issues them, as NCCL's do not: a rank joins, gets its
work id at once, and runs ahead. GPU work is placed lazily (phantora/engine/deferred.py): work
that depends on a collective's end (a stream that waits on it, the next collective on its
communication stream, a kernel the NCCL kernel may slow) waits on its stream until the end is
read. An end is read when it is final: no collective submitted later can start before it,
because every rank's clock is past it or provably waits for something later
(`_advance_final`). Ranks behind in simulated time therefore still move it, and what depends on
it is placed at the corrected end.

Only a host that must wait (a synchronize, a blocking copy, .item(), an event query) needs an end
before it is final. `sync="optimistic"` reads it then; a later correction to it is a stale
reply: counted, and shown on the simulator track. `sync="conservative"` holds the rank until the
end is final instead, so no reply is ever stale; a rank held for longer than `stall_s` of
wall time without progress is answered optimistically, with a warning, rather than hang.
"""

from __future__ import annotations

import sys
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any, Callable

import orjson
from phantora import protocol as P
from phantora.cost import COPY_D2H, COPY_H2D, NO_GPU_WORK, Estimator, KernelEstimate
from phantora.cost.copies import copy_endpoints
from phantora.cost.host import HOST_COSTS, host_event_ns, python_overhead_ns
from phantora.engine.collectives import CollectiveCall, CollectiveMatcher, CollectiveMismatch, PendingCollective
from phantora.engine.deferred import Action, Arrive, EventRecord, EventWait, LowerBounds, OpWork, WorkWait, replay_lower_bounds
from phantora.engine.timeline import RankTimeline, Stream, TimingConfig
from phantora.hardware import GPUSpec
from phantora.net.network import Network
from phantora.net.records import CollectiveSpec
from phantora.ops import OpSignature, TensorMeta
from phantora.trace import TraceSink

HOST_TRACK = 1
STEP_TRACK = 2  # "ProfilerStep#N" slices, one per optimizer step (the name Kineto and HTA use)
SYNC_MODES = ("optimistic", "conservative")
_NEVER = 1 << 62  # a time no rank reaches (bound of a finished rank)
_MAX_ARG_SHAPES = 16
SIMULATOR_PID = 0  # trace process for rollback corrections and stale replies
ROLLBACK_TRACK, CORRECTION_TRACK = 1, 2  # its threads
_SIMULATOR_TRACKS = {ROLLBACK_TRACK: "network rollbacks", CORRECTION_TRACK: "corrections to ends already used"}
NETWORK_PID = 1_000_000  # trace process for the network's link counters
PROVISIONAL_PID_BASE = 900_000  # trace pids of rank processes whose rank + 1 was taken
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


def _union_ns(spans: list[tuple[int, int]]) -> int:
    """Total length of the union of [begin, end) spans."""
    total, reach = 0, None
    for b, e in sorted(spans):
        if reach is None or b > reach:
            total += e - b
            reach = e
        elif e > reach:
            total += e - reach
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
    # The node's GPUs the process sees, cuda:i being devices[i] (CUDA_VISIBLE_DEVICES); () all.
    devices: tuple[int, ...] = ()
    # False: the rank is a guess (no RANK in the environment) that init_process_group settles
    # (Engine.identify_rank); until then another process may claim it.
    certain: bool = True
    trace_pid: int = 0  # the process's trace pid, fixed for the run (add_rank): rank + 1 if free

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
    blocked: "_HostWait | None" = None  # the host waits for a time not known yet
    blocked_call: "_Target | None" = None  # a call waits for a time not known yet


@dataclass
class _Target:
    """What a host wait or a call waits for: a stream's or a device's tail, an event, an op's
    end, or a collective's end."""

    kind: str  # "stream" | "device" | "event" | "op" | "work"
    stream: Stream | None = None
    device: int = 0
    action: Action | None = None
    work: int = 0


@dataclass
class _HostWait:
    name: str  # of the cuda_runtime slice it writes ("" for a blocking copy: the op's slice covers it)
    target: _Target
    start_ns: int
    op_slice: tuple[str, int, dict[str, Any], int] | None = None  # (name, begin, args, flow) of a blocking op


class _NotYet:
    """A call's answer depends on a time not known yet: the caller holds the call and retries
    when take_unblocked names the rank."""


NOT_YET = _NotYet()


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
    early_reads: int = 0  # collective ends a host waited for before they were final
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


_COPY_OPS = frozenset({"aten::_to_copy", "aten::copy_", "aten::_copy_from", "aten::_copy_from_and_resize"})


def _op_device(sig: OpSignature) -> int | None:
    """The device whose stream runs the op: a copy between two GPUs runs on the source's
    (copy_kernel_cuda), every other op on the device of its first CUDA tensor."""
    if sig.name in _COPY_OPS:
        e = copy_endpoints(sig)
        if e is not None and e.is_peer:
            return e.src.device_index
    return sig.cuda_device()


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
        sync: str = "optimistic",
    ) -> None:
        if sync not in SYNC_MODES:
            raise ValueError(f"sync: {sync!r} is not one of {', '.join(SYNC_MODES)}")
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
        self._stale_errors: dict[int, int] = {}  # work -> its final end minus the end that was used
        self._rollbacks_written = 0
        self._simulator_tracks: set[int] = set()
        # (collective key, rank) -> host begin and end of that rank's call, until the collective runs
        self._collective_launches: dict[tuple[Any, int], tuple[int, int, CollectiveCall]] = {}
        self.sync = sync
        self.expected_ranks = 0  # WORLD_SIZE the ranks announced: nothing is final before all joined
        self._trace_pids: set[int] = set()
        self._provisionals = 0
        self.moved: dict[int, int] = {}  # rank -> provisional id it was moved to (the server follows, then clears)
        self.final_ns = 0  # proven: no collective submitted from now on starts before this
        self._collectives: dict[int, PendingCollective] = {}  # work -> joined, not submitted yet
        self._arrivals: dict[tuple[int, int], Arrive] = {}  # (work, rank) -> that member's call, until placed
        self._dropped: set[int] = set()  # collectives that never ran (a member never joined)
        self._placing: set[int] = set()  # id() of the streams being placed
        self._wanted: set[int] = set()  # times up to which a kernel needs the network to be final
        self._seq = 0  # program order of GPU work, over all ranks
        self.early_reads = 0  # ends read before they were final (a host had to wait for them)
        self._closing = False
        self._warn = warn or (lambda msg: print(f"phantora: warning: {msg}", file=sys.stderr, flush=True))

    # --- ranks --------------------------------------------------------------------------------
    def add_rank(self, info: RankInfo) -> RankState:
        """A process joins as `info.rank`. A process whose rank is only a guess (info.certain
        False) and finds it taken joins under a provisional id (< 0) until init_process_group
        names its rank (identify_rank); a certain claimant displaces a guessing holder so."""
        holder = self.ranks.get(info.rank)
        if holder is not None:
            if info.certain and holder.info.certain:
                raise CallError(self._claim_error(info.rank, holder.info.pid, info.pid))
            if not info.certain:
                info.rank = self._provisional_id()
            else:
                self.moved[holder.info.rank] = self._move(holder, self._provisional_id())
        info.trace_pid = info.rank + 1 if info.rank >= 0 and info.rank + 1 not in self._trace_pids else \
            PROVISIONAL_PID_BASE + len(self._trace_pids)
        self._trace_pids.add(info.trace_pid)
        state = RankState(info, RankTimeline(info.rank, self.timing))
        self.ranks[info.rank] = state
        self.sink.thread(info.trace_pid, HOST_TRACK, "host (aten op launches)", 0)
        if info.certain:
            self._name_process(state)
        return state

    def identify_rank(self, rank: int, new: int, node: int, local_rank: int, world_size: int) -> None:
        """The process known as `rank` called init_process_group as `new` of `world_size`: what
        torch uses from now on. A process that only guessed `new` moves to a provisional id
        (`moved` says where, so the server can follow); one that is certain of it is an error."""
        st = self.ranks[rank]
        if new != rank:
            holder = self.ranks.get(new)
            if holder is not None:
                if holder.info.certain:
                    raise CallError(self._claim_error(new, holder.info.pid, st.info.pid))
                self.moved[new] = self._move(holder, self._provisional_id())
            self._move(st, new)
        st.info.node, st.info.local_rank, st.info.certain = node, local_rank, True
        self.expected_ranks = max(self.expected_ranks, world_size)
        self._name_process(st)

    def _claim_error(self, rank: int, pid_a: int, pid_b: int) -> str:
        return (f"two processes claim rank {rank} (pids {pid_a} and {pid_b}); each rank process must have a "
                "distinct rank: RANK as torchrun sets it, or the rank passed to init_process_group")

    def _provisional_id(self) -> int:
        self._provisionals += 1
        return -self._provisionals

    def _move(self, st: RankState, new: int) -> int:
        """Re-key a rank that has not called any collective yet (its trace pid stays)."""
        old = st.info.rank
        if st.collectives or any(r == old for (_, r) in self._arrivals):
            raise CallError(f"rank {old} already called collectives under that rank; it cannot become rank {new}")
        del self.ranks[old]
        st.info.rank = st.timeline.rank = new
        self.ranks[new] = st
        if old in self._unblocked:
            self._unblocked.discard(old)
            self._unblocked.add(new)
        return new

    def _name_process(self, st: RankState) -> None:
        """Name the rank's trace process (and again its tracks, for sinks that ignore tracks of
        processes they cannot name yet): written when the rank is certain."""
        info = st.info
        pid = info.trace_pid
        gpus = ",".join(str(d) for d in info.devices) if info.devices and len(info.devices) < self.gpus_per_node \
            else str(info.local_rank)
        label = f"rank {info.rank}" if info.rank >= 0 else f"rank ? (process {info.pid}, rank not known)"
        self.sink.process(pid, f"{label} · node {info.node} · GPU {gpus} · {self.gpu.aliases[0].upper()}",
                          info.rank if info.rank >= 0 else PROVISIONAL_PID_BASE - info.rank)
        self.sink.thread(pid, HOST_TRACK, "host (aten op launches)", 0)
        for stream in st.timeline.streams.values():
            if stream.stream_id >= 0:
                self.sink.thread(pid, stream.track, self._stream_label(info, stream.device, stream.stream_id), stream.track)

    # --- records ------------------------------------------------------------------------------
    def apply(self, rank: int, records: list[list[Any]]) -> int:
        """Apply records in order; the number applied. Fewer than all: the rank's host waits for
        a time not known yet (retry the rest after take_unblocked names the rank)."""
        st = self.ranks[rank]
        if st.blocked is not None and not self._resume(st):
            return 0
        tl = st.timeline
        for i, rec in enumerate(records):
            kind = rec[0]
            if kind == P.R_OP:
                self._op(st, rec[1], rec[2], rec[3])
            elif kind == P.R_SIG:
                self._define_sig(st, rec[1], rec[2])
            elif kind == P.R_MEM:
                self._memory(st, rec[1], rec[2], rec[3])
            elif kind == P.R_EVENT_RECORD:
                stream = self._stream(st, rec[2], rec[3])
                tl.advance_host(self.timing.event_record_host_ns)
                record = EventRecord(self._next_seq(), stream, rec[1], tl.host_ns)
                st.event_src[rec[1]] = record
                self._enqueue(st, record)
            elif kind == P.R_EVENT_WAIT:
                stream = self._stream(st, rec[2], rec[3])
                tl.advance_host(self.timing.event_record_host_ns)
                # waiting on an event that was never recorded is a no-op, as in CUDA
                self._enqueue(st, EventWait(self._next_seq(), stream, st.event_src.get(rec[1])))
            elif kind == P.R_SYNC_DEVICE:
                self._host_wait(st, "cudaDeviceSynchronize", _Target("device", device=rec[1]))
            elif kind == P.R_SYNC_STREAM:
                self._host_wait(st, "cudaStreamSynchronize", _Target("stream", stream=self._stream(st, rec[1], rec[2])))
            elif kind == P.R_SYNC_EVENT:
                self._host_wait(st, "cudaEventSynchronize", _Target("event", action=st.event_src.get(rec[1])))
            elif kind == P.R_NVTX_PUSH:
                st.nvtx.append((str(rec[1]), tl.host_ns))
                # The range is written when it closes (R_NVTX_POP, finish_rank); announced now so
                # sinks that write begin events in time order can start it here.
                self.sink.open_slice(st.info.trace_pid, HOST_TRACK, str(rec[1]), tl.host_ns, "nvtx")
            elif kind == P.R_NVTX_POP:
                if st.nvtx:
                    name, start = st.nvtx.pop()
                    self.sink.slice(st.info.trace_pid, HOST_TRACK, name, start, tl.host_ns - start, "nvtx")
            elif kind == P.R_SLEEP:
                tl.advance_host(int(rec[1]))
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
                self.sink.instant(st.info.trace_pid, HOST_TRACK, "CUDA out of memory", tl.host_ns, "memory",
                                  {"device": rec[1], "requested_bytes": rec[2], "message": rec[3]})
            else:
                raise CallError(f"unknown record kind {kind!r} from rank {rank}")
            if st.blocked is not None:
                return i + 1
        return len(records)

    # --- lazy placement (phantora/engine/deferred.py) -----------------------------------------
    def _next_seq(self) -> int:
        self._seq += 1
        return self._seq

    def _enqueue(self, st: RankState, action: Action) -> None:
        st.actions.append(action)
        action.stream.queue.append(action)
        if len(action.stream.queue) == 1:
            self._place_stream(st, action.stream, None, force=False)

    def _place_stream(self, st: RankState, stream: Stream, upto: Action | None, force: bool) -> bool:
        """Place `stream`'s waiting work in order, through `upto` (all of it, and the end of the
        collective in flight on it, if None). False when it needs an end that cannot be read yet
        (force: read ends that are not final yet; False only for collectives some member has
        not joined)."""
        if upto is not None and upto.placed:
            return True
        if id(stream) in self._placing:  # the program waits on itself: a real GPU hangs too
            return False
        self._placing.add(id(stream))
        try:
            while True:
                if stream.inflight is not None and (stream.queue or upto is None):
                    if self._collective_end(stream.inflight, force) is None:
                        return False
                    stream.inflight = None
                if not stream.queue:
                    return True
                action = stream.queue[0]
                if not self._place_action(st, action, force):
                    return False
                stream.queue.popleft()
                action.placed = True
                action.tail_ns = stream.tail_ns
                if action is upto:
                    return True
        finally:
            self._placing.discard(id(stream))

    def _place_action(self, st: RankState, a: Action, force: bool) -> bool:
        s = a.stream
        if isinstance(a, OpWork):
            return self._place_op(st, a, force)
        if isinstance(a, EventRecord):
            a.time_ns = max(a.host_ns + self.timing.launch_latency_ns, s.tail_ns)
            st.timeline.events[a.event_id] = a.time_ns
            return True
        if isinstance(a, EventWait):
            src = a.source
            if src is not None:
                if not src.placed and not self._place_stream(st, src.stream, src, force):
                    return False
                s.tail_ns = max(s.tail_ns, src.time_ns or 0)
            return True
        if isinstance(a, WorkWait):
            end = self._collective_end(a.work, force)
            if end is None:
                return False
            s.tail_ns = max(s.tail_ns, end)
            return True
        assert isinstance(a, Arrive)
        current = self._current_tail(st, a, force)
        if current is None:
            return False
        a.ready_ns = max(a.host_ns + self.timing.launch_latency_ns, current, s.tail_ns)
        self._arrivals.pop((a.work, st.info.rank), None)
        p = self._collectives.get(a.work)
        if p is not None:  # not dropped
            s.inflight = a.work
            p.ready_ns[st.info.rank] = a.ready_ns
            self._maybe_submit(a.work)
        return True

    def _current_tail(self, st: RankState, a: Arrive, force: bool) -> int | None:
        """The tail of the caller's current stream as of the collective call (Arrive)."""
        s = a.stream
        if a.current is s:
            return s.tail_ns
        dep = a.current_dep
        if dep is not None:
            if not self._place_stream(st, a.current, dep, force):
                return None
            return dep.tail_ns
        if a.current_inflight is None:
            return a.current_tail
        end = self._collective_end(a.current_inflight, force)
        return None if end is None else max(a.current_tail, end)

    def _place_op(self, st: RankState, a: OpWork, force: bool) -> bool:
        s, est, sig = a.stream, a.est, a.sig
        start = max(a.launch_ns + self.timing.launch_latency_ns, s.tail_ns)
        raw_end = start + est.duration_ns
        slowed = 0
        if a.slows:
            overlap = self._comm_overlap(st, a.device, a.seq, start, raw_end, force)
            if overlap is None:
                return False
            slowed = int(self.timing.comm_slowdown * overlap)
        a.end_ns = s.tail_ns = raw_end + slowed
        st.gpu_busy_ns += est.duration_ns + slowed
        shapes, dtypes = _shape_args(sig)
        estimator = est.estimator if est.known else f"{est.estimator} (unknown op: generic)"
        cat = "kernel" if est.kind not in (COPY_D2H, COPY_H2D) else "gpu_memcpy"
        self.sink.slice(st.info.trace_pid, s.track, est.kernel_name, start, a.end_ns - start, cat, {
            "op": sig.full_name, "shapes": shapes, "dtypes": dtypes, "flops": est.flops, "bytes": est.bytes,
            "kernels": est.kernels, "estimator": estimator,
            "device": a.device, "stream": s.stream_id, "correlation": a.flow,
            **({"slowed by concurrent communication ns": slowed} if slowed else {}),
        }, flow_in=a.flow)
        return True

    def _comm_overlap(self, st: RankState, device: int, seq: int, start: int, end: int, force: bool) -> int | None:
        """How much of [start, end) the NCCL kernels of collectives this rank called on `device`
        before program position `seq` cover; None if an end it needs cannot be read yet."""
        log = st.comm_log.get(device)
        if not log:
            return 0
        spans = []
        for a in log:
            if a.seq > seq:
                break
            if not a.placed and a.host_ns + self.timing.launch_latency_ns >= end:
                continue  # its NCCL kernel cannot start before `end`
            if not a.placed and not self._place_stream(st, a.stream, a, force):
                # It queues behind the collective in flight on its communicator (NCCL runs them
                # in order): if that one still runs at `end`, this one starts after.
                inflight = a.stream.inflight
                if inflight is not None and self._clipped_end(inflight, end, force) == end:
                    continue
                self._wanted.add(end)
                return None
            ready = a.ready_ns
            assert ready is not None
            if ready >= end:
                continue
            done = self._clipped_end(a.work, end, force)
            if done is None:
                self._wanted.add(end)
                return None
            if done > max(ready, start):
                spans.append((max(ready, start), done))
        if len(log) > 64:  # forget collectives that ended before anything still to be placed can start
            floor = min([st.timeline.host_ns] + [x.tail_ns for x in st.timeline.streams.values() if x.device == device])
            log[:] = [a for a in log if not (a.placed and self.work_end_ns.get(a.work, floor) < floor)]
        return _union_ns(spans)

    # --- collective ends ----------------------------------------------------------------------
    def _collective_end(self, work: int, force: bool) -> int | None:
        """The end of collective `work`, read from the network if it is final (or `force`);
        None if it cannot be read yet. 0 for a collective that never ran."""
        end = self.work_end_ns.get(work)
        if end is not None:
            return end
        if work in self._dropped:
            return 0
        if work not in self._unread and not (force and self._force_arrivals(work)):
            return None
        sub = self._unread.get(work)
        if sub is None:
            return self.work_end_ns.get(work)
        if sub.handle is not None and not self._is_final(sub):
            if not force:
                return None
            self.early_reads += 1
        self._read_collective(work)
        return self.work_end_ns[work]

    def _clipped_end(self, work: int, t: int, force: bool) -> int | None:
        """min(end of `work`, t): known once the end is, or once nothing can start before t."""
        end = self.work_end_ns.get(work)
        if end is not None:
            return min(end, t)
        if work in self._dropped:
            return 0
        if t <= self.final_ns and not force:
            sub = self._unread.get(work)
            if sub is None or sub.handle is None:  # submitted later, so it starts (and ends) after t
                return t if sub is None else min(sub.start_ns, t)
            if self.network.provisional_end(sub.handle) > t:  # type: ignore[union-attr]
                return t  # the network up to t is final: it still runs at t
        end = self._collective_end(work, force)
        return None if end is None else min(end, t)

    def _is_final(self, sub: _SubmittedCollective) -> bool:
        assert self.network is not None and sub.handle is not None
        end = self.network.provisional_end(sub.handle)
        return end is not None and end <= self.final_ns

    def _force_arrivals(self, work: int) -> bool:
        """Place every member's arrival at `work` (reading ends early); False if some member
        has not joined it."""
        p = self._collectives.get(work)
        if p is None or p.missing():
            return False
        for r in p.members:
            a = self._arrivals.get((work, r))
            if a is not None and not self._place_stream(self.ranks[r], a.stream, a, True):
                return False
        return work in self._unread or work in self.work_end_ns

    def _maybe_submit(self, work: int) -> None:
        p = self._collectives.get(work)
        if p is None or p.missing() or len(p.ready_ns) < len(p.members):
            return
        del self._collectives[work]
        self._submit_collective(p, work)

    # --- host waits ---------------------------------------------------------------------------
    def _host_wait(self, st: RankState, name: str, target: _Target,
                   op_slice: tuple[str, int, dict[str, Any], int] | None = None) -> None:
        st.blocked = _HostWait(name, target, st.timeline.host_ns, op_slice)
        self._resume(st)

    def _resume(self, st: RankState, force: bool | None = None) -> bool:
        """Finish the host wait `st` is blocked in if its time is known; False if not yet."""
        w = st.blocked
        assert w is not None
        t = self._target_ns(st, w.target, self.sync == "optimistic" if force is None else force)
        if t is None:
            return False
        st.blocked = None
        tl = st.timeline
        tl.wait_host_until(t, self.timing.sync_overhead_ns)
        pid = st.info.trace_pid
        if w.op_slice is not None:
            name, begin, args, flow = w.op_slice
            self.sink.slice(pid, HOST_TRACK, name, begin, tl.host_ns - begin, "cpu_op", args, flow_out=flow)
        else:
            self.sink.slice(pid, HOST_TRACK, w.name, w.start_ns, tl.host_ns - w.start_ns, "cuda_runtime")
        return True

    def _target_ns(self, st: RankState, target: _Target, force: bool) -> int | None:
        kind = target.kind
        if kind == "stream":
            assert target.stream is not None
            return target.stream.tail_ns if self._place_stream(st, target.stream, None, force) else None
        if kind == "device":
            for s in list(st.timeline.streams.values()):
                if s.device == target.device and not self._place_stream(st, s, None, force):
                    return None
            return st.timeline.device_idle_ns(target.device)
        if kind in ("event", "op"):
            a = target.action
            if a is None:  # an event never recorded: done at once, as in CUDA
                return 0
            if not self._place_stream(st, a.stream, a, force):
                return None
            t = a.time_ns if isinstance(a, EventRecord) else a.end_ns  # type: ignore[attr-defined]
            return t or 0
        return self._collective_end(target.work, force)

    def _work_wait(self, st: RankState, work: int, device: int, stream_id: int, host_blocks: bool) -> None:
        if not 0 < work <= self._work_ids:  # a work this engine never handed out: nothing to wait for
            return
        stream = self._stream(st, device, stream_id)
        self._enqueue(st, WorkWait(self._next_seq(), stream, work))
        if host_blocks:
            self._host_wait(st, "ProcessGroupNCCL barrier", _Target("work", work=work))

    # --- finality -----------------------------------------------------------------------------
    def progress(self) -> None:
        """Prove more ends final, read them, place the work that waited for them, and finish the
        host waits and calls that can finish now (take_unblocked names their ranks)."""
        while True:  # ends while the horizon moves (it only moves forward)
            before = self.final_ns
            self._advance_final(self._cheap_bound())
            self._place_waiting()
            need_proof = self._closing or (self.sync == "conservative" and self._blocked_ranks())
            if need_proof and not self._resume_blocked():
                self._advance_final(self._proven_horizon())
                self._place_waiting()
            self._resume_blocked()
            if self.final_ns == before:
                break

    def _advance_final(self, t: int) -> None:
        if t > self.final_ns:
            self.final_ns = t

    def _place_waiting(self) -> None:
        for st in self.ranks.values():
            for s in list(st.timeline.streams.values()):
                if s.queue or s.inflight is not None:
                    self._place_stream(st, s, None, force=False)
            while st.actions and st.actions[0].placed:
                st.actions.popleft()

    def _blocked_ranks(self) -> list[RankState]:
        return [st for st in self.ranks.values() if not st.finished and (st.blocked or st.blocked_call)]

    def _resume_blocked(self, force: bool | None = None) -> bool:
        """Finish what blocked ranks wait for, where possible; True if any could go on."""
        resumed = False
        for st in self._blocked_ranks():
            if st.blocked is not None and self._resume(st, force):
                self._unblocked.add(st.info.rank)
                resumed = True
            elif st.blocked_call is not None and st.blocked is None:
                f = self.sync == "optimistic" if force is None else force
                if self._target_ns(st, st.blocked_call, f) is not None:
                    self._unblocked.add(st.info.rank)
                    resumed = True
        return resumed

    def host_blocked(self, rank: int) -> bool:
        """Is `rank`'s host waiting for a time not known yet (its later records and calls wait)?"""
        st = self.ranks.get(rank)
        return st is not None and st.blocked is not None

    def blocked(self) -> bool:
        """Is some rank's host or call waiting for an end not known yet?"""
        return bool(self._blocked_ranks())

    def force_blocked(self, waited_s: float) -> None:
        """No progress for `waited_s` of wall time while ranks wait (conservative sync can stall
        when ranks also synchronise outside the simulator, e.g. through the c10d store): answer
        them with the ends as they stand, as the optimistic mode does."""
        ranks = sorted(st.info.rank for st in self._blocked_ranks())
        self._warn_once(f"--sync conservative: rank(s) {ranks} waited {waited_s:.0f} s of wall time for collective "
                        "ends that could not be proven final (ranks may also be waiting on each other outside "
                        "the simulator); they were answered with the ends as they stand, which may be stale")
        self._resume_blocked(force=True)

    def _cheap_bound(self) -> int:
        """No collective can start before this: each rank's next one is ready a launch latency
        after its host clock at the earliest, and each waiting arrival after the host time it
        was called at."""
        if not self.ranks or len(self.ranks) < self.expected_ranks:
            return self.final_ns
        lat = self.timing.launch_latency_ns
        bound = min((st.timeline.host_ns + lat for st in self.ranks.values() if not self._done(st)), default=_NEVER)
        return min([bound] + [a.host_ns + lat for a in self._arrivals.values()])

    def _done(self, st: RankState) -> bool:
        """Will this rank call no more collectives?"""
        return st.finished or self._closing

    def _proven_horizon(self) -> int:
        """The latest time T proven to be before every future collective start, using lower
        bounds of what blocked ranks wait for (`_min_bound`). Tries the provisional ends of
        unread collectives as T, so a rank that waits directly for one does not hold it back."""
        t = self.final_ns
        candidates = sorted({e for sub in self._unread.values() if sub.handle is not None
                             for e in [self.network.provisional_end(sub.handle)] if e is not None and e > t}  # type: ignore[union-attr]
                            | {x for x in self._wanted if x > t})
        self._wanted.clear()
        changed = True
        while changed:
            changed = False
            bound = self._min_bound(t)
            if bound > t:
                t, changed = bound, True
            for c in candidates:
                if c <= t:
                    continue
                if self._min_bound(c) < c:
                    break
                t, changed = c, True
        return t

    def _min_bound(self, t: int) -> int:
        """A lower bound of every future collective start, valid if no collective that is not
        final ends before t (its end is then bounded by min(provisional end, t)). If it is at
        least t, no collective starts before t (each step from an end to a start takes time)."""
        if not self.ranks or len(self.ranks) < self.expected_ranks:
            return self.final_ns
        lat = self.timing.launch_latency_ns
        # valid to start from: a rank's next collective is ready a launch latency after its host
        # clock, and each of its waiting arrivals a launch latency after it was called
        bounds = {r: (_NEVER if self._done(st) else st.timeline.host_ns + lat) for r, st in self.ranks.items()}
        for (_, r), a in self._arrivals.items():
            bounds[r] = min(bounds[r], a.host_ns + lat)
        arrivals: dict[tuple[int, int], int] = {}
        for _ in range(4):
            new_arrivals: dict[tuple[int, int], int] = {}
            new_bounds = {}
            for r, st in self.ranks.items():
                known = dict(arrivals)

                def end_lb(work: int, ready: int, r: int = r, known: dict = known) -> int:
                    return self._end_lower_bound(work, ready, t, r, bounds, known)
                lb = replay_lower_bounds(list(st.actions), lat, end_lb)
                for w, ready in lb.arrivals.items():
                    new_arrivals[(w, r)] = known[(w, r)] = max(ready, known.get((w, r), 0))
                future = _NEVER if self._done(st) else st.timeline.host_ns + lat  # collectives it has not called yet
                waits = st.blocked.target if st.blocked is not None else st.blocked_call
                if waits is not None and not self._done(st):
                    future = max(future, self._target_lower_bound(st, waits, lb, end_lb)
                                 + self.timing.sync_overhead_ns + lat)
                new_bounds[r] = max(bounds[r], min([future, *lb.arrivals.values()]))
            arrivals = new_arrivals
            if new_bounds == bounds:
                break
            bounds = new_bounds
        return min(bounds.values())

    def _end_lower_bound(self, work: int, ready: int, t: int, me: int, bounds: dict[int, int],
                         arrivals: dict[tuple[int, int], int]) -> int:
        end = self.work_end_ns.get(work)
        if end is not None:
            return end
        if work in self._dropped:
            return 0
        sub = self._unread.get(work)
        if sub is not None:
            if sub.handle is None:
                return sub.start_ns
            prov = self.network.provisional_end(sub.handle)  # type: ignore[union-attr]
            return max(sub.start_ns, min(prov if prov is not None else t, t))
        p = self._collectives.get(work)
        if p is None:
            return ready
        lb = ready
        for m in p.members:  # it starts when its last member's stream reaches it
            if m in p.ready_ns:
                lb = max(lb, p.ready_ns[m])
            else:
                lb = max(lb, arrivals.get((work, m), bounds.get(m, 0)))
        return lb

    def _target_lower_bound(self, st: RankState, target: _Target, lb: LowerBounds,
                            end_lb: Callable[[int, int], int]) -> int:
        def tail(s: Stream) -> int:
            t = lb.tails.get(id(s))
            if t is not None:
                return t
            return s.tail_ns if s.inflight is None else max(s.tail_ns, end_lb(s.inflight, s.tail_ns))

        kind = target.kind
        if kind == "stream":
            assert target.stream is not None
            return tail(target.stream)
        if kind == "device":
            return max((tail(s) for s in st.timeline.streams.values() if s.device == target.device), default=0)
        if kind in ("event", "op"):
            a = target.action
            if a is None:
                return 0
            if a.placed:
                return (a.time_ns if isinstance(a, EventRecord) else a.end_ns) or 0  # type: ignore[attr-defined]
            return lb.times.get(id(a), 0)
        return end_lb(target.work, 0)

    def place_all(self) -> None:
        """Place all waiting work that can be, reading the ends it needs, final or not."""
        for st in self.ranks.values():
            for s in list(st.timeline.streams.values()):
                self._place_stream(st, s, None, force=True)
            while st.actions and st.actions[0].placed:
                st.actions.popleft()

    def read_all_collectives(self) -> None:
        """Place all waiting work, reading every end (the run is over: nothing can arrive
        before them). Collectives some member never joined never run."""
        for p in list(self.matcher.pending.values()):
            self._drop(p)
        self._closing = True  # no rank calls anything any more; what they called still counts
        self.progress()
        self.place_all()
        for work in sorted(self._unread):
            self._read_collective(work)

    def collective_end_ns(self, work: int) -> int | None:
        """When collective `work` completes (reading it from the network, final or not); None
        while some member has not joined it, or for one that never ran."""
        end = self._collective_end(work, force=True)
        return None if work in self._dropped else end

    def take_unblocked(self) -> set[int]:
        """Ranks whose host wait finished, or whose held call can now be answered."""
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
            self.sink.thread(st.info.trace_pid, stream.track, self._stream_label(st.info, device, stream_id), stream.track)
        return stream

    def _stream_label(self, info: RankInfo, device: int, stream_id: int) -> str:
        label = "default stream" if stream_id == 0 else f"stream {stream_id}"
        physical = info.physical_gpu(device)
        return f"cuda:{device} {label}" + (f" (GPU {physical} of the node)" if physical != device else "")

    def _next_flow(self) -> int:
        self._flow_ids += 1
        return self._flow_ids

    def _op(self, st: RankState, sig_id: int, stream_id: int, flags: int) -> None:
        sig, est = st.sigs[sig_id]
        tl = st.timeline
        st.ops += 1
        if not est.known:
            self.unknown_ops[sig.full_name] += 1
        device = _op_device(sig)
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
        slows = bool(self.timing.comm_slowdown) and est.kind not in (COPY_D2H, COPY_H2D)
        st.kernels += est.kernels
        estimator = est.estimator if est.known else f"{est.estimator} (unknown op: generic)"
        self.kernels_by_estimator[estimator] += est.kernels
        st.flops += est.flops
        flow = self._next_flow()
        work = OpWork(self._next_seq(), stream, sig, est, launch, flow, device, slows)
        shapes, _ = _shape_args(sig)
        args = {"Input Dims": shapes, "correlation": flow, "python_overhead_ns": overhead}
        self._enqueue(st, work)
        if host_waits_for_copy(sig, est) or sig.name == "aten::_local_scalar_dense":
            # the op's host slice lasts until the copy is done, so it is written then
            self._host_wait(st, "", _Target("op", action=work), (sig.name, begin, args, flow))
            return
        self.sink.slice(pid, HOST_TRACK, sig.name, begin, tl.host_ns - begin, "cpu_op", args, flow_out=flow)

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

    def _call_wait(self, st: RankState, target: _Target) -> int | None:
        """The time a call needs; None (and the rank's call is held) if not known yet."""
        t = self._target_ns(st, target, self.sync == "optimistic")
        st.blocked_call = target if t is None else None
        return t

    def elapsed_ms(self, rank: int, start_event: int, end_event: int) -> float | _NotYet:
        st = self.ranks[rank]
        a, b = st.event_src.get(start_event), st.event_src.get(end_event)
        if a is None or b is None:
            raise CallError("elapsed_time: both events must have been recorded before computing the elapsed time")
        ta = self._call_wait(st, _Target("event", action=a))
        tb = None if ta is None else self._call_wait(st, _Target("event", action=b))
        if ta is None or tb is None:
            return NOT_YET
        return (tb - ta) / 1e6

    def query_event(self, rank: int, event_id: int) -> bool | _NotYet:
        st = self.ranks[rank]
        t = self._call_wait(st, _Target("event", action=st.event_src.get(event_id)))
        if t is None:
            return NOT_YET
        tl = st.timeline
        tl.advance_host(self.timing.event_query_host_ns)
        return t <= tl.host_ns

    def query_stream(self, rank: int, device: int, stream_id: int) -> bool | _NotYet:
        st = self.ranks[rank]
        t = self._call_wait(st, _Target("stream", stream=self._stream(st, device, stream_id)))
        if t is None:
            return NOT_YET
        tl = st.timeline
        tl.advance_host(self.timing.event_query_host_ns)
        return t <= tl.host_ns

    # --- collectives ---------------------------------------------------------------------------
    def join_collective(self, rank: int, wire: dict[str, Any]) -> int:
        """One rank calls a collective: its work id, at once (the rank's communication stream
        reaches it later, see Arrive). CollectiveMismatch once the members disagree."""
        st = self.ranks[rank]
        try:
            call = CollectiveCall.from_wire(rank, wire)
        except (KeyError, ValueError, TypeError) as e:
            raise CallError(f"malformed collective call from rank {rank}: {e}") from None
        try:
            p = self.matcher.join(call)
        except CollectiveMismatch:
            work = self._key_works.pop(call.key, None)
            if work is not None:  # the members that joined never get to run it
                self._dropped.add(work)
                self._collectives.pop(work, None)
                self.unresolved_works.discard(work)
            raise
        comm = self._comm_stream(st, call)
        tl = st.timeline
        launch_begin = tl.host_ns
        tl.advance_host(HOST_COSTS.collective_ns)
        self._collective_launches[(call.key, rank)] = (launch_begin, tl.host_ns, call)
        # Written by _write_collective_launch once the collective has run; announced now, when the
        # rank's host track reaches it.
        self.sink.open_slice(st.info.trace_pid, HOST_TRACK, f"nccl:{call.op}", launch_begin, "cpu_op", end_ns=tl.host_ns)
        current = self._stream(st, call.device, call.stream)
        work = self._key_works.get(call.key)
        if work is None:
            self._work_ids += 1
            work = self._key_works[call.key] = self._work_ids
            self.unresolved_works.add(work)
            self._collectives[work] = p
        if not p.missing():  # every member has joined
            self._key_works.pop(call.key, None)
            self.unresolved_works.discard(work)
        arrive = Arrive(self._next_seq(), comm, call, work, current, tl.host_ns)
        self._arrivals[(work, rank)] = arrive
        st.comm_log.setdefault(call.device, []).append(arrive)
        self._enqueue(st, arrive)
        return work

    def _comm_stream(self, st: RankState, call: CollectiveCall) -> Stream:
        # Send and receive of a pair get a stream each: NCCL runs a batch_isend_irecv group's
        # send and receive to one peer concurrently.
        key = (call.device, call.group_name, call.group, call.net_op == "send_recv")
        sid = st.comm_streams.get(key)
        if sid is None:
            sid = st.comm_streams[key] = -1 - len(st.comm_streams)
        stream, new = st.timeline.stream(call.device, sid)
        if new:
            what = "p2p " + "->".join(map(str, call.group)) if call.net_op == "send_recv" else f"group {list(call.group)}"
            if any(k[0] == call.device and k[2:] == key[2:] and k != key for k in st.comm_streams):
                what += f" (process group {call.group_name!r})"  # another group has the same ranks
            self.sink.thread(st.info.trace_pid, stream.track, f"cuda:{call.device} nccl {what}", stream.track)
        return stream

    def global_gpu(self, rank: int) -> int:
        info = self.ranks[rank].info
        return info.node * self.gpus_per_node + info.local_rank

    def _submit_collective(self, p: PendingCollective, work: int) -> None:
        """Every member's stream has reached it: hand the collective to the network; its end is
        read later (`_read_collective`), when it is final or a host must wait for it."""
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
            if stream.inflight == work:
                stream.inflight = None
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
            work = self._handle_works.get(c.handle)
            used = self.work_end_ns.get(work, c.old_end_ns) if work is not None else c.old_end_ns
            error = c.new_end_ns - used  # against the end that was used, over all its corrections
            self._stale_errors[work if work is not None else -c.handle] = error
            self.sink.instant(SIMULATOR_PID, self._simulator_track(CORRECTION_TRACK), f"correction: {c.label}",
                              c.new_end_ns, "correction", {
                                  "collective": work, "old end ns": c.old_end_ns,
                                  "new end ns": c.new_end_ns, "error ns": error,
                                  "stale": "dependents were placed at the end used",
                              })
        errors = [abs(e) for e in self._stale_errors.values() if e]
        self.stale_replies = len(errors)  # replies whose end is not the final one
        self.largest_stale_error_ns = max(errors, default=0)

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
        if work is not None:
            self.unresolved_works.discard(work)  # waits on it become no-ops; its members are failing
            self._dropped.add(work)
            self._collectives.pop(work, None)

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
        if not st.info.certain:  # it never called init_process_group: its guess stands
            st.info.certain = True
            self._name_process(st)
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
            early_reads=self.early_reads,
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
