"""Stream, event, copy and host-sync semantics of the engine (DESIGN.md time model).

A fixed estimator makes every duration known, so each expected time is computed by hand here.
"""

from __future__ import annotations

import pytest

from phantora import protocol as P
from phantora.cost import COMPUTE, COPY_D2H, COPY_H2D, NO_GPU_WORK, KernelEstimate
from phantora.engine.engine import CallError, Engine, RankInfo
from phantora.engine.timeline import TimingConfig
from phantora.hardware import lookup_gpu
from phantora.ops import OpSignature, TensorMeta
from phantora.trace import NullSink

HOST = 5_000  # host ns per op
LAT = 2_000  # launch latency
SYNC = 1_000  # sync overhead
TIMING = TimingConfig(launch_latency_ns=LAT, sync_overhead_ns=SYNC, event_record_host_ns=0, event_query_host_ns=0)


def t(shape, device="cuda:0", pinned=False, dtype="float32") -> TensorMeta:
    stride, acc = [], 1
    for s in reversed(shape):
        stride.append(acc)
        acc *= s
    return TensorMeta(tuple(shape), dtype, tuple(reversed(stride)), device, pinned)


class FixedEstimator:
    """Kernels take `dur` ns encoded in the op name's overload; copies are classified by devices."""

    name = "fixed"

    def __init__(self) -> None:
        self.gpu = lookup_gpu("h100")

    def estimate(self, sig: OpSignature) -> KernelEstimate:
        ins, outs = sig.tensors_in(), sig.tensors_out()
        if sig.name == "aten::view":
            return KernelEstimate(0, 0, 0, 0, NO_GPU_WORK, "fixed", True, "view", 1_000)
        if sig.name in ("aten::_to_copy", "aten::copy_", "aten::_local_scalar_dense"):
            src = sig.args[1] if sig.name == "aten::copy_" else sig.args[0]
            dst = sig.args[0] if sig.name == "aten::copy_" else (outs[0] if outs else None)
            kind = COPY_D2H if dst is None or not dst.is_cuda else (COPY_H2D if not src.is_cuda else COMPUTE)
            return KernelEstimate(int(sig.overload or 10_000), 1, 0, 0, kind, "fixed", True, "copy", HOST)
        return KernelEstimate(int(sig.overload), 1, 0, 0, COMPUTE, "fixed", True, sig.short_name, HOST)


class Harness:
    def __init__(self) -> None:
        self.engine = Engine(lookup_gpu("h100"), FixedEstimator(), NullSink(), TIMING)
        self.engine.add_rank(RankInfo(0, 0, 0, 123))
        self.sigs: dict[int, OpSignature] = {}

    def sig(self, sig: OpSignature) -> int:
        sid = len(self.sigs)
        self.sigs[sid] = sig
        self.engine.apply(0, [[P.R_SIG, sid, sig.to_wire()]])
        return sid

    def kernel(self, dur: int, stream: int = 0, flags: int = 0) -> None:
        sid = self.sig(OpSignature("aten::k", str(dur), (t([4]),), (t([4]),)))
        self.engine.apply(0, [[P.R_OP, sid, stream, flags]])

    def op(self, sig: OpSignature, stream: int = 0) -> None:
        self.engine.apply(0, [[P.R_OP, self.sig(sig), stream, 0]])

    def rec(self, *records: list) -> None:
        self.engine.apply(0, list(records))

    @property
    def tl(self):
        return self.engine.ranks[0].timeline

    def tail(self, stream: int = 0) -> int:
        return self.tl.streams[(0, stream)].tail_ns


def test_kernels_on_one_stream_run_back_to_back_after_launch_latency():
    h = Harness()
    h.kernel(100_000)
    h.kernel(50_000)
    # first starts at launch (0) + latency; the second is launched at 5us, queued behind the first
    assert h.tail() == LAT + 100_000 + 50_000
    assert h.tl.host_ns == 2 * HOST


def test_short_kernels_are_launch_bound():
    h = Harness()
    for _ in range(10):
        h.kernel(1_000)
    # each kernel waits for its own launch: the last is launched at 9*HOST
    assert h.tail() == 9 * HOST + LAT + 1_000


def test_streams_overlap_and_wait_event_orders_them():
    h = Harness()
    h.kernel(100_000, stream=0)
    h.kernel(100_000, stream=1)  # independent stream: overlaps with stream 0
    assert h.tail(1) == HOST + LAT + 100_000
    h.rec([P.R_EVENT_RECORD, 7, 0, 0])  # event at the end of stream 0's work
    h.rec([P.R_EVENT_WAIT, 7, 0, 1])
    h.kernel(10_000, stream=1)
    assert h.tail(1) == HOST + LAT + 100_000 + 10_000  # stream 1 was already later than the event


def test_wait_on_later_event_delays_the_waiting_stream():
    h = Harness()
    h.kernel(500_000, stream=1)
    h.rec([P.R_EVENT_RECORD, 1, 0, 1])
    h.rec([P.R_EVENT_WAIT, 1, 0, 0])
    h.kernel(1_000, stream=0)
    assert h.tail(0) == LAT + 500_000 + 1_000


def test_waiting_on_a_never_recorded_event_is_a_noop():
    h = Harness()
    h.rec([P.R_EVENT_WAIT, 99, 0, 0])
    h.kernel(1_000)
    assert h.tail() == LAT + 1_000


def test_elapsed_time_is_in_milliseconds_between_event_completions():
    h = Harness()
    h.rec([P.R_EVENT_RECORD, 1, 0, 0])
    h.kernel(3_000_000)
    h.rec([P.R_EVENT_RECORD, 2, 0, 0])
    # event 1 completes at its launch + latency (idle stream); event 2 when the kernel ends
    assert h.engine.elapsed_ms(0, 1, 2) == pytest.approx((LAT + 3_000_000 - LAT) / 1e6)
    with pytest.raises(CallError):
        h.engine.elapsed_ms(0, 1, 3)


def test_synchronize_moves_host_clock_to_device_idle():
    h = Harness()
    h.kernel(1_000_000, stream=0)
    h.kernel(2_000_000, stream=3)
    h.rec([P.R_SYNC_DEVICE, 0])
    assert h.tl.host_ns == HOST + LAT + 2_000_000 + SYNC
    # syncing an idle device only costs the overhead
    before = h.tl.host_ns
    h.rec([P.R_SYNC_DEVICE, 0])
    assert h.tl.host_ns == before + SYNC


def test_stream_synchronize_waits_for_that_stream_only():
    h = Harness()
    h.kernel(1_000_000, stream=0)
    h.kernel(5_000_000, stream=1)
    h.rec([P.R_SYNC_STREAM, 0, 0])
    assert h.tl.host_ns == LAT + 1_000_000 + SYNC


def test_event_query_reflects_host_time():
    h = Harness()
    h.kernel(1_000_000)
    h.rec([P.R_EVENT_RECORD, 5, 0, 0])
    assert h.engine.query_event(0, 5) is False
    h.rec([P.R_SLEEP, 2_000_000])
    assert h.engine.query_event(0, 5) is True


def test_item_blocks_host_until_the_stream_finishes():
    h = Harness()
    h.kernel(1_000_000)
    h.op(OpSignature("aten::_local_scalar_dense", "3000", (t([]),), ()))
    # D2H copy queued after the kernel; the host waits for it, then pays the sync overhead
    assert h.tl.host_ns == LAT + 1_000_000 + 3_000 + SYNC


@pytest.mark.parametrize("non_blocking,pinned,host_waits", [
    (False, False, True), (False, True, True), (True, False, True), (True, True, False)])
def test_d2h_copy_blocks_unless_non_blocking_into_pinned_memory(non_blocking, pinned, host_waits):
    h = Harness()
    h.kernel(1_000_000)
    # copy_(dst=cpu, src=cuda, non_blocking)
    h.op(OpSignature("aten::copy_", "4000", (t([4], "cpu", pinned), t([4]), non_blocking), (t([4], "cpu", pinned),)))
    gpu_done = LAT + 1_000_000 + 4_000
    assert (h.tl.host_ns == gpu_done + SYNC) is host_waits
    if not host_waits:
        assert h.tl.host_ns == 2 * HOST


@pytest.mark.parametrize("non_blocking,pinned,host_waits", [
    (False, True, True), (True, False, True), (True, True, False)])
def test_h2d_copy_is_async_only_from_pinned_memory_with_non_blocking(non_blocking, pinned, host_waits):
    h = Harness()
    out = t([4])
    h.op(OpSignature("aten::_to_copy", "8000", (t([4], "cpu", pinned), None, None, "cuda:0", None, non_blocking, None), (out,)))
    assert (h.tl.host_ns == LAT + 8_000 + SYNC) is host_waits


def test_view_ops_cost_host_time_only():
    h = Harness()
    h.op(OpSignature("aten::view", "", (t([4]), (2, 2)), (t([2, 2]),)))
    assert h.tl.host_ns == 1_000
    assert (0, 0) not in h.tl.streams


def test_python_overhead_of_model_code_delays_the_launch():
    from phantora.cost.host import PYTHON_OVERHEAD as PY

    h = Harness()
    h.kernel(100_000, flags=P.OP_IN_MODULE | P.OP_RECORDS_GRAD)
    # the Python around the op runs first, then the op's own dispatch; the kernel starts after both
    overhead = PY.forward_op_ns + PY.records_grad_ns
    assert h.tl.host_ns == overhead + HOST
    assert h.tail() == overhead + LAT + 100_000
    h.kernel(1_000, flags=P.OP_BACKWARD)
    assert h.tl.host_ns == overhead + HOST + PY.backward_op_ns + HOST


def test_host_events_advance_the_host_clock_only():
    from phantora.cost.host import PYTHON_OVERHEAD as PY

    h = Harness()
    h.rec([P.R_HOST, "module_call", 3], [P.R_HOST, "optimizer_step", 10], [P.R_HOST, "checkpoint", 1])
    assert h.tl.host_ns == 3 * PY.module_call_ns + PY.optimizer_step_ns + 10 * PY.optimizer_param_ns + PY.checkpoint_region_ns
    h.kernel(5_000, flags=P.OP_IN_OPTIMIZER | P.OP_IN_MODULE)  # optimizer ops: bare dispatch cost
    assert h.tail() == h.tl.host_ns - HOST + LAT + 5_000


def test_sleep_advances_host_clock():
    h = Harness()
    h.rec([P.R_SLEEP, 250_000_000])
    assert h.engine.now(0) == 250_000_000


def test_duplicate_rank_is_refused():
    h = Harness()
    with pytest.raises(CallError, match="two processes claim rank 0"):
        h.engine.add_rank(RankInfo(0, 0, 0, 456))


def test_memory_records_track_peak():
    h = Harness()
    h.rec([P.R_MEM, 0, 100, 200], [P.R_MEM, 0, 300, 400], [P.R_MEM, 0, 50, 400])
    s = h.engine.summary()
    assert s.peak_allocated[(0, 0)] == 300
    assert s.peak_reserved[(0, 0)] == 400


# --- kernel gap and host speed ----------------------------------------------------------------

def _harness(**timing) -> Harness:
    h = Harness()
    h.engine = Engine(lookup_gpu("h100"), FixedEstimator(), NullSink(),
                      TimingConfig(launch_latency_ns=LAT, sync_overhead_ns=SYNC, event_record_host_ns=0,
                                   event_query_host_ns=0, **timing))
    h.engine.add_rank(RankInfo(0, 0, 0, 123))
    return h


def test_a_busy_stream_leaves_the_kernel_gap_between_kernels_an_idle_one_does_not():
    h = _harness(kernel_gap_ns=1_600)
    h.kernel(100_000)  # launched at 0 (the launch precedes the op's host cost): starts at LAT
    h.kernel(100_000)  # queued behind it: starts 1.6 us after it ends
    assert h.tail() == LAT + 100_000 + 1_600 + 100_000
    h.rec([P.R_SYNC_DEVICE, 0])
    idle_from = h.tl.host_ns
    h.kernel(10_000)  # the stream is idle again: launch latency, no gap
    assert h.tail() == idle_from + LAT + 10_000


def test_host_speed_scales_modelled_host_costs_only():
    slow, fast = _harness(), _harness(host_speed=0.5)
    for h in (slow, fast):
        h.kernel(1_000)
        h.rec([P.R_SLEEP, 8_000])  # the program's own sleep is real time on any host
        h.kernel(1_000)
    assert slow.tl.host_ns == 2 * HOST + 8_000
    assert fast.tl.host_ns == 2 * HOST // 2 + 8_000
