"""Representative ranks in the engine (phantora/engine/mirrors.py, phantora/roles.py): mirrored
ranks join their representative's collectives on their own group, and give the same ends as
ranks that run."""

from __future__ import annotations

import copy
import pickle

import pytest

from phantora import protocol as P
from phantora.engine.engine import Engine, RankInfo
from phantora.engine.mirrors import GroupFamilies, RanksDiverged, RolesRefuted
from phantora.hardware import lookup_gpu
from phantora.net.cluster import load_cluster
from phantora.net.network import Network
from phantora.roles import RankGroup, RankRoles, RanksChoiceError, rank_group

from engine.test_collectives import TIMING, SliceRecorder, kernel  # noqa: E402
from engine.test_engine import FixedEstimator  # noqa: E402


def test_ranks_choice_parses_all_auto_and_lists():
    assert RankRoles.parse("all", 4).representatives == (0, 1, 2, 3)
    assert not RankRoles.parse("all", 4).mirrored
    auto = RankRoles.parse("auto", 16)  # rank 0 stands for all; the last rank runs too, as its witness
    assert auto.processes == (0, 15) and auto.representative(14) == 0 and auto.representative(15) == 15
    assert auto.role_of(15) == 0 and list(auto.mirrors_of(0)) == list(range(1, 15))
    one = RankRoles.parse("0", 16)
    assert one.processes == (0,) and list(one.mirrors_of(0)) == list(range(1, 16))
    stages = RankRoles.parse("0,8,16,24", 32)
    assert [stages.representative(r) for r in (0, 7, 8, 15, 16, 31)] == [0, 0, 8, 8, 16, 24]
    assert list(stages.mirrors_of(8)) == list(range(9, 16)) and stages.runs(16) and not stages.runs(17)


def test_a_rank_group_is_its_tuple_shared_and_answers_membership():
    g = rank_group([4, 0, 2])
    assert isinstance(g, RankGroup) and g == (4, 0, 2) and hash(g) == hash((4, 0, 2))
    assert 0 in g and 2 in g and 1 not in g and g.index(2) == 2 and list(g) == [4, 0, 2]
    assert rank_group((4, 0, 2)) is g and rank_group((0, 2, 4)) is not g  # one object per group, order kept
    assert {(("pg", (4, 0, 2), 7)): "work"}[("pg", g, 7)] == "work"  # finds keys made with plain tuples
    assert pickle.loads(pickle.dumps(g)) is g and copy.deepcopy(g) is g
    families = GroupFamilies()
    families.add("tp1", (4, 5))
    families.add("tp0", (0, 1))
    assert families.counterpart("tp0", 5, 1) == ("tp1", (4, 5)) and families.counterpart("tp0", 5, 1)[1] is rank_group((4, 5))


@pytest.mark.parametrize("text, says", [("8,16", "rank 0 must be a representative"),
                                        ("0,32", "outside the world of 32"), ("zero", "expected all, auto")])
def test_a_bad_ranks_choice_says_what_to_pass(text, says):
    with pytest.raises(RanksChoiceError, match=says):
        RankRoles.parse(text, 32)


def mesh_groups() -> GroupFamilies:
    """The groups a (dp 2, tp 4) DeviceMesh creates, in its order: the world, dp, then tp."""
    g = GroupFamilies()
    g.add("0", tuple(range(8)))
    for i, members in enumerate([(0, 4), (1, 5), (2, 6), (3, 7)]):
        g.add(f"dp{i}", members)
    g.add("tp0", (0, 1, 2, 3))
    g.add("tp1", (4, 5, 6, 7))
    return g


def test_a_mirrored_rank_uses_the_group_of_the_same_family_that_contains_it():
    g = mesh_groups()
    assert g.counterpart("dp0", 5, 0) == ("dp1", (1, 5))
    assert g.counterpart("tp0", 5, 0) == ("tp1", (4, 5, 6, 7))
    assert g.counterpart("0", 5, 0) == ("0", tuple(range(8)))


def test_gloo_twins_created_between_the_nccl_groups_of_a_loop_keep_both_families():
    """Megatron-Core creates each data-parallel group's gloo twin (same ranks) right after it."""
    g = GroupFamilies()
    for i, members in enumerate([(0, 4), (1, 5), (2, 6), (3, 7)]):
        g.add(f"dp{i}", members, "nccl")
        g.add(f"dp{i}_gloo", members, "gloo")
    assert g.counterpart("dp0", 5, 0) == ("dp1", (1, 5))
    assert g.counterpart("dp0_gloo", 7, 0) == ("dp3_gloo", (3, 7))


def test_loops_that_create_several_kinds_of_group_per_step_keep_each_kind_in_its_family():
    """Megatron-Core at TP 4 x DP 2 x PP 2 (16 ranks): per pipeline group its embedding group;
    per data-parallel group the same ranks again (data-parallel with context parallelism 1)."""
    g = GroupFamilies()
    for i in range(8):
        g.add(f"pp{i}", (i, i + 8), "nccl")
        g.add(f"emb{i}", (i, i + 8), "nccl")
        g.add(f"posemb{i}", (i,), "nccl")
    for i, members in enumerate([(0, 4), (1, 5), (2, 6), (3, 7), (8, 12), (9, 13), (10, 14), (11, 15)]):
        g.add(f"dp{i}", members, "nccl")
        g.add(f"dpcp{i}", members, "nccl")
    assert g.counterpart("pp0", 9, 0) == ("pp1", (1, 9))
    assert g.counterpart("emb0", 9, 0) == ("emb1", (1, 9))
    assert g.counterpart("posemb0", 3, 0) == ("posemb3", (3,))
    assert g.counterpart("dp0", 13, 0) == ("dp5", (9, 13))
    assert g.counterpart("dpcp0", 13, 0) == ("dpcp5", (9, 13))


def test_a_mirrored_call_copies_every_field_of_its_representative_s_call():
    """Every field given a non-default value: a field added to CollectiveCall and not copied by
    _mirrored_call fails this (dataclasses.replace is the reference)."""
    from dataclasses import fields, replace

    from phantora.engine.collectives import CollectiveCall
    from phantora.engine.mirrors import _mirrored_call

    call = CollectiveCall(rank=0, op="all_to_all", group=(0, 4), seq=7, nbytes=96, dtype="bfloat16", reduce_op="sum",
                          root=4, device=1, stream=3, site="train.py:12", group_name="g1", send_splits=(32, 64),
                          recv_splits=(48, 48), mirrored=False, transport="userbuffers")
    defaults = CollectiveCall(rank=0, op="all_reduce", group=(0,), seq=0, nbytes=0)
    assert all(getattr(call, f.name) != getattr(defaults, f.name) for f in fields(call) if f.name not in ("rank", "mirrored"))
    assert _mirrored_call(call, 1, (1, 5), 5, "g2") == replace(
        call, rank=1, group=(1, 5), root=5, group_name="g2", site="mirrored from rank 0", mirrored=True)


def mirrored_engine(world: int, roles: str | RankRoles, sink=None) -> Engine:
    net = Network(load_cluster("dgx-h100", nodes=1))
    e = Engine(lookup_gpu("h100"), FixedEstimator(), sink or SliceRecorder(), TIMING, network=net)
    r = RankRoles.parse(roles, world) if isinstance(roles, str) else roles
    e.mirror_ranks(r, 8)
    for rank in r.processes:
        e.add_rank(RankInfo(rank, 0, rank, 100 + rank))
    return e


def all_reduce(group: tuple[int, ...], name: str, rank: int, nbytes: int = 64 << 20) -> dict:
    return {"op": "all_reduce", "group": list(group), "seq": 0, "nbytes": nbytes, "dtype": "bfloat16",
            "reduce_op": "sum", "device": rank, "stream": 0, "group_name": name}


def end_of_first_all_reduce(e: Engine, ranks: list[int], group: tuple[int, ...]) -> int:
    for r in ranks:
        kernel(e, r, 30_000, 0)
    works = {e.join_collective(r, all_reduce(group, "0", r)) for r in ranks}
    assert len(works) == 1
    e.place_all()
    end = e.collective_end_ns(works.pop())
    assert end is not None
    return end


def test_mirrored_ranks_give_the_end_running_ranks_give():
    world = tuple(range(4))
    mirrored = mirrored_engine(4, "0")
    mirrored.apply(0, [[P.R_GROUP, "0", list(world)]])
    everyone = mirrored_engine(4, "all")
    assert end_of_first_all_reduce(mirrored, [0], world) == end_of_first_all_reduce(everyone, [0, 1, 2, 3], world)
    assert mirrored.summary().mirrored == 3


def test_a_group_of_mirrored_ranks_only_runs_on_the_network_too():
    sink = SliceRecorder()
    e = mirrored_engine(8, "0", sink)
    e.apply(0, [[P.R_GROUP, "tp0", [0, 1, 2, 3]], [P.R_GROUP, "tp1", [4, 5, 6, 7]]])
    kernel(e, 0, 30_000, 0)
    e.join_collective(0, all_reduce((0, 1, 2, 3), "tp0", 0))
    e.place_all()
    e.read_all_collectives()
    nccl = [s for s in sink.slices if s["name"].startswith("ncclDevKernel")]
    # rank 0 on its stream, ranks 1-3 (its group) and 4-7 (the other tp group) on their own
    assert sorted(s["pid"] for s in nccl) == list(range(1, 9))
    mirrored = [s for s in nccl if s["pid"] >= 5]
    assert all(s["args"]["group ranks"] == [4, 5, 6, 7] and s["args"]["mirrored from rank"] == 0 for s in mirrored)
    ends = {s["ts"] + s["dur"] for s in nccl}
    assert len(ends) == 1  # two disjoint groups of one node: the same end


def test_a_collective_on_a_group_never_reported_is_refused_naming_the_group():
    e = mirrored_engine(4, "0")
    with pytest.raises(Exception, match="process group 'g7'"):
        e.join_collective(0, all_reduce((0, 1, 2, 3), "g7", 0))


def test_point_to_point_between_a_representative_and_its_mirror_refutes_the_choice():
    e = mirrored_engine(4, "0")
    e.apply(0, [[P.R_GROUP, "0", [0, 1, 2, 3]]])
    send = {"op": "send", "group": [0, 1], "seq": 0, "nbytes": 1 << 20, "dtype": "bfloat16", "device": 0,
            "stream": 0, "group_name": "0"}
    with pytest.raises(RolesRefuted, match=r"rank 0 sends to rank 1.*--ranks 0,1,2,3") as refuted:
        e.join_collective(0, send)
    assert refuted.value.representatives == (0, 1, 2, 3)


def test_a_witness_that_calls_another_collective_than_its_representative_stops_the_run():
    e = mirrored_engine(4, "auto")  # rank 3 runs as the witness of rank 0's role
    for r in (0, 3):
        e.apply(r, [[P.R_GROUP, "0", [0, 1, 2, 3]]])
    world = (0, 1, 2, 3)
    e.join_collective(0, all_reduce(world, "0", 0))
    e.join_collective(3, all_reduce(world, "0", 3))  # alike: the collective completes
    e.join_collective(0, dict(all_reduce(world, "0", 0), seq=1))
    with pytest.raises(RanksDiverged, match=r"ranks 0 and 3 .*collective #1 differs") as diverged:
        e.join_collective(3, dict(all_reduce(world, "0", 3), seq=1, nbytes=1024))
    assert diverged.value.ranks == (0, 3)


def test_a_witness_whose_steps_run_other_ops_is_a_warning():
    warnings = []
    e = mirrored_engine(4, "auto")
    e._warn = warnings.append
    for r, ops in ((0, 3), (3, 5)):
        for i in range(ops):
            kernel(e, r, 1_000, i)
        e.apply(r, [[P.R_STEP]])
    assert len(warnings) == 1 and "ran 5 and 3 ops in step 0" in warnings[0]


def test_pipeline_stages_as_representatives_mirror_their_data_parallel_peers():
    """4 ranks: 2 stages x 2 data-parallel ranks, stage-major (rank = stage * 2 + dp). Stage
    representatives 0 and 2 send and receive; mirrors 1 and 3 pair up the same way."""
    sink = SliceRecorder()
    e = mirrored_engine(4, "0,2", sink)
    for rep in (0, 2):
        e.apply(rep, [[P.R_GROUP, "0", [0, 1, 2, 3]], [P.R_GROUP, "pp0", [0, 2]], [P.R_GROUP, "pp1", [1, 3]]])
    base = {"group": [0, 2], "seq": 0, "nbytes": 8 << 20, "dtype": "bfloat16", "stream": 0, "group_name": "pp0"}
    w0 = e.join_collective(0, dict(base, op="send", device=0))
    w2 = e.join_collective(2, dict(base, op="recv", device=2))
    assert w0 == w2
    e.place_all()
    e.read_all_collectives()
    pids = sorted(s["pid"] for s in sink.slices if s["name"].startswith("ncclDevKernel"))
    assert pids == [1, 2, 3, 4]
    mirrored = [s for s in sink.slices if s["name"].startswith("ncclDevKernel") and s["pid"] in (2, 4)]
    assert all(s["args"]["group ranks"] == [1, 3] for s in mirrored)


def test_a_send_on_the_world_group_pairs_mirrors_through_the_pipeline_groups():
    """8 ranks (pp 2, tp 4), stage representatives 0 and 4. The stages send on the world group
    (`dist.send(t, dst=4)`, as Megatron-LM's interleaved schedule does): mirror 1 must pair with
    5, as the pipeline group [1, 5] says, not with 4 as the world would."""
    sink = SliceRecorder()
    e = mirrored_engine(8, "0,4", sink)
    groups = [[P.R_GROUP, "0", list(range(8))], [P.R_GROUP, "tp0", [0, 1, 2, 3]], [P.R_GROUP, "tp1", [4, 5, 6, 7]],
              *([P.R_GROUP, f"pp{i}", [i, i + 4]] for i in range(4))]
    for rep in (0, 4):
        e.apply(rep, groups)
    base = {"group": [0, 4], "seq": 0, "nbytes": 8 << 20, "dtype": "bfloat16", "stream": 0, "group_name": "0"}
    sent = e.join_collective(0, dict(base, op="send", device=0))
    assert sent == e.join_collective(4, dict(base, op="recv", device=4))
    e.place_all()
    e.read_all_collectives()
    mirrored = {s["pid"] - 1: s["args"]["group ranks"] for s in sink.slices
                if s["name"].startswith("ncclDevKernel") and s["pid"] - 1 not in (0, 4)}
    assert mirrored == {1: [1, 5], 2: [2, 6], 3: [3, 7], 5: [1, 5], 6: [2, 6], 7: [3, 7]}


def test_stages_found_by_auto_keep_a_witness_of_the_last_stage():
    roles = RankRoles.parse("0,8,16,24", 32, witness=True)
    assert roles.processes == (0, 8, 16, 24, 31) and roles.role_of(31) == 24
    assert RankRoles.parse("0,8,16,24", 32).processes == (0, 8, 16, 24)


def test_a_witness_of_another_stage_refutes_one_role_with_the_outermost_groups():
    """8 ranks, (pp 2, tp 4), pp outermost: the witness (rank 7, stage 1) gathers another size
    than rank 0 (stage 0) before any point-to-point message."""
    e = mirrored_engine(8, "auto")
    groups = [[P.R_GROUP, "0", list(range(8))], [P.R_GROUP, "pp0", [0, 4]], [P.R_GROUP, "pp1", [1, 5]],
              [P.R_GROUP, "pp2", [2, 6]], [P.R_GROUP, "pp3", [3, 7]], [P.R_GROUP, "tp0", [0, 1, 2, 3]],
              [P.R_GROUP, "tp1", [4, 5, 6, 7]]]
    for r in (0, 7):
        e.apply(r, groups)
    e.join_collective(0, all_reduce((0, 1, 2, 3), "tp0", 0))
    with pytest.raises(RolesRefuted, match=r"outermost mesh dimension \(\[0, 4\]\).*--ranks 0,4") as refuted:
        e.join_collective(7, all_reduce((4, 5, 6, 7), "tp1", 7, nbytes=1 << 20))
    assert refuted.value.representatives == (0, 4)


def test_a_pipeline_over_the_whole_world_refutes_auto_whichever_rank_calls_first():
    """pp_train: one stage per rank, no group but the world. The witness (last stage) may
    receive before rank 0 sends: the divergence of a send and a receive names every rank."""
    for first in (7, 0):
        e = mirrored_engine(8, "auto")
        for r in (0, 7):
            e.apply(r, [[P.R_GROUP, "0", list(range(8))]])
        base = {"seq": 0, "nbytes": 4, "dtype": "int32", "stream": 0, "group_name": "0"}
        calls = {0: dict(base, op="send", group=[0, 1], device=0), 7: dict(base, op="recv", group=[6, 7], device=7)}
        with pytest.raises(RolesRefuted) as refuted:
            for r in (first, 7 - first):
                e.join_collective(r, calls[r])
        assert refuted.value.representatives == tuple(range(8))


@pytest.mark.parametrize("witness_joins_late", [False, True])
def test_a_witness_s_collective_is_read_when_its_representative_s_is(witness_joins_late):
    """8 ranks, pp 2 x dp 2 x tp 2 (rank = tp + 2 dp + 4 pp), stage representatives 0 and 4 and
    the witness 7, whose tensor-parallel peer 6 is mirrored from 4. Rank 4's host waits for its
    all-reduce (optimistic sync reads it early): mirrored rank 6 waits for the witness's at the
    same point, so that one is read too, or, if the witness's process has not called it yet,
    once it does. Before, nothing read it until the finality horizon, held back by rank 0's
    early host clock, passed it: in a pipeline at 64 GPUs the witness's collectives then
    reached the network in one late burst."""
    e = mirrored_engine(8, RankRoles(8, (0, 4), witnesses=(7,)))
    groups = [[P.R_GROUP, "0", list(range(8))], *([P.R_GROUP, f"tp{i}", [2 * i, 2 * i + 1]] for i in range(4)),
              *([P.R_GROUP, f"pp{i}", [i, i + 4]] for i in range(4))]
    for r in (0, 4, 7):
        e.apply(r, groups)
    p2p = {"seq": 0, "nbytes": 8 << 20, "dtype": "bfloat16", "stream": 0}
    kernel(e, 0, 30_000, 0)
    e.join_collective(0, dict(p2p, op="send", group=[0, 4], group_name="pp0", device=0))

    def recv_and_all_reduce(rank: int) -> int:
        peer, pp, tp, tp_group = (0, "pp0", "tp2", (4, 5)) if rank == 4 else (3, "pp3", "tp3", (6, 7))
        e.join_collective(rank, dict(p2p, op="recv", group=[peer, rank], group_name=pp, device=rank))
        return e.join_collective(rank, all_reduce(tp_group, tp, rank))

    rep = recv_and_all_reduce(4)
    if not witness_joins_late:
        witness = recv_and_all_reduce(7)
        assert e.collectives.work_end_ns.get(witness) is None  # nothing waited for it yet
    assert e.apply(4, [[P.R_SYNC_DEVICE, 4]]) == 1 and not e.host_blocked(4)
    rep_end = e.collectives.work_end_ns.get(rep)
    assert rep_end is not None
    if witness_joins_late:
        witness = recv_and_all_reduce(7)
    assert e.collectives.work_end_ns.get(witness) == rep_end  # read with it (or at its call), and alike
    assert e.ranks[7].timeline.host_ns < rep_end  # the witness's own host did not wait


def test_a_ring_inside_a_stage_sends_each_mirror_to_its_own_next_rank():
    """8 ranks, pp 2 x tp 4 (rank = tp + 4 pp), stage representatives 0 and 4. Transformer
    Engine's userbuffers pass shards around the tensor-parallel ring: rank 4 sends to 5 and
    receives from 7; mirror i sends to i + 1 (7 to 4, which rank 4's receive matches) and
    receives from i - 1, where it used to be refused as a pipeline boundary."""
    sink = SliceRecorder()
    e = mirrored_engine(8, "0,4", sink)
    groups = [[P.R_GROUP, "0", list(range(8))], [P.R_GROUP, "tp0", [0, 1, 2, 3]], [P.R_GROUP, "tp1", [4, 5, 6, 7]],
              *([P.R_GROUP, f"pp{i}", [i, i + 4]] for i in range(4))]
    for rep in (0, 4):
        e.apply(rep, groups)
    base = {"seq": 0, "nbytes": 8 << 20, "dtype": "bfloat16", "stream": 0, "group_name": "tp1", "device": 4}
    works = [e.join_collective(4, dict(base, op="send", group=[4, 5])),
             e.join_collective(4, dict(base, op="recv", group=[7, 4]))]
    assert not e.collectives.unresolved_works & set(works)  # both complete: 7's mirrored send is 4's receive
    e.place_all()
    e.read_all_collectives()
    pairs = {(s["pid"] - 1, s["args"]["op"], tuple(s["args"]["group ranks"])) for s in sink.slices
             if s["name"].startswith("ncclDevKernel") and s["pid"] - 1 in (5, 6, 7)}
    assert pairs == {(5, "send", (5, 6)), (6, "send", (6, 7)), (7, "send", (7, 4)),
                     (5, "recv", (4, 5)), (6, "recv", (5, 6)), (7, "recv", (6, 7))}


def test_a_message_along_the_pipeline_to_a_rank_the_sender_stands_for_is_still_refused():
    """8 ranks, pp 4 x tp 2 (rank = tp + 2 pp), representatives 0 and 4 that each stand for two
    stages: rank 0 sends to rank 2 on its pipeline group [0, 2, 4, 6] (the outermost dimension)."""
    e = mirrored_engine(8, "0,4")
    groups = [[P.R_GROUP, "0", list(range(8))], [P.R_GROUP, "pp0", [0, 2, 4, 6]], [P.R_GROUP, "pp1", [1, 3, 5, 7]],
              *([P.R_GROUP, f"tp{i}", [2 * i, 2 * i + 1]] for i in range(4))]
    for rep in (0, 4):
        e.apply(rep, groups)
    send = {"op": "send", "group": [0, 2], "seq": 0, "nbytes": 1 << 20, "dtype": "bfloat16", "device": 0,
            "stream": 0, "group_name": "pp0"}
    with pytest.raises(RolesRefuted, match="rank 0 sends to rank 2"):
        e.join_collective(0, send)


def test_a_ring_with_one_representative_and_no_pipeline_is_a_ring():
    """8 ranks, tp 4 x dp 2 (rank = tp + 4 dp), one representative for all (what --ranks auto
    tries first). Transformer Engine's userbuffers ring on the tensor-parallel group: rank 0 sends
    to 1 and receives from 3; every mirror sends to its own next rank. The data-parallel groups
    ([0, 4], ...) are the outermost dimension, and the pair is not on them. Before, this was
    refused as a pipeline boundary and the run started again with the ring's ranks as processes."""
    sink = SliceRecorder()
    e = mirrored_engine(8, "0", sink)
    groups = [[P.R_GROUP, "0", list(range(8))], [P.R_GROUP, "tp0", [0, 1, 2, 3]], [P.R_GROUP, "tp1", [4, 5, 6, 7]],
              *([P.R_GROUP, f"dp{i}", [i, i + 4]] for i in range(4))]
    e.apply(0, groups)
    base = {"seq": 0, "nbytes": 8 << 20, "dtype": "bfloat16", "stream": 0, "group_name": "tp0", "device": 0}
    works = [e.join_collective(0, dict(base, op="send", group=[0, 1])),
             e.join_collective(0, dict(base, op="recv", group=[3, 0]))]
    assert not e.collectives.unresolved_works & set(works)  # 3's mirrored send is 0's receive
    e.place_all()
    e.read_all_collectives()
    sends = {(s["pid"] - 1, tuple(s["args"]["group ranks"])) for s in sink.slices
             if s["name"].startswith("ncclDevKernel") and s["args"]["op"] == "send"}
    assert sends == {(0, (0, 1)), (1, (1, 2)), (2, (2, 3)), (3, (3, 0)),
                     (4, (4, 5)), (5, (5, 6)), (6, (6, 7)), (7, (7, 4))}


def test_a_message_along_the_data_parallel_groups_with_one_representative_is_refused():
    """The same mesh, rank 0 sending to rank 4 on its group [0, 4] (the outermost dimension, as
    a pipeline's stages would be): still refused with one representative."""
    e = mirrored_engine(8, "0")
    groups = [[P.R_GROUP, "0", list(range(8))], [P.R_GROUP, "tp0", [0, 1, 2, 3]], [P.R_GROUP, "tp1", [4, 5, 6, 7]],
              *([P.R_GROUP, f"dp{i}", [i, i + 4]] for i in range(4))]
    e.apply(0, groups)
    send = {"op": "send", "group": [0, 4], "seq": 0, "nbytes": 1 << 20, "dtype": "bfloat16", "device": 0,
            "stream": 0, "group_name": "dp0"}
    with pytest.raises(RolesRefuted, match="rank 0 sends to rank 4"):
        e.join_collective(0, send)


def test_a_group_created_after_a_ring_s_first_message_is_taken_into_account():
    """The ring decision is cached per pair; a family created later (here the pipeline-shaped
    groups [0, 2, 4, 6], [1, 3, 5, 7], now the outermost dimension) can make the same pair a
    pipeline boundary. Before, the first decision stayed and the second message was mirrored as
    a ring."""
    e = mirrored_engine(8, "0")
    e.apply(0, [[P.R_GROUP, "0", list(range(8))], *([P.R_GROUP, f"dp{i}", [i, i + 4]] for i in range(4)),
                *([P.R_GROUP, f"pair{i}", [i, (i + 2) % 8]] for i in range(8))])
    send = {"op": "send", "group": [0, 2], "seq": 0, "nbytes": 1 << 20, "dtype": "bfloat16", "device": 0,
            "stream": 0, "group_name": "pair0"}
    e.join_collective(0, send)  # a ring: [0, 2] is on no group of the outermost (dp) family's shape
    e.apply(0, [[P.R_GROUP, "pp0", [0, 2, 4, 6]], [P.R_GROUP, "pp1", [1, 3, 5, 7]]])
    with pytest.raises(RolesRefuted, match="rank 0 sends to rank 2"):
        e.join_collective(0, dict(send, seq=1))


def _ring_steps(sweep_min_unread: int, steps: int = 300) -> tuple[list[int], list[tuple]]:
    """tp 4 x dp 2 with one representative; each step a kernel, Transformer Engine's ring (send
    to 1, receive from 3) and a device synchronize, then the engine's progress. The unread
    collectives after each step, and every collective slice written once the run is read."""
    sink = SliceRecorder()
    e = mirrored_engine(8, "0", sink)
    e.collectives.sweep_min_unread = sweep_min_unread
    e.apply(0, [[P.R_GROUP, "0", list(range(8))], [P.R_GROUP, "tp0", [0, 1, 2, 3]], [P.R_GROUP, "tp1", [4, 5, 6, 7]],
                *([P.R_GROUP, f"dp{i}", [i, i + 4]] for i in range(4))])
    base = {"nbytes": 8 << 20, "dtype": "bfloat16", "stream": 0, "group_name": "tp0", "device": 0}
    unread = []
    for step in range(steps):
        kernel(e, 0, 20_000, 0)
        e.join_collective(0, dict(base, op="send", group=[0, 1], seq=step))
        e.join_collective(0, dict(base, op="recv", group=[3, 0], seq=step))
        e.apply(0, [[P.R_SYNC_DEVICE, 0]])  # the host waits for its GPU (a loss.item())
        e.progress()
        unread.append(len(e.collectives.unread))
    e.read_all_collectives()
    slices = sorted((s["pid"], s["name"], s["ts"], s["dur"], s["args"].get("seq")) for s in sink.slices
                    if s["name"].startswith("ncclDevKernel"))
    return unread, slices


def test_collectives_of_mirrored_ranks_only_are_read_once_final_and_write_what_they_would_at_the_end():
    """Under optimistic sync no host waits for a ring message between two mirrored ranks, so it
    stayed unread (its calls and network records held) until the run ended: the simulator of a
    256-GPU Megatron-LM run with userbuffers rings grew by 110 MB an iteration. Now the final
    ones are read as the run goes; the slices are the same as when all are read at the end."""
    unread_swept, swept = _ring_steps(sweep_min_unread=64)
    unread_kept, kept = _ring_steps(sweep_min_unread=1 << 30)
    assert unread_kept[-1] >= 6 * 300 - 20  # the six mirrored-only pairs of every step, kept
    assert max(unread_swept[100:]) < 200
    assert swept == kept and len(swept) == 8 * 2 * 300
