"""The host's own time in the engine: counted Python (R_PYTHON, an op's fifth field, already on the
reference host) with the per-op C++ it leaves out, measured Python (the same records, this
machine's CPU time), the modelled mode that ignores it, one-off start-up costs (phantora/cost/startup.py), the split each
step records, and DataLoader workers (engine/data_loading.py). Expected times are computed by
hand from the harness's fixed costs."""

from __future__ import annotations

import dataclasses

from hypothesis import given
from hypothesis import strategies as st

from phantora import protocol as P
from phantora.cost.host import PYTHON_OVERHEAD as PY
from phantora.cost.host import PYTHON_WORK as PW
from phantora.cost.startup import CUBLAS_INIT, CUDA_CONTEXT, KERNEL_MODULE, NCCL_COMM_INIT, nccl_init_ns, segment_ns
from phantora.engine.data_loading import LoaderTimeline
from phantora.engine.engine import Engine, RankInfo
from phantora.hardware import lookup_gpu
from phantora.ops import OpSignature
from phantora.trace import NullSink
from tests.engine.test_engine import HOST, TIMING, FixedEstimator, Harness, t

MEASURED = dataclasses.replace(TIMING, host_time="measured", python_scale=1.5, host_speed=0.5)
COUNTED = dataclasses.replace(TIMING, host_time="counted", python_scale=1.5, host_speed=0.5)


def harness(timing=TIMING) -> Harness:
    h = Harness()
    h.engine = Engine(lookup_gpu("h100"), FixedEstimator(), NullSink(), timing)
    h.engine.add_rank(RankInfo(0, 0, 0, 123))
    return h


def test_measured_python_is_charged_scaled_to_the_simulated_host():
    h = harness(MEASURED)
    h.rec([P.R_PYTHON, 20_000_000])  # 20 ms of the program's own Python, measured here
    assert h.tl.host_ns == 20_000_000 * 1.5 * 0.5
    assert h.tl.spent["python"] == 15_000_000


def test_the_ranks_latest_speed_measurement_scales_what_follows():
    h = harness(MEASURED)
    h.rec([P.R_HOST_SPEED, 73.178], [P.R_PYTHON, 1_000_000])  # as fast as the reference host
    assert h.tl.host_ns == 1_000_000 * 0.5
    h.rec([P.R_HOST_SPEED, 2 * 73.178], [P.R_PYTHON, 1_000_000])  # this machine got twice as slow
    assert h.tl.host_ns == 1_000_000 * 0.5 + 500_000 * 0.5
    assert h.tl.speed_probes == [73.178, 2 * 73.178]


def test_an_ops_measured_python_comes_before_its_launch():
    h = harness(MEASURED)
    sid = h.sig(OpSignature("aten::k", "5000", (t([4]),), (t([4]),)))
    h.rec([P.R_OP, sid, 0, P.OP_IN_MODULE | P.OP_RECORDS_GRAD, 4_000])
    # measured 4 us x 1.5 x 0.5, then the launch (the modelled dispatch and launch call, x 0.5,
    # follow it on the host); the kernel starts a launch latency after the launch
    assert h.tl.host_ns == 3_000 + HOST * 0.5
    assert h.tail() == 3_000 + 2_000 + 5_000


def test_measured_mode_drops_the_modelled_python_and_host_events():
    h = harness(MEASURED)
    h.rec([P.R_HOST, "module_call", 3], [P.R_HOST, "optimizer_step", 10], [P.R_HOST, "checkpoint", 1])
    assert h.tl.host_ns == 0  # the measured Python holds them
    h.kernel(5_000, flags=P.OP_IN_MODULE | P.OP_RECORDS_GRAD)  # no fifth field: no Python measured
    assert h.tl.host_ns == HOST * 0.5


def test_counted_python_is_on_the_reference_host_and_only_the_hosts_speed_scales_it():
    h = harness(COUNTED)
    h.rec([P.R_HOST_SPEED, 2 * 73.178], [P.R_PYTHON, 20_000_000])  # no machine speed applies to counts
    assert h.tl.host_ns == 20_000_000 * 0.5
    assert h.tl.spent["python"] == 10_000_000


def test_a_counted_op_pays_its_python_then_its_cxx_then_its_launch():
    h = harness(COUNTED)
    sid = h.sig(OpSignature("aten::k", "5000", (t([4]),), (t([4]),)))
    h.rec([P.R_OP, sid, 0, P.OP_RECORDS_GRAD, 4_000])
    half = lambda ns: round(ns * 0.5)  # noqa: E731 - each charge is scaled to the host and rounded
    cxx = PW.forward_op_ns + PW.records_grad_ns  # the binding's work and the autograd node
    launched = half(4_000) + half(cxx)
    assert h.tl.host_ns == launched + half(HOST)
    assert h.tail() == launched + 2_000 + 5_000  # the launch call starts after its Python and C++
    h.rec([P.R_OP, sid, 0, P.OP_BACKWARD, 0])  # run by the autograd engine
    assert h.tl.host_ns == launched + half(HOST) + half(PW.backward_op_ns) + half(HOST)
    h.rec([P.R_OP, sid, 0, P.OP_IN_OPTIMIZER, 0])  # the optimizer's: its Python holds the rest
    assert h.tl.host_ns == launched + half(PW.backward_op_ns) + 3 * half(HOST)


def test_counted_mode_charges_checkpoint_regions_and_nothing_for_module_calls_or_optimizer_steps():
    h = harness(COUNTED)
    h.rec([P.R_HOST, "module_call", 3], [P.R_HOST, "optimizer_step", 10])
    assert h.tl.host_ns == 0  # their Python is counted
    h.rec([P.R_HOST, "checkpoint", 1])
    assert h.tl.host_ns == round(PW.checkpoint_region_ns * 0.5)


def test_modelled_mode_ignores_what_was_measured():
    h = harness()
    sid = h.sig(OpSignature("aten::k", "5000", (t([4]),), (t([4]),)))
    h.rec([P.R_PYTHON, 20_000_000], [P.R_OP, sid, 0, P.OP_IN_MODULE, 4_000])
    assert h.tl.host_ns == PY.forward_op_ns + HOST


def test_start_up_costs_are_off_unless_asked_for():
    h = harness()
    h.kernel(5_000)
    assert h.tl.host_ns == HOST
    assert not h.engine.ranks[0].startup_paid


def test_each_start_up_cost_is_paid_once():
    h = harness(dataclasses.replace(TIMING, startup_costs=True))
    mm = OpSignature("aten::mm", "1000", (t([4, 4], dtype="bfloat16"), t([4, 4], dtype="bfloat16")),
                     (t([4, 4], dtype="bfloat16"),))
    h.op(mm)
    first = CUDA_CONTEXT.ns + CUBLAS_INIT.ns + KERNEL_MODULE.ns + HOST
    assert h.tl.host_ns == first
    h.op(mm)  # nothing new: the same kernel on the same device
    assert h.tl.host_ns == first + HOST
    fp32 = OpSignature("aten::mm", "1000", (t([4, 4]), t([4, 4])), (t([4, 4]),))
    h.op(fp32)  # another kernel (another dtype): its module, but cuBLAS is there already
    assert h.tl.host_ns == first + HOST + KERNEL_MODULE.ns + HOST
    assert h.tl.spent["start-up"] == CUDA_CONTEXT.ns + CUBLAS_INIT.ns + 2 * KERNEL_MODULE.ns


def test_a_new_allocator_segment_pays_cudamalloc_by_its_size():
    h = harness(dataclasses.replace(TIMING, startup_costs=True))
    h.rec([P.R_MEM, 0, 1 << 20, 2 << 20])
    assert h.tl.host_ns == CUDA_CONTEXT.ns + segment_ns(2 << 20)
    h.rec([P.R_MEM, 0, 2 << 20, 2 << 20])  # the segment had room: no cudaMalloc
    h.rec([P.R_MEM, 0, 9 << 30, (2 << 20) + (8 << 30)])
    assert h.tl.host_ns == CUDA_CONTEXT.ns + segment_ns(2 << 20) + segment_ns(8 << 30)
    assert segment_ns(8 << 30) == SEGMENT_8GIB_NS


SEGMENT_8GIB_NS = 271_000 + 8 * 52_200  # 0.271 ms + 0.0522 ms per GiB (the probe: 0.56 ms for 8 GiB)


def test_nccl_communicator_init_grows_with_the_group():
    assert nccl_init_ns(8) == NCCL_COMM_INIT.ns + 8 * NCCL_COMM_INIT.per_unit_ns
    assert nccl_init_ns(98_304) > 50e9  # the published 58 s at 98,304 ranks (cost/startup.py)
    assert 1.5e9 < nccl_init_ns(16) < 2.5e9  # 1.99 s at 16 ranks


def test_steps_record_how_the_host_spent_them():
    h = harness(MEASURED)
    h.rec([P.R_PYTHON, 2_000_000], [P.R_STEP])
    h.rec([P.R_PYTHON, 4_000_000], [P.R_SLEEP, 1_000_000], [P.R_STEP])
    st = h.engine.ranks[0]
    assert st.step_spent == {"python": 4_500_000, "sleep": 1_000_000}


# --- DataLoader workers ---------------------------------------------------------------------
def test_a_slow_worker_makes_the_loop_wait_for_its_batches():
    h = harness(MEASURED)
    h.rec([P.R_LOADER_START, 1, 1, 2])  # one worker, two batches requested ahead
    for _ in range(3):
        h.rec([P.R_LOADER_BATCH, 1, 0, 8_000_000])  # 8 ms here = 6 ms on the simulated host
    assert h.tl.host_ns == 18_000_000  # the loop does nothing else: one batch per 6 ms
    assert h.tl.spent["data loading"] == 18_000_000


def test_workers_ahead_of_the_loop_cost_it_nothing():
    h = harness(MEASURED)
    h.rec([P.R_LOADER_START, 1, 2, 4])
    h.rec([P.R_SLEEP, 100_000_000])  # the loop is busy for 100 ms: both workers fill the window
    for i in range(4):
        h.rec([P.R_LOADER_BATCH, 1, i % 2, 8_000_000])
    assert h.tl.host_ns == 100_000_000


def _pin_sig(h: Harness) -> int:
    return h.sig(OpSignature("aten::_pin_memory", "0", (t([4], device="cpu"),), (t([4], device="cpu", pinned=True),)))


def test_a_pin_memory_threads_ops_and_python_delay_the_batch_not_the_host():
    h = harness(MEASURED)
    pin = _pin_sig(h)
    h.rec([P.R_LOADER_START, 1, 2, 4])
    # the thread pins batch 0: two ops beside the loop (host cost HOST each), then 2 ms of its Python here
    h.rec([P.R_OP, pin, 0, P.OP_BESIDE], [P.R_OP, pin, 0, P.OP_BESIDE])
    assert h.tl.host_ns == 0  # the loop's host did nothing
    h.rec([P.R_PIN_BATCH, 1, 0, 2_000_000])
    assert h.tl.host_ns == 0
    h.rec([P.R_LOADER_BATCH, 1, 0, 0])  # the worker's part cost nothing: the loop waits for the pin alone
    assert h.tl.host_ns == 2 * HOST * 0.5 + 2_000_000 * 1.5 * 0.5
    assert h.tl.spent["data loading"] == h.tl.host_ns


def test_a_pin_memory_thread_pins_one_batch_after_another():
    h = harness(MEASURED)
    h.rec([P.R_LOADER_START, 1, 2, 4])
    # two workers make batches 0 and 1 at once (no CPU); each pin is 4 ms here, 3 ms simulated
    h.rec([P.R_PIN_BATCH, 1, 0, 4_000_000], [P.R_PIN_BATCH, 1, 1, 4_000_000])
    h.rec([P.R_LOADER_BATCH, 1, 0, 0])
    assert h.tl.host_ns == 3_000_000
    h.rec([P.R_LOADER_BATCH, 1, 1, 0])
    assert h.tl.host_ns == 6_000_000  # not 3 ms: the thread pinned batch 1 after batch 0


def test_a_pin_is_matched_to_its_batch_by_index_whatever_order_the_thread_ran_them():
    h = harness(MEASURED)
    h.rec([P.R_LOADER_START, 1, 2, 4])
    # the thread got batch 1 first (its worker was faster); the loop still takes batch 0 first
    h.rec([P.R_PIN_BATCH, 1, 1, 8_000_000], [P.R_PIN_BATCH, 1, 0, 2_000_000])
    h.rec([P.R_LOADER_BATCH, 1, 0, 0])
    assert h.tl.host_ns == 1_500_000


def test_loader_batches_cost_nothing_in_the_modelled_mode():
    h = harness()
    h.rec([P.R_LOADER_START, 1, 1, 2], [P.R_LOADER_BATCH, 1, 0, 8_000_000])
    assert h.tl.host_ns == 0


@given(workers=st.integers(1, 4), prefetch=st.integers(1, 3),
       costs=st.lists(st.integers(0, 10_000), min_size=1, max_size=30),
       gaps=st.lists(st.integers(0, 10_000), min_size=30, max_size=30))
def test_loader_timeline_keeps_each_worker_in_order_and_within_its_window(workers, prefetch, costs, gaps):
    window = prefetch * workers
    lt = LoaderTimeline(0, workers, window)
    now, ready = 0, []
    for k, cost in enumerate(costs):
        w = k % workers
        r = lt.ready_ns(w, cost)
        requested = 0 if k < window else lt.taken_ns[k - window]
        assert r >= requested + cost  # not before it was requested and made
        if k >= workers:
            assert r >= ready[k - workers] + cost  # a worker makes one batch after another
        ready.append(r)
        now = max(now, r) + gaps[k]
        lt.take(max(now - gaps[k], r))
