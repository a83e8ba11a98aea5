"""CUDA graph capture and replay in the engine (phantora/engine/graphs.py), with hand-computed
times: capture charges host time per op and places nothing; a replay costs one cudaGraphLaunch
on the host and runs the captured kernels back to back on the replay stream."""

from __future__ import annotations

import pytest

from phantora import protocol as P
from phantora.cost.host import HOST_COSTS
from phantora.engine.engine import CallError, Engine, RankInfo
from phantora.engine.graphs import GraphError, RankGraphs
from phantora.hardware import lookup_gpu
from phantora.net.cluster import load_cluster
from phantora.net.network import Network
from phantora.net.records import CollectiveSpec
from phantora.ops import OpSignature
from phantora.trace import NullSink
from tests.engine.test_collectives import kernel, two_rank_engine
from tests.engine.test_engine import HOST, LAT, TIMING, FixedEstimator, Harness, t

SIDE = 7  # the capture stream
LAUNCH = HOST_COSTS.graph_launch_ns


class Recorder(NullSink):
    def __init__(self) -> None:
        self.slices: list[tuple[int, str, int, int, str, dict]] = []

    def slice(self, pid, tid, name, ts_ns, dur_ns, cat, args=None, flow_out=None, flow_in=None):  # type: ignore[override]
        self.slices.append((tid, name, ts_ns, dur_ns, cat, dict(args or {})))


def harness() -> tuple[Harness, Recorder]:
    h = Harness()
    sink = Recorder()
    h.engine = Engine(lookup_gpu("h100"), FixedEstimator(), sink, TIMING)
    h.engine.add_rank(RankInfo(0, 0, 0, 123))
    return h, sink


def capture(h: Harness, graph: int, durations: list[int], stream: int = SIDE) -> None:
    h.rec([P.R_GRAPH_BEGIN, graph, 0, stream])
    for d in durations:
        h.kernel(d, stream=stream, flags=P.OP_CAPTURED)
    h.rec([P.R_GRAPH_END, graph], [P.R_GRAPH_INSTANTIATE, graph])


def test_capture_places_nothing_and_charges_host_time_per_op():
    h, sink = harness()
    capture(h, 1, [10_000, 20_000, 30_000])
    assert (0, SIDE) not in h.tl.streams or h.tail(SIDE) == 0
    assert not [s for s in sink.slices if s[4] == "kernel"]
    captured = [s for s in sink.slices if s[5].get("captured into CUDA graph") == 1]
    assert len(captured) == 3
    capture_host = 2 * HOST_COSTS.graph_capture_ns + HOST_COSTS.graph_instantiate_ns + 3 * HOST_COSTS.graph_node_ns
    assert h.tl.host_ns == 3 * HOST + capture_host
    assert h.engine.ranks[0].kernels == 0  # counted when they run


def test_replay_runs_the_kernels_back_to_back_for_one_launch():
    h, sink = harness()
    capture(h, 1, [10_000, 20_000, 30_000])
    t0 = h.tl.host_ns
    h.rec([P.R_GRAPH_REPLAY, 1, 0, 0], [P.R_GRAPH_REPLAY, 1, 0, 0])
    assert h.tl.host_ns == t0 + 2 * LAUNCH  # one launch each, whatever the graph holds
    first = t0 + LAT
    assert h.tail(0) == first + 2 * 60_000  # the second replay queues behind the first
    kernels = [s for s in sink.slices if s[4] == "kernel"]
    assert [(s[2], s[3], s[5]["graph replay"]) for s in kernels] == [
        (first, 10_000, 0), (first + 10_000, 20_000, 0), (first + 30_000, 30_000, 0),
        (first + 60_000, 10_000, 1), (first + 70_000, 20_000, 1), (first + 90_000, 30_000, 1)]
    replays = [s for s in sink.slices if s[1] == "graph replay"]
    assert [(s[2], s[3], s[5]["kernels"], s[5]["graph"]) for s in replays] == [
        (first, 60_000, 3, 1), (first + 60_000, 60_000, 3, 1)]
    launches = [s for s in sink.slices if s[1] == "cudaGraphLaunch"]
    assert [(s[2], s[3]) for s in launches] == [(t0, LAUNCH), (t0 + LAUNCH, LAUNCH)]
    assert h.engine.ranks[0].kernels == 6


def test_a_launch_bound_loop_is_faster_replayed():
    durations = [1_000] * 20  # kernels far shorter than their launch cost
    eager, _ = harness()
    for d in durations:
        eager.kernel(d)
    graphed, _ = harness()
    capture(graphed, 1, durations)
    start = graphed.tl.host_ns
    graphed.rec([P.R_GRAPH_REPLAY, 1, 0, 0])
    assert eager.tail(0) == 19 * HOST + LAT + 1_000
    assert graphed.tail(0) - start == LAT + 20_000 < eager.tail(0)


def test_events_on_a_capturing_stream_are_graph_nodes_not_timeline_events():
    h, _ = harness()
    h.kernel(50_000)  # default stream busy until LAT + 50us
    h.rec([P.R_GRAPH_BEGIN, 1, 0, SIDE], [P.R_EVENT_WAIT, 99, 0, SIDE], [P.R_EVENT_RECORD, 5, 0, SIDE])
    h.kernel(1_000, stream=SIDE, flags=P.OP_CAPTURED)
    h.rec([P.R_GRAPH_END, 1])
    h.rec([P.R_EVENT_WAIT, 5, 0, 0])  # waits on an event recorded only inside the capture: no-op
    assert h.tail(0) == LAT + 50_000


def test_joined_stream_captures_into_the_same_graph():
    h, sink = harness()
    h.rec([P.R_GRAPH_BEGIN, 1, 0, SIDE], [P.R_GRAPH_JOIN, 1, 0, SIDE + 1])
    h.kernel(1_000, stream=SIDE, flags=P.OP_CAPTURED)
    h.kernel(2_000, stream=SIDE + 1, flags=P.OP_CAPTURED)
    h.rec([P.R_GRAPH_END, 1])
    assert h.engine.ranks[0].graphs.capture_on(0, SIDE + 1) is None
    h.rec([P.R_GRAPH_REPLAY, 1, 0, 0])
    assert [s[3] for s in sink.slices if s[4] == "kernel"] == [1_000, 2_000]


def test_reset_graph_cannot_be_replayed_and_replays_before_it_still_run():
    h, sink = harness()
    capture(h, 1, [10_000])
    h.rec([P.R_GRAPH_REPLAY, 1, 0, 0], [P.R_GRAPH_RESET, 1])
    assert len([s for s in sink.slices if s[4] == "kernel"]) == 1
    with pytest.raises(CallError, match="unknown CUDA graph 1"):
        h.rec([P.R_GRAPH_REPLAY, 1, 0, 0])


AR_BYTES = 64 << 20


def _two_ranks_capture(waited: bool) -> tuple[Engine, list[int]]:
    """Both ranks capture on SIDE: a 100 us kernel, an all-reduce (Work.wait()ed on SIDE if
    `waited`), a 50 us kernel. The work ids the capture handed out."""
    e = two_rank_engine()
    works = []
    for r in (0, 1):
        def captured(dur: int, sid: int) -> None:
            sig = OpSignature("aten::k", str(dur), (t([4], device=f"cuda:{r}"),), (t([4], device=f"cuda:{r}"),))
            e.apply(r, [[P.R_SIG, sid, sig.to_wire()], [P.R_OP, sid, SIDE, P.OP_CAPTURED]])

        e.apply(r, [[P.R_GRAPH_BEGIN, 1, r, SIDE]])
        captured(100_000, 10)
        work = e.join_collective(r, {"op": "all_reduce", "group": [0, 1], "seq": -1, "nbytes": AR_BYTES,
                                     "dtype": "float32", "reduce_op": "sum", "device": r, "stream": SIDE,
                                     "site": "train.py:7", "group_name": "0"})
        if waited:
            e.apply(r, [[P.R_WORK_WAIT, work, r, SIDE, 0]])
        captured(50_000, 11)
        e.apply(r, [[P.R_GRAPH_END, 1], [P.R_GRAPH_INSTANTIATE, 1]])
        works.append(work)
    return e, works


def _all_reduce_ns() -> int:
    net = Network(load_cluster("dgx-h100", nodes=1))
    return net.finish_time(net.submit(CollectiveSpec("all_reduce", AR_BYTES, (0, 1)), 0))


def test_a_captured_collective_runs_again_at_each_replay_matched_across_ranks():
    e, works = _two_ranks_capture(waited=True)
    # the capture ran nothing: no collective joined, its work ids name no collective that runs
    assert all(w < 0 for w in works) and not e.matcher.pending and not e.unresolved_works
    assert not e.collectives.handed_out(works[0])
    busy_from = e.ranks[1].timeline.host_ns + LAT
    kernel(e, 1, 300_000, 0)  # rank 1's replay stream is busy first, much longer than rank 0's launch
    for r in (0, 1):  # the process group gives the replayed all-reduce sequence numbers 0, then 1
        e.apply(r, [[P.R_GRAPH_REPLAY, 1, r, 0, [0]], [P.R_GRAPH_REPLAY, 1, r, 0, [1]]])
    e.read_all_collectives()
    ar = _all_reduce_ns()
    # replay 0: rank 1's 100 us kernel ends last, 300 + 100 us after its stream got busy; the
    # all-reduce starts then on both ranks, the 50 us kernel after its end (the captured wait);
    # replay 1 queues behind
    first_end = busy_from + 400_000 + ar
    second_end = first_end + 50_000 + 100_000 + ar
    for r in (0, 1):
        assert e.ranks[r].timeline.streams[(r, 0)].tail_ns == second_end + 50_000
        assert e.ranks[r].collectives == 2
    assert sorted(e.work_end_ns.values()) == [first_end, second_end]


def test_a_replay_ends_when_its_collectives_do_even_unwaited():
    e, _ = _two_ranks_capture(waited=False)
    for r in (0, 1):
        e.apply(r, [[P.R_GRAPH_REPLAY, 1, r, 0, [0]]])
    e.read_all_collectives()
    # the all-reduce starts after the 100 us kernel; the 50 us kernel does not wait for it, but the
    # launch is complete (later work on the stream starts) only once the all-reduce ends
    for r in (0, 1):
        launch = e.ranks[r].timeline.host_ns - HOST_COSTS.graph_launch_ns
        assert e.ranks[r].timeline.streams[(r, 0)].tail_ns == launch + LAT + 100_000 + _all_reduce_ns()


def test_a_replay_must_give_each_captured_collective_a_sequence_number():
    e, _ = _two_ranks_capture(waited=True)
    with pytest.raises(CallError, match="gave 0 sequence numbers for its 1 captured collectives"):
        e.apply(0, [[P.R_GRAPH_REPLAY, 1, 0, 0]])


def test_rank_graphs_bookkeeping_errors():
    g = RankGraphs()
    g.begin(1, 0, SIDE)
    with pytest.raises(GraphError, match="already capturing"):
        g.begin(2, 0, SIDE)
    with pytest.raises(GraphError, match="still being captured"):
        g.replayable(1)
    g.end(1)
    assert g.replayable(1).graph_id == 1
    g.reset(1)
    with pytest.raises(GraphError):
        g.replayable(1)


def test_uncaptured_flagged_op_runs_eagerly():
    # OP_CAPTURED on a stream the engine knows no capture for: placed as an eager op.
    h, _ = harness()
    h.kernel(10_000, stream=0, flags=P.OP_CAPTURED)
    assert h.tail(0) == LAT + 10_000
    assert h.tl.host_ns == HOST


def test_graph_pool_stays_reserved_until_released():
    from phantora.engine.memory import MiB, CachingAllocator

    a = CachingAllocator(80 << 30)
    pool = (1, 0)
    key = a.retain_graph_pool(pool)
    x = a.malloc(4 * MiB, key)  # allocated during capture: from the pool
    a.free(x)  # freed during capture: back to the pool, not to the stream's blocks
    assert a.memory_allocated() == 0 and a.memory_reserved() == 20 * MiB
    y = a.malloc(4 * MiB, 0)  # an eager allocation does not reuse the pool's block
    assert a.memory_reserved() == 40 * MiB
    a.free(y)
    a.empty_cache()  # the pool's segment stays while a graph holds it
    assert a.memory_reserved() == 20 * MiB
    assert a.malloc(4 * MiB, key) == x  # the pool reuses its own block
    a.free(x)
    a.release_graph_pool(pool)  # the graph was destroyed
    a.empty_cache()
    assert a.memory_reserved() == 0
    a.check_invariants()
