"""The engine lets the network forget its history before final_ns as the run goes
(CollectiveLifecycle.prune_network): islands tied together only by flows that ended split again,
and memory stays bounded. Forgetting must change nothing the trace shows: every slice, every
host clock and every link counter sample is the same as in a run whose network keeps its whole
history."""

from __future__ import annotations

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from phantora import protocol as P
from phantora.engine.engine import NETWORK_PID, Engine, RankInfo
from phantora.hardware import lookup_gpu
from phantora.net.cluster import load_cluster
from phantora.net.network import Network
from phantora.ops import OpSignature
from phantora.trace import TeeSink, open_sink

from engine.test_engine import FixedEstimator, t  # noqa: E402
from engine.test_sync_property import TIMING, Recorder, programs, run  # noqa: E402

NEVER = 1 << 62


class CounterRecorder(Recorder):
    def __init__(self) -> None:
        super().__init__()
        self.counters: list[tuple] = []

    def counter(self, pid, name, ts_ns, values):  # type: ignore[override]
        self.counters.append((pid, name, ts_ns, tuple(sorted(values.items()))))


def _run_closed(progs, colls, seed: int, sync: str, prune_min_flows: int):
    """run() with the engine closed (link counters written), pruning as configured."""
    sink = CounterRecorder()
    slices, hosts, e = run(progs, colls, seed, sync, sink=sink, prune_min_flows=prune_min_flows)
    e.close({})
    return slices, hosts, sorted(sink.counters), e


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(programs(), st.integers(0, 2**16), st.sampled_from(["optimistic", "conservative"]))
def test_pruning_the_network_changes_no_slice_host_time_or_link_counter(prog_colls, seed, sync):
    progs, colls = prog_colls
    kept = _run_closed(progs, colls, seed, sync, NEVER)
    pruned = _run_closed(progs, colls, seed, sync, 0)
    assert kept[3].collectives.prunes == 0
    assert pruned[0] == kept[0]  # slices
    assert pruned[1] == kept[1]  # host clocks
    assert pruned[2] == kept[2]  # link counter samples


def _long_allreduce_run(prune_min_flows: int, path=None) -> tuple[Engine, CounterRecorder]:
    """Two ranks on two nodes: 300 rounds of a kernel, an all-reduce the stream waits for, and a
    stream sync."""
    sink = CounterRecorder()
    net = Network(load_cluster("dgx-h100", nodes=2))
    out = sink if path is None else TeeSink([sink, open_sink(path)])
    e = Engine(lookup_gpu("h100"), FixedEstimator(), out, TIMING, network=net)
    e.collectives.prune_min_flows = prune_min_flows
    e.expected_ranks = 2
    gpus = {0: (0, 0), 1: (1, 0)}  # rank -> (node, local rank)
    for r, (node, local) in gpus.items():
        e.add_rank(RankInfo(r, node, local, 100 + r))
    sig = OpSignature("aten::k", "50", (t([4], device="cuda:0"),), (t([4], device="cuda:0"),))
    for i in range(300):
        for r in (0, 1):
            e.apply(r, [[P.R_SIG, 0, sig.to_wire()], [P.R_OP, 0, 0, 0]])
            work = e.join_collective(r, {"op": "all_reduce", "group": [0, 1], "seq": i, "nbytes": 4 << 20,
                                         "dtype": "bfloat16", "reduce_op": "sum", "device": 0, "stream": 0})
            e.apply(r, [[P.R_WORK_WAIT, work, 0, 0, 0], [P.R_SYNC_STREAM, 0, 0]])
            e.progress()
            e.take_unblocked()
    for r in (0, 1):
        e.finish_rank(r)
    e.close({})
    return e, sink


def test_a_long_run_keeps_the_network_small_and_its_link_counters_whole(tmp_path):
    pruned, pruned_sink = _long_allreduce_run(64, tmp_path / "pruned.json")
    kept, kept_sink = _long_allreduce_run(NEVER)
    assert pruned.collectives.prunes >= 4
    assert kept.network.live_flows >= 300  # every all-reduce's flows, kept
    assert pruned.network.live_flows <= 64  # at most what was added since the last prune
    link_samples = sorted(c for c in pruned_sink.counters if c[0] == NETWORK_PID)
    assert link_samples and link_samples == sorted(c for c in kept_sink.counters if c[0] == NETWORK_PID)
    assert {r: st.timeline.host_ns for r, st in pruned.ranks.items()} == \
        {r: st.timeline.host_ns for r, st in kept.ranks.items()}
    written = orjson.loads((tmp_path / "pruned.json").read_bytes())["traceEvents"]  # the JSON writer took them
    assert len([ev for ev in written if ev.get("pid") == NETWORK_PID and ev.get("ph") == "C"]) == len(link_samples)
