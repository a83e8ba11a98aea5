"""Everything the engine writes to the trace sink, and the names and tracks it writes them on.

One method per kind of event, so a reader finds here what a slice's args hold and on which track
it lies; the engine's other modules decide *when* (and with which times) to write it. Flow ids
(the arrows from a launch to its kernel) are numbered here, in the order they are asked for.

Tracks: each rank is a trace process (RankInfo.trace_pid) with a host track (HOST_TRACK), a step
track (STEP_TRACK) and one track per CUDA stream (RankTimeline.stream numbers them); the
simulator's own rollbacks and corrections are process SIMULATOR_PID; the network's link counters
process NETWORK_PID.
"""

from __future__ import annotations

from typing import Any

from phantora.cost import COPY_D2H, COPY_H2D, KernelEstimate
from phantora.engine.collectives import CollectiveCall
from phantora.engine.deferred import GraphReplay, OpWork
from phantora.engine.ranks import RankInfo
from phantora.engine.routing_log import RoutingDecision, counter_values
from phantora.engine.timeline import Stream
from phantora.net.network import Network
from phantora.net.records import Correction, RollbackRecord
from phantora.ops import OpSignature
from phantora.trace import TraceSink

HOST_TRACK = 1
STEP_TRACK = 2  # "ProfilerStep#N" slices, one per optimizer step (the name Kineto and HTA use)
PIN_TRACK = 4  # a DataLoader's pin-memory thread: one slice per batch it pinned
SIMULATOR_PID = 0  # trace process for rollback corrections and stale replies
ROLLBACK_TRACK, CORRECTION_TRACK = 1, 2  # its threads
_SIMULATOR_TRACKS = {ROLLBACK_TRACK: "network rollbacks", CORRECTION_TRACK: "corrections to ends already used"}
NETWORK_PID = 1_000_000  # trace process for the network's link counters
PROVISIONAL_PID_BASE = 900_000  # trace pids of rank processes whose rank + 1 was taken (rank_identity.py)
_MAX_ARG_SHAPES = 16
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


def shape_args(sig: OpSignature) -> tuple[list[Any], list[str]]:
    """The input shapes and dtypes of an op, as its slices show them (at most _MAX_ARG_SHAPES).
    The same lists for the same signature object (the engine keeps one per signature id, so a
    repeated op reuses them): the trace sinks only read them."""
    hit = _SHAPE_ARGS.get(id(sig))
    if hit is not None and hit[0] is sig:
        return hit[1]
    shapes, dtypes = [], []
    tensors = sig.tensors_in()
    for t in tensors[:_MAX_ARG_SHAPES]:
        shapes.append(list(t.shape))
        dtypes.append(t.dtype)
    if len(tensors) > _MAX_ARG_SHAPES:
        shapes.append(f"... {len(tensors) - _MAX_ARG_SHAPES} more tensors")
    if len(_SHAPE_ARGS) >= _SHAPE_ARGS_MAX:
        _SHAPE_ARGS.clear()
    _SHAPE_ARGS[id(sig)] = (sig, (shapes, dtypes))  # holding sig keeps its id from being reused
    return shapes, dtypes


# id(signature) -> (signature, shape_args): OpSignature hashes by value, which costs as much as
# the walk over its arguments it would save
_SHAPE_ARGS: dict[int, tuple[OpSignature, tuple[list[Any], list[str]]]] = {}
_SHAPE_ARGS_MAX = 1 << 16


def _fused_args(sig: OpSignature) -> dict[str, Any]:
    """A kernel torch.compile generated (phantora/cost/fused.py): the aten ops fused into it."""
    if not sig.name.startswith("triton::") or len(sig.args) < 5:
        return {}
    return {"fused aten ops": list(sig.args[3]), "inductor kind": sig.args[4]}


def estimator_label(est: KernelEstimate) -> str:
    """The args.estimator of a kernel slice (and the key of EngineSummary.kernels_by_estimator)."""
    return est.estimator if est.known else f"{est.estimator} (unknown op: generic)"


def _kernel_cat(est: KernelEstimate) -> str:
    return "kernel" if est.kind not in (COPY_D2H, COPY_H2D) else "gpu_memcpy"


class TraceEvents:
    def __init__(self, sink: TraceSink) -> None:
        self.sink = sink
        self._flow_ids = 0
        self._simulator_tracks: set[int] = set()
        self._pin_tracks: set[int] = set()  # trace pids whose pin-memory track is named
        self._link_names: dict[int, str] | None = None
        self._link_held: dict[int, tuple[int, float]] = {}  # link -> (end, load) of its last sample
        self._wrote_network = False

    def next_flow(self) -> int:
        self._flow_ids += 1
        return self._flow_ids

    # --- tracks -------------------------------------------------------------------------------
    def host_track(self, info: RankInfo) -> None:
        self.sink.thread(info.trace_pid, HOST_TRACK, "host (aten op launches)", 0)

    def rank(self, info: RankInfo, gpu_name: str, gpus_per_node: int, streams: list[Stream]) -> None:
        """Name the rank's trace process once its rank is certain (a process that only guessed its
        rank is "rank ?" until then), and again its tracks, for sinks that ignore the tracks of
        processes they cannot name yet."""
        pid = info.trace_pid
        gpus = ",".join(str(d) for d in info.devices) if info.devices and len(info.devices) < gpus_per_node \
            else str(info.local_rank)
        label = f"rank {info.rank}" if info.rank >= 0 else f"rank ? (process {info.pid}, rank not known)"
        self.sink.process(pid, f"{label} · node {info.node} · GPU {gpus} · {gpu_name}",
                          info.rank if info.rank >= 0 else PROVISIONAL_PID_BASE - info.rank)
        self.host_track(info)
        for stream in streams:
            if stream.stream_id >= 0:  # communication streams (< 0) are named by comm_track
                self.stream_track(info, stream)

    def stream_track(self, info: RankInfo, stream: Stream) -> None:
        label = "default stream" if stream.stream_id == 0 else f"stream {stream.stream_id}"
        physical = info.physical_gpu(stream.device)
        where = f" (GPU {physical} of the node)" if physical != stream.device else ""  # CUDA_VISIBLE_DEVICES
        self.sink.thread(info.trace_pid, stream.track, f"cuda:{stream.device} {label}{where}", stream.track)

    def comm_track(self, pid: int, stream: Stream, what: str) -> None:
        self.sink.thread(pid, stream.track, f"cuda:{stream.device} nccl {what}", stream.track)

    def _simulator_track(self, tid: int) -> int:
        if not self._simulator_tracks:
            self.sink.process(SIMULATOR_PID, "simulator (rollbacks, corrections)", -1)
        if tid not in self._simulator_tracks:
            self._simulator_tracks.add(tid)
            self.sink.thread(SIMULATOR_PID, tid, _SIMULATOR_TRACKS[tid], tid)
        return tid

    # --- host track ---------------------------------------------------------------------------
    def host_slice(self, pid: int, name: str, begin: int, end: int, cat: str, args: dict[str, Any] | None = None,
                   flow_out: int | None = None) -> None:
        """A slice on the host track: an aten op ("cpu_op"), a CUDA runtime call ("cuda_runtime"),
        Python work ("python") or an NVTX range ("nvtx")."""
        self.sink.slice(pid, HOST_TRACK, name, begin, end - begin, cat, args, flow_out=flow_out)

    def pin_slice(self, pid: int, batch: int, begin: int, end: int) -> None:
        """A DataLoader's pin-memory thread pinning a batch, beside the host track."""
        if pid not in self._pin_tracks:
            self._pin_tracks.add(pid)
            self.sink.thread(pid, PIN_TRACK, "DataLoader pin-memory thread", PIN_TRACK)
        self.sink.slice(pid, PIN_TRACK, "pin_memory", begin, end - begin, "data_loading", {"batch": batch})

    def nvtx_open(self, pid: int, name: str, begin: int) -> None:
        """An NVTX range is written when it closes; announced at its start so sinks that write
        begin events in time order can start it there."""
        self.sink.open_slice(pid, HOST_TRACK, name, begin, "nvtx")

    def oom(self, pid: int, t: int, device: int, requested: int, message: str) -> None:
        self.sink.instant(pid, HOST_TRACK, "CUDA out of memory", t, "memory",
                          {"device": device, "requested_bytes": requested, "message": message})

    def memory(self, pid: int, device: int, t: int, allocated: int, reserved: int) -> None:
        self.sink.counter(pid, f"cuda:{device} memory", t, {"allocated": allocated, "reserved": reserved})

    def routing(self, pid: int, t: int, d: RoutingDecision) -> None:
        """A MoE layer's tokens per expert, one series per expert, from a router's decision on."""
        self.sink.counter(pid, f"MoE {d.name} tokens per expert", t, counter_values(d))

    def step(self, pid: int, step: int, begin: int, end: int, host: dict[str, int] | None = None,
             mirrored_from: int | None = None) -> None:
        """Optimizer step `step` of a rank (`mirrored_from`: of a rank mirrored from that one);
        `host`: how its host spent the step (RankTimeline.spent), for the summary's host split."""
        if step == 0:
            self.sink.thread(pid, STEP_TRACK, "steps (optimizer.step)", 1)
        args: dict[str, Any] = {"step": step} if mirrored_from is None else {"step": step, "mirrored from rank": mirrored_from}
        if host:
            args.update(host)
        self.sink.slice(pid, STEP_TRACK, f"ProfilerStep#{step}", begin, end - begin, "user_annotation", args)

    def collective_call_open(self, pid: int, call: CollectiveCall, begin: int, end: int) -> None:
        """A collective's host slice, written by `collective_call` once the collective has run;
        announced when the rank's host track reaches it."""
        self.sink.open_slice(pid, HOST_TRACK, f"nccl:{call.op}", begin, "cpu_op", end_ns=end)

    def collective_call(self, pid: int, call: CollectiveCall, begin: int, end: int, launch: int | None) -> None:
        """The host slice of `call` (ProcessGroupNCCL enqueuing the NCCL kernel), linked to its
        kernel by flow `launch`; None: the collective never ran."""
        args: dict[str, Any] = {"group ranks": list(call.group), "seq": call.seq, "call site": call.site}
        if launch is None:
            args["never ran"] = True
        else:
            args["correlation"] = launch
        self.sink.slice(pid, HOST_TRACK, f"nccl:{call.op}", begin, end - begin, "cpu_op", args, flow_out=launch)

    # --- streams ------------------------------------------------------------------------------
    def op_kernels(self, pid: int, a: OpWork, start: int, slowed: int) -> None:
        """The kernels of one aten op, as one slice from `start` to the op's end."""
        s, est, sig = a.stream, a.est, a.sig
        assert a.end_ns is not None
        shapes, dtypes = shape_args(sig)
        self.sink.slice(pid, s.track, est.kernel_name, start, a.end_ns - start, _kernel_cat(est), {
            "op": sig.full_name, "shapes": shapes, "dtypes": dtypes, "flops": est.flops, "bytes": est.bytes,
            "kernels": est.kernels, "estimator": estimator_label(est),
            "device": a.device, "stream": s.stream_id, "correlation": a.flow,
            **({"slowed by concurrent communication ns": slowed} if slowed else {}),
            **_fused_args(sig),
        }, flow_in=a.flow)

    def graph_replay(self, pid: int, a: GraphReplay, start: int, end: int,
                     spans: list[tuple[int, int, int]]) -> None:
        """A replay's enclosing slice, then each replayed kernel (begin, end, slowed) inside it."""
        s = a.stream
        kernels = sum(n.est.kernels for n in a.nodes)
        self.sink.slice(pid, s.track, "graph replay", start, end - start, "cuda_graph", {
            "graph": a.graph_id, "replay": a.replay, "kernels": kernels, "ops": len(a.nodes),
            "device": a.device, "stream": s.stream_id, "correlation": a.flow,
        }, flow_in=a.flow if a.arrow else None)
        for node, (b, e, slowed) in zip(a.nodes, spans):
            est, sig = node.est, node.sig
            shapes, dtypes = shape_args(sig)
            self.sink.slice(pid, s.track, est.kernel_name, b, e - b, _kernel_cat(est), {
                "op": sig.full_name, "shapes": shapes, "dtypes": dtypes, "flops": est.flops, "bytes": est.bytes,
                "kernels": est.kernels, "estimator": estimator_label(est), "device": a.device,
                "stream": s.stream_id, "graph": a.graph_id, "graph replay": a.replay, "correlation": a.flow,
                **({"slowed by concurrent communication ns": slowed} if slowed else {}),
                **_fused_args(sig),
            })

    def collective_kernel(self, pid: int, stream: Stream, name: str, call: CollectiveCall, ready: int, start: int,
                          end: int, algorithm: str, protocol: str, busbw: float | None, work: int,
                          launch: int | None) -> None:
        """One member's NCCL kernel: from when its stream reached the collective (`ready`) to the
        collective's end; `start` is when the last member's stream reached it."""
        self.sink.slice(pid, stream.track, name, ready, end - ready, "kernel", {
            "op": call.op, "bytes": call.nbytes, "dtype": call.dtype, "group ranks": list(call.group),
            "seq": call.seq, "root": call.root, "algorithm": algorithm, "protocol": protocol,
            "bus bandwidth GB/s": round(busbw, 2) if busbw is not None else None,
            "waited for peers ns": start - ready, "network ns": end - start, "call site": call.site,
            "collective": work, "correlation": launch,
            **({"transport": call.transport} if call.transport != "nccl" else {}),
            **({"bytes sent to each member": list(call.sends()),
                "bytes received from each member": list(call.recv_splits)} if call.send_splits else {}),
        }, flow_in=launch)

    def collective_arrows(self, flow: int, label: str, places: list[tuple[int, int, int]]) -> None:
        """Arrows from the first member's NCCL kernel to each other member's; places: (pid,
        track, ready) per member."""
        src = places[0]
        for i, (pid, track, ready) in enumerate(places[1:]):
            # Perfetto meets flow events in time order and drops an arrow whose end it meets before
            # its start (stat flow_end_without_start): a recv often waits from before its send.
            # Each member's slice lasts from its ready time to `end`, so a point no earlier than
            # the source's is still inside it.
            self.sink.flow(flow * 1000 + i, label, src, (pid, track, max(ready, src[2])))

    # --- simulator and network ----------------------------------------------------------------
    def rollback(self, rb: RollbackRecord) -> None:
        """A network rollback (phantora.net: a flow submitted in the past moved later ends)."""
        tid = self._simulator_track(ROLLBACK_TRACK)
        self.sink.instant(SIMULATOR_PID, tid, f"rollback: {rb.label}", rb.to_ns, "rollback", {
            "network time ns": rb.network_time_ns, "rolled back from ns": rb.from_ns, "to ns": rb.to_ns,
            "flows rolled back": rb.flows_rolled_back,
            "reported ends undone": len(rb.undone),  # their corrections are events of their own
        })

    def correction(self, c: Correction, work: int | None, error: int) -> None:
        """A completion time the network changed after the engine had read it."""
        self.sink.instant(SIMULATOR_PID, self._simulator_track(CORRECTION_TRACK), f"correction: {c.label}",
                          c.new_end_ns, "correction", {
                              "collective": work, "old end ns": c.old_end_ns,
                              "new end ns": c.new_end_ns, "error ns": error,
                              "stale": "dependents were placed at the end used",
                          })

    def link_counters(self, network: Network, start: int, end: int, nodes: set[int] | None = None) -> None:
        """Each link's load over [start, end) as counters. Written window by window, each once
        rollbacks can no longer change it: before the network forgets that history (the engine
        prunes it as ends become final) and the rest at the end of the run; a load that goes on
        across a window's edge stays one sample. `nodes`: only the links of these nodes (with
        mirrored ranks, the representatives': a counter per link of 1,000 GPUs would be most of
        the trace). close_link_counters() ends the last samples."""
        if self._link_names is None:
            self._link_names = {info.link: info.name for info in network.links()}
        names = self._link_names
        links = None
        if nodes is not None:
            tags = tuple(f"[node{n} " for n in sorted(nodes))
            links = [link for link, name in names.items() if any(t in name for t in tags)]
        segments = network.link_utilization(start, end, links)
        if segments and not self._wrote_network:
            self.sink.process(NETWORK_PID, "network", 1_000_000)
            self._wrote_network = True
        held = self._link_held
        for seg in segments:  # sorted by link, then time
            name = f"link {names[seg.link]}"
            last = held.pop(seg.link, None)
            if last is not None:
                if last[0] == seg.start_ns and last[1] == seg.load:
                    held[seg.link] = (seg.end_ns, seg.load)  # the same load goes on
                    continue
                if last[0] != seg.start_ns:
                    self.sink.counter(NETWORK_PID, name, last[0], {"utilization": 0.0, "GB/s": 0.0})
            self.sink.counter(NETWORK_PID, name, seg.start_ns,
                              {"utilization": round(seg.utilization, 6), "GB/s": round(seg.load, 3)})
            held[seg.link] = (seg.end_ns, seg.load)

    def close_link_counters(self) -> None:
        """The end of each link's last load: its counter goes back to 0."""
        for link, (end, _) in sorted(self._link_held.items()):
            self.sink.counter(NETWORK_PID, f"link {self._link_names[link]}", end, {"utilization": 0.0, "GB/s": 0.0})
        self._link_held.clear()

    def close(self, metadata: dict[str, Any]) -> None:
        self.sink.close(metadata)
