"""Collective matching across ranks and its timing in the engine (pure Python, no torch)."""

from __future__ import annotations

import dataclasses
import math

import pytest

from phantora import protocol as P
from phantora.cost import COMPUTE, KernelEstimate
from phantora.engine.collectives import CollectiveCall, CollectiveMatcher, CollectiveMismatch
from phantora.cost.host import HOST_COSTS
from phantora.engine.engine import SIMULATOR_PID, Engine, RankInfo, nccl_kernel_name
from phantora.engine.timeline import TimingConfig
from phantora.hardware import lookup_gpu
from phantora.net.cluster import load_cluster
from phantora.net.network import Network
from phantora.net.records import CollectiveSpec
from phantora.ops import OpSignature
from phantora.trace import NullSink

from engine.test_engine import FixedEstimator, t  # noqa: E402


def call(rank, op="all_reduce", group=(0, 1), seq=0, nbytes=1024, **kw):
    return CollectiveCall(rank, op, tuple(group), seq, nbytes, **kw)


def test_collective_completes_when_the_last_member_arrives():
    m = CollectiveMatcher()
    assert m.arrive(call(0), 100) is None
    assert [p.members for p in m.waiting_for(1)] == [(0, 1)]
    done = m.arrive(call(1), 250)
    assert done is not None and done.ready_ns == {0: 100, 1: 250}
    assert not m.pending


def test_sequence_numbers_keep_collectives_of_one_group_apart():
    m = CollectiveMatcher()
    assert m.arrive(call(0, seq=0), 0) is None
    assert m.arrive(call(0, seq=1, nbytes=8), 0) is None
    assert m.arrive(call(1, seq=1, nbytes=8), 0).key == ("", (0, 1), 1)
    assert m.arrive(call(1, seq=0), 0).key == ("", (0, 1), 0)


def test_groups_with_the_same_ranks_are_different_communicators():
    m = CollectiveMatcher()
    assert m.arrive(call(0, group_name="0"), 0) is None
    assert m.arrive(call(0, group_name="1"), 0) is None  # new_group([0, 1]) next to the world
    assert m.arrive(call(1, group_name="1"), 0).key == ("1", (0, 1), 0)
    assert m.arrive(call(1, group_name="0"), 0).key == ("0", (0, 1), 0)


@pytest.mark.parametrize("field,value", [("nbytes", 2048), ("dtype", "bfloat16"), ("reduce_op", "max"),
                                         ("op", "broadcast")])
def test_members_that_disagree_are_a_mismatch_naming_each_call_site(field, value):
    m = CollectiveMatcher()
    m.arrive(call(0, site="train.py:10 in step", dtype="float32", reduce_op="sum"), 0)
    kw = {"site": "train.py:12 in step", "dtype": "float32", "reduce_op": "sum", field: value}
    with pytest.raises(CollectiveMismatch) as e:
        m.arrive(CollectiveCall(1, kw.pop("op", "all_reduce"), (0, 1), 0, kw.pop("nbytes", 1024), **kw), 0)
    assert "train.py:10 in step" in str(e.value) and "train.py:12 in step" in str(e.value)
    assert e.value.ranks == (0, 1)


def test_send_and_recv_pair_up_per_direction():
    m = CollectiveMatcher()
    assert m.arrive(call(0, "send", (0, 1)), 10) is None
    assert m.arrive(call(1, "send", (1, 0)), 10) is None  # the other direction is another pair
    assert m.arrive(call(1, "recv", (0, 1)), 20).members == (0, 1)
    with pytest.raises(CollectiveMismatch):
        m.arrive(call(0, "recv", (1, 0), nbytes=99), 0)


def test_a_rank_outside_the_group_is_refused():
    with pytest.raises(CollectiveMismatch, match="not in"):
        CollectiveMatcher().arrive(call(2), 0)


def test_overdue_collectives_are_found_by_wall_time():
    m = CollectiveMatcher()
    m.arrive(call(0), 0)
    p = next(iter(m.pending.values()))
    assert m.overdue(10.0, now_s=p.first_wall_s + 5) == []
    assert m.overdue(10.0, now_s=p.first_wall_s + 11) == [p]


def test_a_collective_waits_out_a_missing_member_that_is_still_sending():
    """A pipeline stage on a loaded machine may run minutes of work before it posts the receive
    its neighbour waits in: the timeout counts the missing member's silence, not the wait."""
    m = CollectiveMatcher()
    m.arrive(call(0), 0)
    p = next(iter(m.pending.values()))
    heard = {1: p.first_wall_s + 8}
    m.heard = lambda rank: heard.get(rank, float("-inf"))
    assert m.overdue(10.0, now_s=p.first_wall_s + 15) == []  # rank 1 sent something 7 s ago
    assert m.overdue(10.0, now_s=p.first_wall_s + 19) == [p]  # and nothing for 11 s since
    heard[1] = p.first_wall_s + 99  # a member that keeps sending but never joins: given up on at 10 timeouts
    assert m.overdue(10.0, now_s=p.first_wall_s + 99.5) == []
    assert m.overdue(10.0, now_s=p.first_wall_s + 101) == [p]


def test_kernel_names_follow_nccl():
    assert nccl_kernel_name("all_reduce", "bfloat16", "sum", "ring", "LL") == "ncclDevKernel_AllReduce_Sum_bf16_RING_LL"
    assert nccl_kernel_name("all_gather", "float32", "", "ring", "simple") == "ncclDevKernel_AllGather_f32_RING_SIMPLE"
    assert nccl_kernel_name("send_recv", "float32", "", "ring", "simple") == "ncclDevKernel_SendRecv"


LAT = 2_000
TIMING = TimingConfig(launch_latency_ns=LAT, sync_overhead_ns=1_000, event_record_host_ns=0, event_query_host_ns=0,
                      comm_slowdown=0.0)


def two_rank_engine(timing: TimingConfig = TIMING) -> Engine:
    net = Network(load_cluster("dgx-h100", nodes=1))
    e = Engine(lookup_gpu("h100"), FixedEstimator(), NullSink(), timing, network=net)
    for r in (0, 1):
        e.add_rank(RankInfo(r, 0, r, 100 + r))
    return e


def kernel(e: Engine, rank: int, dur: int, sid: int) -> None:
    sig = OpSignature("aten::k", str(dur), (t([4], device=f"cuda:{rank}"),), (t([4], device=f"cuda:{rank}"),))
    e.apply(rank, [[P.R_SIG, sid, sig.to_wire()], [P.R_OP, sid, 0, 0]])


def test_collective_starts_when_the_slowest_members_stream_reaches_it():
    e = two_rank_engine()
    kernel(e, 0, 10_000, 0)
    kernel(e, 1, 500_000, 0)  # rank 1's compute stream is busy much longer
    wire = {"op": "all_reduce", "group": [0, 1], "seq": 0, "nbytes": 64 << 20, "dtype": "bfloat16",
            "reduce_op": "sum", "device": 0, "stream": 0}
    work = e.join_collective(0, wire)  # a work id at once: the issuing rank does not block
    assert work is not None and work in e.unresolved_works
    # rank 0's host waits for it (a barrier): the record is taken, the host holds, later records wait
    assert e.apply(0, [[P.R_WORK_WAIT, work, 0, 0, 1]]) == 1 and e.host_blocked(0)
    assert e.apply(0, [[P.R_SLEEP, 5]]) == 0
    e.progress()
    assert e.take_unblocked() == set()
    assert e.join_collective(1, dict(wire, device=1)) == work
    e.progress()
    assert e.take_unblocked() == {0} and not e.host_blocked(0)
    net = Network(load_cluster("dgx-h100", nodes=1))
    duration = net.finish_time(net.submit(CollectiveSpec("all_reduce", 64 << 20, (0, 1)), 0))
    rank1_ready = LAT + 500_000  # its stream tail
    end = e.collective_end_ns(work)
    assert end == rank1_ready + duration
    assert e.ranks[0].timeline.host_ns == end + TIMING.sync_overhead_ns
    # Work.wait() without blocking: rank 1's compute stream waits for the collective; its host does not
    assert e.apply(1, [[P.R_WORK_WAIT, work, 1, 0, 0]]) == 1 and not e.host_blocked(1)
    kernel(e, 1, 1_000, 1)
    e.place_all()
    assert e.ranks[1].timeline.streams[(1, 0)].tail_ns == end + 1_000
    assert e.ranks[1].timeline.host_ns < end


def test_records_that_do_not_need_a_pending_collective_go_on():
    e = two_rank_engine()
    wire = {"op": "all_reduce", "group": [0, 1], "seq": 0, "nbytes": 1 << 20, "dtype": "float32",
            "reduce_op": "sum", "device": 0, "stream": 0}
    work = e.join_collective(0, wire)
    kernel(e, 0, 30_000, 0)  # compute after an un-waited collective is placed at once
    assert e.ranks[0].timeline.streams[(0, 0)].tail_ns > 30_000
    # the next collective on the same communicator queues behind the first (NCCL stream order);
    # the rank's host does not wait for either
    second = e.join_collective(0, dict(wire, seq=1))
    assert second not in (None, work) and not e.host_blocked(0)
    # synchronising the device needs the communication stream's tail
    assert e.apply(0, [[P.R_SYNC_DEVICE, 0]]) == 1 and e.host_blocked(0)
    e.join_collective(1, dict(wire, device=1))
    e.progress()
    assert e.take_unblocked() == set() and e.host_blocked(0)  # the second one still misses rank 1
    assert e.collective_end_ns(work) is not None
    e.join_collective(1, dict(wire, seq=1, device=1))
    e.progress()
    assert e.take_unblocked() == {0}
    assert e.ranks[0].timeline.host_ns == e.collective_end_ns(second) + TIMING.sync_overhead_ns


def test_send_and_receive_between_a_pair_do_not_wait_for_each_other():
    # 1F1B: both stages post a send to and a receive from the other before either completes
    e = two_rank_engine()
    p2p = {"nbytes": 1 << 20, "dtype": "bfloat16", "stream": 0}
    a = e.join_collective(0, dict(p2p, op="send", group=[0, 1], seq=0, device=0))
    b = e.join_collective(1, dict(p2p, op="send", group=[1, 0], seq=0, device=1))
    assert e.join_collective(0, dict(p2p, op="recv", group=[1, 0], seq=0, device=0)) == b
    assert e.join_collective(1, dict(p2p, op="recv", group=[0, 1], seq=0, device=1)) == a
    assert not e.unresolved_works and a != b


def test_a_rank_that_ends_fails_the_collectives_waiting_for_it():
    e = two_rank_engine()
    e.join_collective(0, {"op": "broadcast", "group": [0, 1], "seq": 0, "nbytes": 8, "root": 0, "site": "a.py:3"})
    [(waiting, message)] = e.abandon_collectives(1)
    assert waiting == [0] and "rank 1 exited without joining broadcast(8 bytes, root 0)" in message
    assert not e.matcher.pending


@pytest.mark.parametrize("slowdown", [0.0, 0.25])
def test_compute_overlapping_an_nccl_kernel_is_slowed_by_the_configured_fraction(slowdown):
    e = two_rank_engine(dataclasses.replace(TIMING, comm_slowdown=slowdown))
    wire = {"op": "all_reduce", "group": [0, 1], "seq": 0, "nbytes": 256 << 20, "dtype": "bfloat16",
            "reduce_op": "sum", "device": 0, "stream": 0}
    work = e.join_collective(0, wire)
    e.join_collective(1, dict(wire, device=1))
    end = e.collective_end_ns(work)
    nccl_start = LAT  # both ranks were idle: ready at host time + launch latency
    assert end - nccl_start > 500_000  # 256 MiB takes far longer than the kernel below
    kernel(e, 0, 100_000, 0)  # fully inside the all-reduce
    tail = e.ranks[0].timeline.streams[(0, 0)].tail_ns
    start = tail - 100_000 - int(slowdown * 100_000)
    assert start >= nccl_start
    assert tail == start + 100_000 + int(slowdown * 100_000)
    # a kernel after the collective ends runs at full speed
    e.apply(0, [[P.R_WORK_WAIT, work, 0, 0, 0]])
    kernel(e, 0, 50_000, 1)
    assert e.ranks[0].timeline.streams[(0, 0)].tail_ns == end + 50_000


class SliceRecorder(NullSink):
    def __init__(self) -> None:
        self.slices: list[dict] = []

    def slice(self, pid, tid, name, ts_ns, dur_ns, cat, args=None, flow_out=None, flow_in=None):  # type: ignore[override]
        self.slices.append({"pid": pid, "tid": tid, "name": name, "ts": ts_ns, "dur": dur_ns, "cat": cat,
                            "args": args or {}, "flow_out": flow_out, "flow_in": flow_in})


@pytest.mark.parametrize("transport", ["nccl", "userbuffers"])
def test_userbuffers_transfers_leave_the_kernels_beside_them_at_full_speed_and_cost_a_launch(transport):
    """Transformer Engine's userbuffers move a collective's bytes with copies and kernels on SMs
    their GEMMs leave them (transport "userbuffers"): no --comm-slowdown on the kernels beside
    them and a kernel launch's host cost, where an NCCL call costs more and slows them."""
    sink = SliceRecorder()
    timing = dataclasses.replace(TIMING, comm_slowdown=0.25)
    e = Engine(lookup_gpu("h100"), FixedEstimator(), sink, timing, network=Network(load_cluster("dgx-h100", nodes=1)))
    for r in (0, 1):
        e.add_rank(RankInfo(r, 0, r, 100 + r))
    wire = {"op": "reduce_scatter", "group": [0, 1], "seq": 0, "nbytes": 1 << 30, "dtype": "bfloat16",
            "reduce_op": "sum", "device": 0, "stream": 0,
            **({"transport": transport} if transport != "nccl" else {})}
    host = e.ranks[0].timeline.host_ns
    work = e.join_collective(0, wire)
    charged = e.ranks[0].timeline.host_ns - host
    e.join_collective(1, dict(wire, device=1))
    assert e.collective_end_ns(work) - LAT > 500_000  # far longer than the kernel below
    kernel(e, 0, 100_000, 0)  # inside the reduce-scatter
    e.close({})
    dur, = [s["dur"] for s in sink.slices if s["pid"] == e.ranks[0].info.trace_pid and s["name"] == "k"
            and s["cat"] == "kernel"]
    nccl_kernel = next(s for s in sink.slices if s["name"].startswith("ncclDevKernel_ReduceScatter"))
    if transport == "nccl":
        assert (charged, dur) == (HOST_COSTS.collective_ns, 125_000) and "transport" not in nccl_kernel["args"]
    else:
        assert (charged, dur) == (HOST_COSTS.launch_ns, 100_000) and nccl_kernel["args"]["transport"] == "userbuffers"


def test_each_members_collective_call_is_a_host_slice_linked_to_its_nccl_kernel():
    sink = SliceRecorder()
    e = Engine(lookup_gpu("h100"), FixedEstimator(), sink, TIMING, network=Network(load_cluster("dgx-h100", nodes=1)))
    for r in (0, 1):
        e.add_rank(RankInfo(r, 0, r, 100 + r))
    e.apply(1, [[P.R_SLEEP, 7_000]])  # rank 1 calls later
    wire = {"op": "all_reduce", "group": [0, 1], "seq": 0, "nbytes": 1 << 20, "dtype": "float32",
            "reduce_op": "sum", "device": 0, "stream": 0, "site": "train.py:9 in step"}
    e.join_collective(0, wire)
    e.join_collective(1, dict(wire, device=1))
    e.close({})  # written once the end is read, at the latest when the run ends
    calls = [s for s in sink.slices if s["name"] == "nccl:all_reduce"]
    kernels = [s for s in sink.slices if s["name"].startswith("ncclDevKernel")]
    assert [(c["pid"], c["ts"], c["cat"]) for c in calls] == [(1, 0, "cpu_op"), (2, 7_000, "cpu_op")]
    for c in calls:
        (k,) = [k for k in kernels if k["pid"] == c["pid"]]
        assert c["dur"] > 0 and c["flow_out"] is not None
        assert k["flow_in"] == c["flow_out"] == c["args"]["correlation"] == k["args"]["correlation"]
        assert c["args"]["call site"] == "train.py:9 in step"


def test_a_collective_that_never_ran_leaves_its_call_without_a_link():
    sink = SliceRecorder()
    e = Engine(lookup_gpu("h100"), FixedEstimator(), sink, TIMING, network=Network(load_cluster("dgx-h100", nodes=1)))
    for r in (0, 1):
        e.add_rank(RankInfo(r, 0, r, 100 + r))
    e.join_collective(0, {"op": "broadcast", "group": [0, 1], "seq": 0, "nbytes": 8, "root": 0})
    e.abandon_collectives(1)
    (call,) = [s for s in sink.slices if s["name"] == "nccl:broadcast"]
    assert call["flow_out"] is None and call["args"]["never ran"] and "correlation" not in call["args"]
    e.close({})
    assert len([s for s in sink.slices if s["name"].startswith("nccl:")]) == 1  # written once


def test_a_collective_still_waiting_at_the_end_keeps_its_call_in_the_trace():
    sink = SliceRecorder()
    e = Engine(lookup_gpu("h100"), FixedEstimator(), sink, TIMING, network=Network(load_cluster("dgx-h100", nodes=1)))
    for r in (0, 1):
        e.add_rank(RankInfo(r, 0, r, 100 + r))
    e.join_collective(0, {"op": "all_gather", "group": [0, 1], "seq": 0, "nbytes": 8})
    e.close({})  # e.g. Ctrl-C while rank 1 had not joined
    (call,) = [s for s in sink.slices if s["name"] == "nccl:all_gather"]
    assert call["pid"] == 1 and call["args"]["never ran"] and call["flow_out"] is None


class EventRecorder(SliceRecorder):
    def __init__(self) -> None:
        super().__init__()
        self.instants: list[dict] = []

    def instant(self, pid, tid, name, ts_ns, cat, args=None):  # type: ignore[override]
        self.instants.append({"pid": pid, "tid": tid, "name": name, "ts": ts_ns, "cat": cat, "args": args or {}})


MIB64 = 64 << 20


def late_overlap_engine(sink, sync: str = "optimistic") -> tuple[Engine, int, int, int]:
    """Ranks 0-2 on one node; all-reduces A over (0, 1) and B over (0, 2) share GPU 0's NVLink.
    A has all members first but starts later (rank 1 slept); B's last member joins after A
    was submitted, with an earlier start, so the network rolls A back. Returns the engine,
    A's work id, and A's and B's starts (from the time model: a rank's collective call costs
    HOST_COSTS.collective_ns on the host, its kernel is ready a launch latency later)."""
    e = Engine(lookup_gpu("h100"), FixedEstimator(), sink, TIMING, network=Network(load_cluster("dgx-h100", nodes=1)),
               sync=sync)
    for r in (0, 1, 2):
        e.add_rank(RankInfo(r, 0, r, 100 + r))
    e.apply(1, [[P.R_SLEEP, 50_000]])
    wire = {"op": "all_reduce", "seq": 0, "nbytes": MIB64, "dtype": "bfloat16", "reduce_op": "sum", "stream": 0}
    a = e.join_collective(0, dict(wire, group=[0, 1], device=0))
    e.join_collective(0, dict(wire, group=[0, 2], device=0))
    assert e.join_collective(1, dict(wire, group=[0, 1], device=1)) == a  # A has all its members
    cn = HOST_COSTS.collective_ns
    return e, a, 50_000 + cn + LAT, 2 * cn + LAT


def network_answers(a_start: int, b_start: int) -> tuple[int, int]:
    """A's end on a network that saw only A, and on a fresh one that knew A and B from the start."""
    alone = Network(load_cluster("dgx-h100", nodes=1))
    a_alone = alone.finish_time(alone.submit(CollectiveSpec("all_reduce", MIB64, (0, 1)), a_start))
    both = Network(load_cluster("dgx-h100", nodes=1))
    hb = both.submit(CollectiveSpec("all_reduce", MIB64, (0, 2)), b_start)
    ha = both.submit(CollectiveSpec("all_reduce", MIB64, (0, 1)), a_start)
    both.finish_time(hb)
    return a_alone, both.finish_time(ha)


B_WIRE = {"op": "all_reduce", "group": [0, 2], "seq": 0, "nbytes": MIB64, "dtype": "bfloat16",
          "reduce_op": "sum", "device": 2, "stream": 0}


@pytest.mark.parametrize("wait_before_b", [False, True])
def test_gpu_work_that_waits_on_a_collective_moved_by_a_late_overlapping_one_starts_at_its_exact_end(wait_before_b):
    e, a, a_start, b_start = late_overlap_engine(NullSink())
    a_alone, a_exact = network_answers(a_start, b_start)
    assert b_start < a_start and a_exact > a_alone  # B slows A down: the scenario is meaningful
    if not wait_before_b:
        e.join_collective(2, B_WIRE)  # B arrives late, starting earlier
    # rank 1's stream waits on A (its host does not): the kernel after it is not placed until
    # A's end is final, so a B that arrives later still moves it
    assert e.apply(1, [[P.R_WORK_WAIT, a, 1, 0, 0]]) == 1
    kernel(e, 1, 10_000, 0)
    e.progress()
    assert e.ranks[1].timeline.streams[(1, 0)].queue  # not placed: rank 2 may still start a collective
    if wait_before_b:
        e.join_collective(2, B_WIRE)
    e.place_all()
    assert e.ranks[1].timeline.streams[(1, 0)].tail_ns == a_exact + 10_000
    assert e.collective_end_ns(a) == a_exact
    assert e.stale_replies == 0 and e.largest_stale_error_ns == 0


def test_an_end_is_read_once_every_rank_is_past_it():
    e, a, a_start, b_start = late_overlap_engine(NullSink())
    e.join_collective(2, B_WIRE)
    e.apply(1, [[P.R_WORK_WAIT, a, 1, 0, 0]])
    kernel(e, 1, 10_000, 0)
    _, a_exact = network_answers(a_start, b_start)
    for r in (0, 1, 2):  # every host moves past A's end: no collective can start before it
        e.apply(r, [[P.R_SLEEP, a_exact]])
    e.progress()
    assert e.final_ns >= a_exact
    stream = e.ranks[1].timeline.streams[(1, 0)]
    assert not stream.queue and stream.tail_ns == a_exact + 10_000 and e.early_reads == 0


def test_a_host_that_waits_before_the_late_collective_gets_a_stale_reply_counted_on_the_simulator_track():
    sink = EventRecorder()
    e, a, a_start, b_start = late_overlap_engine(sink)
    a_alone, a_exact = network_answers(a_start, b_start)
    # rank 1's host waits on A before B arrives: optimistic sync answers with A's end as it stands
    assert e.apply(1, [[P.R_WORK_WAIT, a, 1, 0, 1]]) == 1 and not e.host_blocked(1)
    assert e.ranks[1].timeline.host_ns == a_alone + TIMING.sync_overhead_ns
    e.join_collective(2, B_WIRE)
    # the network corrects A's end once it has simulated that far again: here, when the run's
    # collectives are all read
    e.read_all_collectives()
    assert e.stale_replies == 1 and e.largest_stale_error_ns == a_exact - a_alone and e.early_reads == 1
    (corr,) = [i for i in sink.instants if i["cat"] == "correction"]
    assert corr["pid"] == SIMULATOR_PID and "all_reduce group [0, 1] #0" in corr["name"]
    assert corr["args"]["old end ns"] == a_alone and corr["args"]["new end ns"] == a_exact
    assert corr["args"]["collective"] == a
    assert [i["cat"] for i in sink.instants].count("rollback") >= 1


def test_conservative_sync_holds_the_host_until_the_end_is_final_and_gets_it_exact():
    e, a, a_start, b_start = late_overlap_engine(EventRecorder(), sync="conservative")
    a_alone, a_exact = network_answers(a_start, b_start)
    assert e.apply(1, [[P.R_WORK_WAIT, a, 1, 0, 1]]) == 1 and e.host_blocked(1)
    e.progress()
    assert e.take_unblocked() == set()  # ranks 0 and 2 could still start a collective before A ends
    e.join_collective(2, B_WIRE)
    e.progress()
    assert e.take_unblocked() == set()
    for r in (0, 2):  # rank 0 and 2 move on (or end): only rank 1, waiting for A, is left
        e.apply(r, [[P.R_SLEEP, 10 * a_exact]])
    e.progress()
    assert e.take_unblocked() == {1}
    assert e.ranks[1].timeline.host_ns == a_exact + TIMING.sync_overhead_ns
    assert e.stale_replies == 0 and e.early_reads == 0


def test_conservative_sync_does_not_deadlock_when_every_rank_waits_for_a_collective():
    e, a, a_start, b_start = late_overlap_engine(NullSink(), sync="conservative")
    b = e.join_collective(2, B_WIRE)
    _, a_exact = network_answers(a_start, b_start)
    # every host waits: 0 and 1 for A, 2 for B. Each rank's next collective starts after what it
    # waits for, so the earliest provisional end (B's) is final
    assert e.apply(0, [[P.R_WORK_WAIT, a, 0, 0, 1]]) == 1
    assert e.apply(1, [[P.R_WORK_WAIT, a, 1, 0, 1]]) == 1
    assert e.apply(2, [[P.R_WORK_WAIT, b, 2, 0, 1]]) == 1
    e.progress()
    assert e.take_unblocked() == {2}
    assert e.ranks[2].timeline.host_ns < a_exact  # rank 2 could still start one before A ends
    e.progress()
    assert e.take_unblocked() == set()
    e.apply(2, [[P.R_WORK_WAIT, a, 2, 0, 1]])  # rank 2 now waits for A too (as a non-member could)
    e.progress()
    assert e.take_unblocked() == {0, 1, 2}
    assert e.ranks[1].timeline.host_ns == a_exact + TIMING.sync_overhead_ns
    assert e.stale_replies == 0 and e.early_reads == 0


def test_a_compute_kernel_reads_the_end_of_a_collective_it_may_overlap_to_be_slowed():
    def tail_after_kernel(slowdown: float, read_first: bool) -> int:
        e = two_rank_engine(dataclasses.replace(TIMING, comm_slowdown=slowdown))
        wire = {"op": "all_reduce", "group": [0, 1], "seq": 0, "nbytes": 256 << 20, "dtype": "bfloat16",
                "reduce_op": "sum", "device": 0, "stream": 0}
        work = e.join_collective(0, wire)
        e.join_collective(1, dict(wire, device=1))
        if read_first:
            e.collective_end_ns(work)
        kernel(e, 0, 100_000, 0)  # fully inside the 256 MiB all-reduce
        e.place_all()
        return e.ranks[0].timeline.streams[(0, 0)].tail_ns

    # nothing read the all-reduce's end before the kernel: the kernel waits for it, and is slowed
    # exactly as when the end was read first
    assert tail_after_kernel(0.25, read_first=False) == tail_after_kernel(0.25, read_first=True)
    assert tail_after_kernel(0.25, read_first=False) == tail_after_kernel(0.0, read_first=False) + 25_000


def test_a_kernel_inside_a_collective_is_placed_once_the_network_is_final_up_to_its_end():
    e = two_rank_engine(dataclasses.replace(TIMING, comm_slowdown=0.25))
    wire = {"op": "all_reduce", "group": [0, 1], "seq": 0, "nbytes": 256 << 20, "dtype": "bfloat16",
            "reduce_op": "sum", "device": 0, "stream": 0}
    work = e.join_collective(0, wire)
    e.join_collective(1, dict(wire, device=1))
    kernel(e, 0, 100_000, 0)
    stream = e.ranks[0].timeline.streams[(0, 0)]
    assert stream.queue  # it may overlap the all-reduce, whose end is not final
    for r in (0, 1):  # both hosts pass the kernel's end, not the all-reduce's
        e.apply(r, [[P.R_SLEEP, 200_000]])
    e.progress()
    assert not stream.queue and work not in e.work_end_ns  # placed without the end: it runs past the kernel
    start = stream.tail_ns - 125_000
    assert start >= LAT and e.early_reads == 0
    e.place_all()
    assert stream.tail_ns == start + 125_000


def test_a_conservative_wait_that_cannot_be_proven_is_answered_with_a_warning_when_forced():
    warnings = []
    e, a, a_start, b_start = late_overlap_engine(NullSink(), sync="conservative")
    e._warn = warnings.append
    a_alone, _ = network_answers(a_start, b_start)
    assert e.apply(1, [[P.R_WORK_WAIT, a, 1, 0, 1]]) == 1
    e.progress()
    assert e.blocked() and e.take_unblocked() == set()  # rank 2, behind, could still slow A
    e.force_blocked(10.0)  # what the server does after 10 s of wall time without progress
    assert e.take_unblocked() == {1} and not e.blocked()
    assert e.ranks[1].timeline.host_ns == a_alone + TIMING.sync_overhead_ns and e.early_reads == 1
    assert len(warnings) == 1 and "rank(s) [1] waited 10 s" in warnings[0]


def test_sync_mode_is_checked():
    with pytest.raises(ValueError, match="sync"):
        Engine(lookup_gpu("h100"), FixedEstimator(), NullSink(), TIMING, sync="pessimistic")


@pytest.mark.parametrize("gemm_ns", [100_000, 300_000])
def test_a_userbuffers_ring_step_runs_beside_the_gemm_chunk_it_does_not_feed(gemm_ns):
    """Transformer Engine's ring exchange at TP 2 (interpose/device/transformer_engine/
    userbuffers.py, _ring_all_gather): each rank multiplies its own chunk while one ring step (a
    send and a receive on the send stream) brings the other's, and the second chunk waits for the
    step. So the two chunks take max(GEMM, step) + GEMM, not GEMM + step + GEMM. By hand, the step
    of a 64 MiB chunk over dgx-h100's NVLink (370.8 GB/s, 3.6 us for one step): 184.6 us."""
    sink = SliceRecorder()
    e = Engine(lookup_gpu("h100"), FixedEstimator(), sink, TIMING, network=Network(load_cluster("dgx-h100", nodes=1)))
    for r in (0, 1):
        e.add_rank(RankInfo(r, 0, r, 100 + r))
    nbytes, send_stream = 64 << 20, 7
    step_ns = 3_600 + math.ceil(nbytes / 370.8)
    for r in (0, 1):
        e.apply(r, [[P.R_STREAM, r, send_stream, 0]])
        kernel(e, r, gemm_ns, 0)  # its own chunk, on the main stream
        wire = {"seq": 0, "nbytes": nbytes, "dtype": "bfloat16", "device": r, "stream": send_stream,
                "transport": "userbuffers"}
        works = [e.join_collective(r, dict(wire, op="send", group=[r, 1 - r])),
                 e.join_collective(r, dict(wire, op="recv", group=[1 - r, r]))]
        e.apply(r, [[P.R_WORK_WAIT, w, r, 0, 0] for w in works])  # the main stream waits for the step
        kernel(e, r, gemm_ns, 0)  # the chunk the step brought
    e.close({})
    for r in (0, 1):
        pid = e.ranks[r].info.trace_pid
        (first, first_end), (second, end) = sorted((s["ts"], s["ts"] + s["dur"]) for s in sink.slices
                                                   if s["pid"] == pid and s["name"] == "k")
        steps = [s for s in sink.slices if s["pid"] == pid and s["name"] == "ncclDevKernel_SendRecv"]
        assert {s["args"]["network ns"] for s in steps} == {step_ns}
        step_end = max(s["ts"] + s["dur"] for s in steps)
        assert first < min(s["ts"] for s in steps) < first_end  # the step runs beside the first chunk
        assert (second, end) == (max(first_end, step_end), max(first_end, step_end) + gemm_ns)
        # overlapped: not the chunk, then the step, then the chunk (the step starts after the
        # host's two calls, 2 x 4.5 us, and its launch latency)
        assert end - first < max(gemm_ns, step_ns) + gemm_ns + 20_000
