"""Where a rank's host waits for its GPU: synchronize, a blocking copy or .item(), a blocking
Work.wait(), and the calls that read a GPU time (event queries, elapsed_time, stream queries).

The host's clock moves to the time it waits for, which is known once the work it waits for is
placed (placement.py). When that needs a collective end that is not final yet, `sync` decides:
"optimistic" reads it now (collective_lifecycle.py counts an early read; a later correction is a
stale reply); "conservative" holds the rank (RankState.blocked for a record, blocked_call for a
call) until finality.py has proven the end final, then answers it (`resume_blocked`), and the
server learns which ranks can go on from `take_unblocked`. What a rank waits for is data in
ranks.py (HostWait, WaitTarget), which its RankState holds.
"""

from __future__ import annotations

from typing import Any

from phantora.cost import COPY_D2H, COPY_H2D, KernelEstimate
from phantora.engine.collective_lifecycle import CollectiveLifecycle
from phantora.engine.deferred import EventRecord, WorkWait
from phantora.engine.placement import Placement
from phantora.engine.ranks import CallError, HostWait, RankState, WaitTarget
from phantora.engine.timeline import TimingConfig
from phantora.engine.trace_events import TraceEvents
from phantora.ops import OpSignature, TensorMeta


class NotYet:
    """A call's answer depends on a time not known yet: the caller holds the call and retries
    when take_unblocked names the rank."""


NOT_YET = NotYet()


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


class HostWaits:
    def __init__(self, ranks: dict[int, RankState], timing: TimingConfig, trace: TraceEvents, placement: Placement,
                 collectives: CollectiveLifecycle, sync: str) -> None:
        self.ranks = ranks
        self.timing = timing
        self.trace = trace
        self.placement = placement
        self.collectives = collectives
        self.sync = sync
        self._unblocked: set[int] = set()
        # id() -> rank whose host or call waits (blocked or blocked_call), kept so that the
        # held ranks are found without a scan of every rank after every message
        self._held: dict[int, RankState] = {}

    # --- records the host waits in ------------------------------------------------------------
    def wait(self, st: RankState, name: str, target: WaitTarget,
             op_slice: tuple[str, int, dict[str, Any], int] | None = None) -> None:
        """The rank's host waits for `target`: now if its time is known, else it is held (the
        rank's later records wait, Engine.apply)."""
        st.blocked = HostWait(name, target, st.timeline.host_ns, op_slice)
        self._held[id(st)] = st
        self.resume(st)

    def work_wait(self, st: RankState, work: int, device: int, stream_id: int, host_blocks: bool) -> None:
        """Work.wait() on a collective: the stream waits for its end; with host_blocks (a
        blocking wait, a barrier) the host does too. On a stream capturing a CUDA graph, a wait
        on a collective of that capture is recorded into the graph (graphs.py)."""
        graph = st.graphs.capture_on(device, stream_id)
        if graph is not None and st.graphs.capture_wait(graph, work):
            return
        if not self.collectives.handed_out(work):  # a work this engine never handed out: nothing to wait for
            return
        stream = self.placement.stream(st, device, stream_id)
        self.placement.enqueue(st, WorkWait(self.placement.next_seq(), stream, work))
        if host_blocks:
            self.wait(st, "ProcessGroupNCCL barrier", WaitTarget("work", work=work))

    def resume(self, st: RankState, force: bool | None = None) -> bool:
        """Finish the host wait `st` is blocked in if its time is known; False if not yet."""
        w = st.blocked
        assert w is not None
        t = self.target_ns(st, w.target, self.sync == "optimistic" if force is None else force)
        if t is None:
            return False
        st.blocked = None
        tl = st.timeline
        tl.wait_host_until(t, self.timing.sync_overhead_ns)
        pid = st.info.trace_pid
        if w.op_slice is not None:
            name, begin, args, flow = w.op_slice
            self.trace.host_slice(pid, name, begin, tl.host_ns, "cpu_op", args, flow_out=flow)
        else:
            self.trace.host_slice(pid, w.name, w.start_ns, tl.host_ns, "cuda_runtime")
        return True

    def target_ns(self, st: RankState, target: WaitTarget, force: bool) -> int | None:
        """The time `target` is reached, placing what it waits for; None if not known yet."""
        kind = target.kind
        place = self.placement.place_stream
        if kind == "stream":
            assert target.stream is not None
            return target.stream.tail_ns if place(st, target.stream, None, force) else None
        if kind == "device":
            for s in list(st.timeline.streams.values()):
                if s.device == target.device and not place(st, s, None, force):
                    return None
            return st.timeline.device_idle_ns(target.device)
        if kind in ("event", "op"):
            a = target.action
            if a is None:  # an event never recorded: done at once, as in CUDA
                return 0
            if not place(st, a.stream, a, force):
                return None
            t = a.time_ns if isinstance(a, EventRecord) else a.end_ns  # type: ignore[attr-defined]
            return t or 0
        return self.collectives.end(target.work, force)

    # --- calls that read a GPU time -----------------------------------------------------------
    def _call_wait(self, st: RankState, target: WaitTarget) -> int | None:
        """The time a call needs; None (and the rank's call is held) if not known yet."""
        t = self.target_ns(st, target, self.sync == "optimistic")
        st.blocked_call = target if t is None else None
        if t is None:
            self._held[id(st)] = st
        return t

    def elapsed_ms(self, st: RankState, start_event: int, end_event: int) -> float | NotYet:
        a, b = st.event_src.get(start_event), st.event_src.get(end_event)
        if a is None or b is None:
            raise CallError("elapsed_time: both events must have been recorded before computing the elapsed time")
        ta = self._call_wait(st, WaitTarget("event", action=a))
        tb = None if ta is None else self._call_wait(st, WaitTarget("event", action=b))
        if ta is None or tb is None:
            return NOT_YET
        return (tb - ta) / 1e6

    def query_event(self, st: RankState, event_id: int) -> bool | NotYet:
        t = self._call_wait(st, WaitTarget("event", action=st.event_src.get(event_id)))
        if t is None:
            return NOT_YET
        tl = st.timeline
        tl.charge_host(self.timing.event_query_host_ns)
        return t <= tl.host_ns

    def query_stream(self, st: RankState, device: int, stream_id: int) -> bool | NotYet:
        t = self._call_wait(st, WaitTarget("stream", stream=self.placement.stream(st, device, stream_id)))
        if t is None:
            return NOT_YET
        tl = st.timeline
        tl.charge_host(self.timing.event_query_host_ns)
        return t <= tl.host_ns

    # --- held ranks ---------------------------------------------------------------------------
    def blocked_ranks(self) -> list[RankState]:
        """Ranks whose host or call waits, by rank (trace pid)."""
        held = []
        for key, st in list(self._held.items()):
            if st.blocked is None and st.blocked_call is None:
                del self._held[key]
            elif not st.finished:
                held.append(st)
        return sorted(held, key=lambda st: st.info.trace_pid)

    def resume_blocked(self, force: bool | None = None) -> bool:
        """Finish what blocked ranks wait for, where possible; True if any could go on."""
        resumed = False
        for st in self.blocked_ranks():
            if st.blocked is not None and self.resume(st, force):
                self._unblocked.add(st.info.rank)
                resumed = True
            elif st.blocked_call is not None and st.blocked is None:
                f = self.sync == "optimistic" if force is None else force
                if self.target_ns(st, st.blocked_call, f) is not None:
                    self._unblocked.add(st.info.rank)
                    resumed = True
        return resumed

    def rekey(self, old: int, new: int) -> None:
        """A rank was renamed (rank_identity.py): a finished wait is reported under its new rank."""
        if old in self._unblocked:
            self._unblocked.discard(old)
            self._unblocked.add(new)

    def take_unblocked(self) -> set[int]:
        """Ranks whose host wait finished, or whose held call can now be answered."""
        ranks, self._unblocked = self._unblocked, set()
        return ranks
