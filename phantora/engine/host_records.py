"""The records of a rank's host that neither wait nor join a collective: aten ops (their host
time and the GPU work they launch), CUDA graph capture and replay, event records and waits,
NVTX ranges, optimizer steps, Python host work and memory counters.

Each advances the rank's host clock by its modelled cost and writes its host slice; GPU work is
handed to placement.py, which places it on its stream when the times it depends on are known.
A copy the host must wait for, or .item(), becomes a host wait (host_waits.py).
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Any, Callable

from phantora import protocol as P
from phantora.cost import COPY_D2H, COPY_H2D, NO_GPU_WORK, Estimator, KernelEstimate
from phantora.cost.copies import copy_endpoints
from phantora.cost.host import HOST_COSTS, PYTHON_WORK, host_event_ns, op_cxx_ns, python_overhead_ns
from phantora.cost.startup import (CONV_OPS, CUBLAS_INIT, CUDA_CONTEXT, CUDNN_INIT, GEMM_OPS, KERNEL_MODULE,
                                   SEGMENT_MALLOC, segment_ns)
from phantora.engine.data_loading import LoaderTimeline
from phantora.engine.deferred import EventRecord, EventWait, GraphReplay, OpWork, WorkWait
from phantora.engine.graphs import CapturedGraph, GraphCollective, GraphError, GraphNode
from phantora.engine.host_waits import HostWaits, host_waits_for_copy
from phantora.engine.placement import Placement
from phantora.engine.ranks import CallError, DeviceMemory, RankState, WaitTarget
from phantora.engine.routing_log import decision_from_record
from phantora.engine.startup import pay, pay_once
from phantora.engine.timeline import TimingConfig
from phantora.engine.trace_events import TraceEvents, estimator_label, shape_args
from phantora.ops import HOST_SYNC, OpSignature


# A stretch of the program's own Python at least this long is drawn as a "python" slice of its
# own; a shorter one is part of the op slice that follows it (python_overhead_ns in its args).
PYTHON_SLICE_NS = 20_000

_COPY_OPS = frozenset({"aten::_to_copy", "aten::copy_", "aten::_copy_from", "aten::_copy_from_and_resize"})


def op_device(sig: OpSignature) -> int | None:
    """The device whose stream runs the op: a copy between two GPUs runs on the source's
    (copy_kernel_cuda), every other op on the device of its first CUDA tensor."""
    if sig.name in _COPY_OPS:
        e = copy_endpoints(sig)
        if e is not None and e.is_peer:
            return e.src.device_index
    return sig.cuda_device()


class HostRecords:
    def __init__(self, timing: TimingConfig, estimator: Estimator, trace: TraceEvents, placement: Placement,
                 waits: HostWaits, warn: Callable[[str], None]) -> None:
        self.timing = timing
        self.estimator = estimator
        self.trace = trace
        self.placement = placement
        self.waits = waits
        self._warn = warn
        self._estimates: dict[bytes, KernelEstimate] = {}  # wire form of a signature -> its estimate
        self.unknown_ops: Counter[str] = Counter()
        self.kernels_by_estimator: Counter[str] = Counter()

    # --- aten ops -----------------------------------------------------------------------------
    def define_sig(self, st: RankState, sig_id: int, wire: list[Any]) -> None:
        """A signature the rank's later ops refer to by id; estimated once per distinct one."""
        key = P.kept_json(wire)
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

    def op(self, st: RankState, sig_id: int, stream_id: int, flags: int, python_ns: int = 0) -> None:
        sig, est = st.sigs[sig_id]
        tl = st.timeline
        st.ops += 1
        if not est.known:
            self.unknown_ops[sig.full_name] += 1
        device = op_device(sig)
        if flags & P.OP_BESIDE and (device is None or est.kernels == 0 or est.kind == NO_GPU_WORK):
            # a pin-memory thread's op: the pin's time (R_PIN_BATCH), not the host timeline's. One
            # that launches GPU work (none does in torch's pin_memory) goes on below: it needs a launch.
            st.pin_threads.ops_ns += round(est.host_ns * self.timing.host_speed)
            return
        # The Python and autograd code around a GPU op runs before it is dispatched: measured
        # (python_ns, the program's CPU time since phantora's previous entry) or modelled. The
        # op's host slice covers both, with the overhead in its args; a long stretch of Python
        # gets a slice of its own.
        # `took`: the host time it took, `overhead`: the figure the slice's args show (modelled: as
        # the model gives it, before the host's speed; measured: on the simulated host)
        if self.timing.host_time == "measured":
            overhead = took = self.python(st, python_ns, slice_min_ns=PYTHON_SLICE_NS)
        elif self.timing.host_time == "counted":
            overhead = took = self.python(st, python_ns, slice_min_ns=PYTHON_SLICE_NS)
        else:
            overhead = python_overhead_ns(flags, est.kernels > 0) if device is not None else 0
            took = tl.charge_host(overhead, "python (modelled)")
        if device is not None and est.kernels > 0 and est.kind != NO_GPU_WORK:
            begin = tl.host_ns
            self._first_use(st, sig, est, device)
            if tl.host_ns != begin and took:  # its Python is drawn before the start-up slices
                self.trace.host_slice(st.info.trace_pid, "python", begin - took, begin, "python")
                took = 0
        if self.timing.host_time == "counted" and device is not None:
            # the op's C++ (binding, autograd) runs after its Python, around the lazy
            # initialisations the first use just paid; the op's slice covers it
            cxx = tl.charge_host(op_cxx_ns(flags, est.kernels > 0), "op C++")
            took += cxx
            overhead += cxx
        begin = tl.host_ns - took
        launch = tl.host_ns
        tl.charge_host(est.host_ns)
        pid = st.info.trace_pid
        if est.kind == NO_GPU_WORK or device is None or est.kernels == 0:
            self.trace.host_slice(pid, sig.name, begin, tl.host_ns, "cpu_op",
                                  {"python_overhead_ns": overhead} if overhead else None)
            return
        if flags & P.OP_CAPTURED:
            graph = st.graphs.capture_on(device, stream_id)
            if graph is not None:  # recorded into the graph: no GPU work now (graphs.py)
                graph.nodes.append(GraphNode(sig, est))
                self.trace.host_slice(pid, sig.name, begin, tl.host_ns, "cpu_op",
                                      {"captured into CUDA graph": graph.graph_id, "stream": stream_id,
                                       "python_overhead_ns": overhead})
                return
        stream = self.placement.stream(st, device, stream_id)
        slows = bool(self.timing.comm_slowdown) and est.kind not in (COPY_D2H, COPY_H2D)
        self._count_kernels(st, est)
        flow = self.trace.next_flow()
        work = OpWork(self.placement.next_seq(), stream, sig, est, launch, flow, device, slows)
        shapes, _ = shape_args(sig)
        args = {"Input Dims": shapes, "correlation": flow, "python_overhead_ns": overhead}
        self.placement.enqueue(st, work)
        if host_waits_for_copy(sig, est) or sig.name == "aten::_local_scalar_dense" or HOST_SYNC in sig.tags:
            # the op's host slice lasts until the copy is done, so it is written then
            self.waits.wait(st, "", WaitTarget("op", action=work), (sig.name, begin, args, flow))
            return
        self.trace.host_slice(pid, sig.name, begin, tl.host_ns, "cpu_op", args, flow_out=flow)

    def _first_use(self, st: RankState, sig: OpSignature, est: KernelEstimate, device: int) -> None:
        """The one-off costs of a fresh process this op is the first to meet (cost/startup.py)."""
        pay_once(st, self.trace, ("context", device), CUDA_CONTEXT, args={"device": device})
        if sig.name in GEMM_OPS:
            pay_once(st, self.trace, ("cublas", device), CUBLAS_INIT, args={"device": device, "op": sig.name})
        elif sig.name in CONV_OPS:
            pay_once(st, self.trace, ("cudnn", device), CUDNN_INIT, args={"device": device, "op": sig.name})
        if est.kind in (COPY_D2H, COPY_H2D):
            return  # a cudaMemcpy, no kernel of a module
        ins = sig.tensors_in()
        kernel = (sig.name, est.kernel_name, ins[0].dtype if ins else "")
        # One load per kernel, not per launch: an op's several launches are mostly the same
        # function again (a multi-tensor apply's chunks: _fused_adamw_ launches one kernel once per
        # ~7 chunks) or kernels of the same module, which lazy loading loads together.
        pay_once(st, self.trace, ("kernel", device, *kernel), KERNEL_MODULE,
                 args={"device": device, "op": sig.name, "kernel": est.kernel_name, "launches": est.kernels})

    def _count_kernels(self, st: RankState, est: KernelEstimate) -> None:
        st.kernels += est.kernels
        self.kernels_by_estimator[estimator_label(est)] += est.kernels
        st.flops += est.flops

    # --- events -------------------------------------------------------------------------------
    def event_record(self, st: RankState, event_id: int, device: int, stream_id: int) -> None:
        stream = self.placement.stream(st, device, stream_id)
        tl = st.timeline
        tl.charge_host(self.timing.event_record_host_ns)
        if st.graphs.capture_on(device, stream_id) is not None:
            return  # a node of the graph being captured: nothing happens on the GPU now
        record = EventRecord(self.placement.next_seq(), stream, event_id, tl.host_ns)
        st.event_src[event_id] = record
        self.placement.enqueue(st, record)

    def event_wait(self, st: RankState, event_id: int, device: int, stream_id: int) -> None:
        stream = self.placement.stream(st, device, stream_id)
        st.timeline.charge_host(self.timing.event_record_host_ns)
        if st.graphs.capture_on(device, stream_id) is not None:
            return
        # waiting on an event that was never recorded is a no-op, as in CUDA
        self.placement.enqueue(st, EventWait(self.placement.next_seq(), stream, st.event_src.get(event_id)))

    # --- CUDA graphs --------------------------------------------------------------------------
    def graph(self, st: RankState, rec: list[Any]) -> None:
        """Capture, instantiation, replay and destruction of a CUDA graph (graphs.py)."""
        kind, graph_id = rec[0], int(rec[1])
        tl, pid, graphs = st.timeline, st.info.trace_pid, st.graphs
        begin = tl.host_ns
        try:
            if kind == P.R_GRAPH_BEGIN:
                graphs.begin(graph_id, int(rec[2]), int(rec[3]))
                tl.charge_host(HOST_COSTS.graph_capture_ns)
                self.trace.host_slice(pid, "cudaStreamBeginCapture", begin, tl.host_ns, "cuda_runtime",
                                      {"graph": graph_id, "device": rec[2], "stream": rec[3]})
            elif kind == P.R_GRAPH_JOIN:
                graphs.join(graph_id, int(rec[2]), int(rec[3]))
            elif kind == P.R_GRAPH_END:
                g = graphs.end(graph_id)
                tl.charge_host(HOST_COSTS.graph_capture_ns)
                self.trace.host_slice(pid, "cudaStreamEndCapture", begin, tl.host_ns, "cuda_runtime",
                                      {"graph": graph_id, "ops": len(g.nodes), "kernels": g.kernels})
            elif kind == P.R_GRAPH_INSTANTIATE:
                g = graphs.replayable(graph_id)
                tl.charge_host(HOST_COSTS.graph_instantiate_ns + HOST_COSTS.graph_node_ns * g.kernels)
                self.trace.host_slice(pid, "cudaGraphInstantiate", begin, tl.host_ns, "cuda_runtime",
                                      {"graph": graph_id, "kernels": g.kernels})
            elif kind == P.R_GRAPH_REPLAY:
                self._graph_replay(st, graphs.replayable(graph_id), int(rec[2]), int(rec[3]),
                                   [int(x) for x in rec[4]] if len(rec) > 4 else [])
            elif kind == P.R_GRAPH_RESET:
                graphs.reset(graph_id)
        except GraphError as e:
            raise CallError(f"rank {st.info.rank}: {e}") from None

    def _graph_replay(self, st: RankState, g: CapturedGraph, device: int, stream_id: int, seqs: list[int]) -> None:
        """cudaGraphLaunch: one host launch; the kernels are placed by Placement._place_replay.
        A graph that holds collectives is launched in parts, split where its collectives were
        called and waited on (graphs.py); `seqs` are their sequence numbers for this replay."""
        tl = st.timeline
        begin = tl.host_ns
        tl.charge_host(HOST_COSTS.graph_launch_ns)
        stream = self.placement.stream(st, device, stream_id)
        collectives = g.collectives
        if len(seqs) != len(collectives):
            raise GraphError(f"replay of CUDA graph {g.graph_id} gave {len(seqs)} sequence numbers for its "
                             f"{len(collectives)} captured collectives")
        flow = self.trace.next_flow()
        replay = g.replays
        g.replays += 1
        for node in g.nodes:
            self._count_kernels(st, node.est)
        self.trace.host_slice(st.info.trace_pid, "cudaGraphLaunch", begin, tl.host_ns, "cuda_runtime",
                              {"graph": g.graph_id, "replay": replay, "kernels": g.kernels, "ops": len(g.nodes),
                               "collectives": len(collectives), "correlation": flow}, flow_out=flow)
        slows = bool(self.timing.comm_slowdown)

        done, first = 0, True  # kernel nodes launched so far; no part launched yet

        def part(upto: int) -> None:  # the kernel nodes up to `upto` (the first part, even if empty)
            nonlocal done, first
            if upto > done or first:
                self.placement.enqueue(st, GraphReplay(self.placement.next_seq(), stream, g.graph_id,
                                                       g.nodes[done:upto], replay, begin, flow, device, slows,
                                                       arrow=first))
                done, first = upto, False

        works: list[int] = []  # this replay's work id of each captured collective
        waited: set[int] = set()
        for item in g.comm:
            part(item.position)
            if isinstance(item, GraphCollective):
                call = dataclasses.replace(item.call, seq=seqs[len(works)], stream=stream_id,
                                           site=f"{item.call.site} (replay {replay} of CUDA graph {g.graph_id})")
                works.append(self.waits.collectives.join_replayed(st, call, stream, begin))
            else:
                waited.add(item.collective)
                self.placement.enqueue(st, WorkWait(self.placement.next_seq(), stream, works[item.collective]))
        part(len(g.nodes))
        # the launch is complete once every node is, so later work on the stream waits for them all
        for i, work in enumerate(works):
            if i not in waited:
                self.placement.enqueue(st, WorkWait(self.placement.next_seq(), stream, work))

    # --- host-only records --------------------------------------------------------------------
    def nvtx_push(self, st: RankState, name: str) -> None:
        st.nvtx.append((name, st.timeline.host_ns))
        self.trace.nvtx_open(st.info.trace_pid, name, st.timeline.host_ns)

    def nvtx_pop(self, st: RankState) -> None:
        if st.nvtx:
            name, start = st.nvtx.pop()
            self.trace.host_slice(st.info.trace_pid, name, start, st.timeline.host_ns, "nvtx")

    def close_nvtx(self, st: RankState) -> None:
        """Ranges still open when the rank's process ended."""
        end = st.timeline.host_ns
        while st.nvtx:
            name, start = st.nvtx.pop()
            self.trace.host_slice(st.info.trace_pid, name, start, end, "nvtx", {"unclosed": True})

    def python(self, st: RankState, measured_ns: int, slice_min_ns: int = 0) -> int:
        """The program's measured CPU time (R_PYTHON, or an op's own): charged to the host; a
        stretch of at least slice_min_ns gets a slice of its own (and 0 is returned), a shorter one
        is left to the caller's slice (its length is returned)."""
        tl = st.timeline
        begin = tl.host_ns
        took = tl.charge_python(measured_ns)
        if took >= slice_min_ns and took:
            self.trace.host_slice(st.info.trace_pid, "python", begin, tl.host_ns, "python",
                                  {"counted ns (reference host)": measured_ns} if self.timing.host_time == "counted"
                                  else {"measured cpu ns": measured_ns, "scale": round(tl.python_scale, 4)})
            return 0
        return took

    def host_event(self, st: RankState, kind: str, count: int) -> None:
        """Python work on the host the op stream does not show (module calls, hooks, ...)."""
        tl = st.timeline
        start = tl.host_ns
        if kind in ("compile", "triton_compile"):  # an assumed figure of its own (cost/host.py), not the fitted model
            tl.advance_host(host_event_ns(kind, count), "compile")
        elif self.timing.host_time == "counted" and kind == "checkpoint":
            tl.charge_host(PYTHON_WORK.checkpoint_region_ns, "op C++")  # its Python is counted
        elif self.timing.host_time in ("measured", "counted"):
            return  # with the rest of the program's Python (interpose/host/host_time.py)
        else:
            tl.charge_host(host_event_ns(kind, count), "python (modelled)")
        if kind == "compile":  # once per compiled graph: host time, shown as such
            self.trace.host_slice(st.info.trace_pid, "torch.compile", start, tl.host_ns, "python",
                                  {"triton kernels generated": count, "modelled": "phantora/cost/host.py"})
        elif kind == "triton_compile":  # a kernel the program launches itself, at its first launch
            self.trace.host_slice(st.info.trace_pid, "triton compile", start, tl.host_ns, "python",
                                  {"kernels": count, "modelled": "phantora/cost/host.py"})
        elif kind != "module_call":  # module calls are too many and too short to show one by one
            self.trace.host_slice(st.info.trace_pid, f"python: {kind}", start, tl.host_ns, "python", {"count": count})

    def loader_start(self, st: RankState, loader: int, workers: int, window: int) -> None:
        """A multi-process DataLoader iterator starts (or starts an epoch again): requests go out now."""
        lt = st.loaders.get(loader)
        if lt is None:
            st.loaders[loader] = LoaderTimeline(st.timeline.host_ns, workers, window)
        else:
            lt.restart(st.timeline.host_ns, workers, window)

    def loader_batch(self, st: RankState, loader: int, worker: int, cpu_ns: int) -> None:
        """The loop takes a batch that cost its worker cpu_ns: it waits if the worker is behind."""
        if self.timing.host_time == "modelled":
            return  # the workers' time is not part of the modelled host
        tl = st.timeline
        lt = st.loaders.get(loader)
        if lt is None:  # its iterator started before this process was a rank: every batch was requested then
            lt = st.loaders[loader] = LoaderTimeline(tl.host_ns, 0, 1 << 30)
        scaled = round(cpu_ns * tl.python_scale * self.timing.host_speed)
        batch = len(lt.taken_ns)
        ready = lt.ready_ns(worker, scaled)
        args: dict[str, Any] = {"worker": worker, "batch cpu ns (measured)": cpu_ns, "batch": batch}
        pin = st.pin_threads.ready_ns(loader, batch, ready)
        if pin is not None:
            self.trace.pin_slice(st.info.trace_pid, batch, *pin)
            ready = pin[1]
            args["pin-memory thread ns"] = pin[1] - pin[0]
        begin = tl.host_ns
        if ready > begin:
            tl.wait_host_until(ready, what="data loading")
            self.trace.host_slice(st.info.trace_pid, f"DataLoader: waiting for worker {worker}", begin, tl.host_ns,
                                  "data_loading", args)
        lt.take(tl.host_ns)

    def pin_batch(self, st: RankState, loader: int, idx: int, python_ns: int) -> None:
        """A pin-memory thread pinned batch idx (R_PIN_BATCH), running python_ns of Python."""
        if self.timing.host_time == "modelled":  # the loop never waits for it (loader_batch): keep nothing
            st.pin_threads.ops_ns = 0
            return
        scaled = round(python_ns * st.timeline.python_scale * self.timing.host_speed)
        st.pin_threads.pinned(loader, idx, scaled)

    def routing(self, st: RankState, rec: list[Any]) -> None:
        """A MoE router's decision (R_ROUTING): kept for the summary, drawn as a counter."""
        d = decision_from_record(rec)
        st.routing[(d.layer, d.sub, d.experts)] = d
        self.trace.routing(st.info.trace_pid, st.timeline.host_ns, d)

    def step(self, st: RankState) -> None:
        now = st.timeline.host_ns
        spent = st.timeline.spent
        share = {what: spent[what] - st.step_spent.get(what, 0) for what in spent}
        st.step_spent = dict(spent)
        self.trace.step(st.info.trace_pid, st.steps, st.step_end_ns, now,
                        {f"host {what} ns": ns for what, ns in sorted(share.items()) if ns})
        st.steps += 1
        st.step_end_ns = now

    def memory(self, st: RankState, device: int, allocated: int, reserved: int) -> None:
        mem = st.memory.setdefault(device, DeviceMemory())
        pay_once(st, self.trace, ("context", device), CUDA_CONTEXT, args={"device": device})
        if reserved > mem.reserved:  # the caching allocator took a new segment: cudaMalloc
            grown = reserved - mem.reserved
            pay(st, self.trace, SEGMENT_MALLOC, ns=segment_ns(grown), args={"device": device, "bytes": grown})
        mem.allocated, mem.reserved = allocated, reserved
        mem.peak_allocated = max(mem.peak_allocated, allocated)
        mem.peak_reserved = max(mem.peak_reserved, reserved)
        self.trace.memory(st.info.trace_pid, device, st.timeline.host_ns, allocated, reserved)

    def oom(self, st: RankState, device: int, requested: int, message: str) -> None:
        st.ooms.append(str(message))
        self.trace.oom(st.info.trace_pid, st.timeline.host_ns, device, requested, message)
