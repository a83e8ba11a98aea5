"""`phantora summary` and `phantora diff` on hand-built traces whose answers are worked out by
hand (times in the comments are microseconds)."""

from __future__ import annotations

import pytest

from phantora.hardware import lookup_gpu
from phantora.query import load
from phantora.query.diff import diff
from phantora.query.summary import merge, overlap, summarize, total

from .helpers import names, write_trace, x

H100_BF16 = lookup_gpu("h100").peak_flops["bf16"]


def kernel(pid, tid, name, ts, dur, flops=0.0, estimator="analytical", op="aten::mm.default"):
    return x(pid, tid, name, ts, dur, cat="kernel", args={"op": op, "flops": flops, "estimator": estimator})


def step(pid, n, ts, dur):
    return x(pid, 2, f"ProfilerStep#{n}", ts, dur, cat="user_annotation", args={"step": n})


def memory(pid, device, ts, allocated, reserved):
    return {"ph": "C", "pid": pid, "tid": 0, "name": f"cuda:{device} memory", "ts": ts,
            "args": {"allocated": allocated, "reserved": reserved}}


def two_rank_trace(tmp_path, name="t.json", comm_end=25):
    events = names(1, "rank 0 · node 0 · GPU 0 · H100", {1: "host (aten op launches)", 2: "steps (optimizer.step)",
                                                           10: "cuda:0 default stream",
                                                           11: "cuda:0 nccl group [0, 1]"})
    events += names(2, "rank 1 · node 0 · GPU 1 · H100", {2: "steps (optimizer.step)", 10: "cuda:1 default stream"})
    events += [
        # rank 0: compute [0,10) [20,30) [40,50); comm [5,comm_end)
        kernel(1, 10, "gemm", 0, 10, flops=1e9),
        kernel(1, 10, "gemm", 20, 10, flops=1e9),
        kernel(1, 10, "foo_kernel", 40, 10, flops=1e9, estimator="analytical (unknown op: generic)",
               op="aten::foo.default"),
        x(1, 11, "ncclDevKernel_AllReduce_Sum_f32_RING_LL", 5, comm_end - 5, cat="kernel", args={"op": "all_reduce"}),
        step(1, 0, 0, 12), step(1, 1, 12, 20), step(1, 2, 32, 18),
        memory(1, 0, 1, 100, 400), memory(1, 0, 2, 300, 500), memory(1, 0, 3, 200, 500),
        # rank 1: compute [0,40)
        kernel(2, 10, "gemm", 0, 40, flops=2e9),
        step(2, 0, 0, 10), step(2, 1, 10, 20), step(2, 2, 30, 22),
        memory(2, 1, 1, 50, 60),
        # the simulator's rollback marker
        {"ph": "M", "name": "process_name", "pid": 0, "tid": 0, "args": {"name": "simulator (rollbacks, corrections)"}},
        {"ph": "i", "s": "t", "pid": 0, "tid": 1, "name": "rollback: all_reduce", "cat": "rollback", "ts": 7},
    ]
    return write_trace(tmp_path / name, events, {"gpu": "h100-sxm-80gb", "stale_replies": 2, "simulated_ns": 52_000})


def test_interval_helpers():
    a = merge([(20, 30), (0, 10), (5, 8), (10, 12), (40, 40)])
    assert a == [(0, 12), (20, 30)] and total(a) == 22
    assert overlap(a, merge([(5, 25)])) == 7 + 5


def test_summary_of_a_hand_built_two_rank_trace(tmp_path):
    with load(two_rank_trace(tmp_path), engine="builtin") as db:
        s = summarize(db, steady=False)
    assert s.ranks == [0, 1] and s.gpu == "h100-sxm-80gb" and s.peak_flops == H100_BF16
    assert "dense bf16" in s.peak

    assert s.steps.source == "step markers"
    assert [r.durations_ns for r in s.steps.per_rank] == [[12_000, 20_000, 18_000], [10_000, 20_000, 22_000]]
    r0 = s.steps.per_rank[0].stats
    assert (r0.steps, r0.mean_ns, r0.median_ns, r0.min_ns, r0.max_ns) == (2, 19_000, 19_000, 18_000, 20_000)
    assert s.steps.overall_ns == [12_000, 20_000, 22_000]  # the slower rank of each step
    assert (s.steps.stats.mean_ns, s.steps.stats.min_ns, s.steps.stats.max_ns) == (21_000, 20_000, 22_000)

    g0, g1 = s.gpus
    assert (g0.rank, g0.device, g0.span_ns) == (0, 0, 50_000)
    # compute 10+10+10; comm 20, of which [5,10) and [20,25) under compute: 10 exposed;
    # idle = 50 - 30 - 10
    assert (g0.compute_ns, g0.comm_ns, g0.exposed_comm_ns, g0.idle_ns) == (30_000, 20_000, 10_000, 10_000)
    assert g0.overlap_fraction == 0.5
    assert g0.tflops == pytest.approx(3e9 / 50e-6 / 1e12)  # 60 TFLOP/s
    assert g0.mfu == pytest.approx(60e12 / H100_BF16)
    assert (g1.rank, g1.device, g1.span_ns, g1.compute_ns, g1.comm_ns, g1.idle_ns) == (1, 1, 40_000, 40_000, 0, 0)
    assert g1.overlap_fraction is None and g1.tflops == pytest.approx(50.0)
    o = s.overall
    assert (o.gpus, o.window_ns, o.span_ns, o.compute_ns, o.comm_ns, o.exposed_comm_ns, o.idle_ns) == \
        (2, 50_000, 90_000, 70_000, 20_000, 10_000, 10_000)
    assert o.tflops == pytest.approx(100.0) and o.mfu == pytest.approx(100e12 / (2 * H100_BF16))

    assert [(k.name, k.count, k.total_ns) for k in s.top_kernels] == [
        ("gemm", 3, 60_000), ("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 1, 20_000), ("foo_kernel", 1, 10_000)]
    assert [k.share for k in s.top_kernels] == pytest.approx([60 / 90, 20 / 90, 10 / 90])
    assert [(m.rank, m.device, m.allocated_bytes, m.reserved_bytes) for m in s.memory] == [
        (0, 0, 300, 500), (1, 1, 50, 60)]
    assert (s.rollbacks, s.stale_replies, s.unknown_ops) == (1, 2, {"aten::foo.default": 1})
    assert s.simulated_ns == 52_000


def test_steps_from_repeating_nvtx_ranges_without_step_markers(tmp_path):
    events = names(1, "rank 0 · node 0 · GPU 0 · H100", {1: "host", 10: "cuda:0 default stream"}) + [
        x(1, 1, "init", 0, 3, cat="nvtx"),
        x(1, 1, "step", 10, 5, cat="nvtx"), x(1, 1, "fwd", 11, 1, cat="nvtx"),
        x(1, 1, "step", 20, 7, cat="nvtx"), x(1, 1, "fwd", 21, 1, cat="nvtx"),
        x(1, 1, "step", 30, 9, cat="nvtx"), x(1, 1, "fwd", 31, 1, cat="nvtx"),
        kernel(1, 10, "k", 10, 1)]
    with load(write_trace(tmp_path / "t.json", events), engine="builtin") as db:
        s = summarize(db)
    assert (s.steps.source, s.steps.detail) == ("nvtx ranges", "nvtx range 'step'")
    assert s.steps.per_rank[0].durations_ns == [5_000, 7_000, 9_000]
    assert s.steps.stats.mean_ns == 8_000


def test_steps_from_the_period_of_the_kernel_sequence(tmp_path):
    events = names(1, "rank 0 · node 0 · GPU 0 · H100", {10: "cuda:0 default stream"})
    events.append(kernel(1, 10, "init", 0, 1))
    for start in (10, 20.5, 31.5, 43):  # periods 10.5, 11, 11.5 us
        events += [kernel(1, 10, "a", start, 0.5), kernel(1, 10, "b", start + 2, 0.5),
                   kernel(1, 10, "opt", start + 4, 0.5)]
    with load(write_trace(tmp_path / "t.json", events), engine="builtin") as db:
        s = summarize(db)
    assert s.steps.source == "kernel periodicity" and "'a'" in s.steps.detail
    assert s.steps.per_rank[0].durations_ns == [10_500, 11_000, 11_500]
    assert s.steps.stats.mean_ns == 11_250


def test_no_steps_at_all_is_said(tmp_path):
    events = names(1, "rank 0 · node 0 · GPU 0 · H100", {10: "cuda:0 default stream"}) + [kernel(1, 10, "k", 0, 1)]
    with load(write_trace(tmp_path / "t.json", events), engine="builtin") as db:
        s = summarize(db)
    assert s.steps.source == "none" and s.steps.stats is None


def test_by_default_gpu_time_mfu_and_kernels_cover_the_steps_after_the_first(tmp_path):
    # issue 19, point 5: the first step also holds setup (the model's copy to the GPU); the
    # script's own step times leave it out, so MFU and kernel shares must too. No launch flows
    # in this trace: each op counts as launched when it starts. Rank 0's steps end at 12, 32, 50
    # us: its window is [12, 50): gemm@20 and foo@40 (the all-reduce at 5 belongs to step 1).
    # Rank 1's window [10, 52) holds no op it launched (its gemm starts at 0).
    with load(two_rank_trace(tmp_path), engine="builtin") as db:
        s = summarize(db)
    assert s.window_steps == 2 and s.window.startswith("steps 2-3")
    [g0] = s.gpus
    assert (g0.rank, g0.span_ns, g0.compute_ns, g0.comm_ns, g0.idle_ns) == (0, 30_000, 20_000, 0, 10_000)
    assert g0.tflops == pytest.approx(2e9 / 30e-6 / 1e12)
    assert [(k.name, k.count, k.total_ns) for k in s.top_kernels] == [("foo_kernel", 1, 10_000), ("gemm", 1, 10_000)]
    assert s.unknown_ops == {"aten::foo.default": 1}  # unknown ops are counted over the whole run


def test_a_kernel_belongs_to_the_step_whose_host_launched_it(tmp_path):
    # Step 1 ends at 10 us on the host while its last kernel (launched at 9) runs from 10 to 18
    # on the GPU: it is step 1's work, not step 2's. Launch flows tie each kernel to its call.
    events = names(1, "rank 0 · node 0 · GPU 0 · H100", {1: "host (aten op launches)", 2: "steps (optimizer.step)",
                                                           10: "cuda:0 default stream"})
    events += [step(1, 0, 0, 10), step(1, 1, 10, 10), step(1, 2, 20, 10)]
    for i, (launch, start) in enumerate([(9, 10), (11, 18), (21, 26)]):
        events += [x(1, 1, "aten::mm", launch, 0.5, cat="cpu_op"), kernel(1, 10, "gemm", start, 8, flops=1e9),
                   {"ph": "s", "id": i, "pid": 1, "tid": 1, "ts": launch, "name": "launch", "cat": "ac2g"},
                   {"ph": "f", "bp": "e", "id": i, "pid": 1, "tid": 10, "ts": start, "name": "launch", "cat": "ac2g"}]
    with load(write_trace(tmp_path / "t.json", events), engine="builtin") as db:
        s = summarize(db)
    [g] = s.gpus
    assert [(k.name, k.count) for k in s.top_kernels] == [("gemm", 2)]
    assert (g.span_ns, g.compute_ns) == (16_000, 16_000)  # [18, 34): the two kernels launched in steps 2-3


def test_diff_of_a_trace_with_itself_has_zero_deltas(tmp_path):
    with load(two_rank_trace(tmp_path), engine="builtin") as db:
        s = summarize(db, top=None, steady=False)
    d = diff(s, s)
    assert all(c.delta == 0 for c in d.figures if c.delta is not None)
    assert all(c.ratio == 1 for c in d.figures if c.ratio is not None)
    assert [k.name for k in d.kernels] == ["gemm", "ncclDevKernel_AllReduce_Sum_f32_RING_LL", "foo_kernel"]
    assert all(k.delta_ns == 0 and k.ratio == 1 for k in d.kernels)


def test_diff_shows_which_trace_communicates_more(tmp_path):
    with load(two_rank_trace(tmp_path, "a.json", comm_end=25), engine="builtin") as db:
        a = summarize(db, top=None, steady=False)
    with load(two_rank_trace(tmp_path, "b.json", comm_end=35), engine="builtin") as db:
        b = summarize(db, top=None, steady=False)
    d = diff(a, b, top=2)  # gemm and the all-reduce
    assert not d.per_step
    comm = next(c for c in d.figures if c.what == "comm per GPU (whole run) ns")
    # rank 0's all-reduce [5,25) -> [5,35); rank 1 has none: means over 2 GPUs
    assert (comm.a, comm.b, comm.delta) == (10_000, 15_000, 5_000)
    nccl = next(k for k in d.kernels if k.name.startswith("ncclDevKernel"))
    assert (nccl.total_a_ns, nccl.total_b_ns, nccl.delta_ns, nccl.ratio) == (20_000, 30_000, 10_000, 1.5)


def _steps_trace(tmp_path, name, steps, allocated):
    events = names(1, "rank 0 · node 0 · GPU 0 · H100", {2: "steps (optimizer.step)", 10: "cuda:0 default stream"})
    for i in range(steps):
        events += [step(1, i, 10 * i, 10), kernel(1, 10, "gemm", 10 * i + 1, 8, flops=1e9)]
    events.append(memory(1, 0, 1, allocated, 2 * allocated))
    return write_trace(tmp_path / name, events, {"gpu": "h100-sxm-80gb"})


def test_diff_of_a_3_step_and_a_5_step_run_of_the_same_program_compares_per_step(tmp_path):
    # issue 19, point 5: diff compared totals, so the longer run showed more compute
    with load(_steps_trace(tmp_path, "a.json", 3, 1 << 30), engine="builtin") as db:
        a = summarize(db, top=None)
    with load(_steps_trace(tmp_path, "b.json", 5, 3 << 29), engine="builtin") as db:
        b = summarize(db, top=None)
    d = diff(a, b)
    assert d.per_step
    figures = {c.what: c for c in d.figures}
    compute = figures["compute per GPU per step ns"]
    assert (compute.a, compute.b, compute.ratio) == (8_000, 8_000, 1.0)
    assert (figures["steps"].a, figures["steps"].b) == (3, 5)
    [gemm] = d.kernels
    assert (gemm.count_a, gemm.count_b, gemm.total_a_ns, gemm.total_b_ns) == (1, 1, 8_000, 8_000)
    mem = figures["peak allocated rank 0 cuda:0 bytes"]
    assert (mem.a, mem.b, mem.ratio) == (1 << 30, 3 << 29, 1.5)


def test_at_many_ranks_the_step_table_lists_the_slowest_and_the_spread(tmp_path):
    """40 ranks (mirrored ranks have steps only): rank 29 is the straggler (12 us later steps)."""
    from phantora.query.render import summary as render

    events = []
    for r in range(40):
        pid = r + 1
        events += names(pid, f"rank {r} · node {r // 8} · GPU {r % 8} · H100", {2: "steps (optimizer.step)"})
        later = 12 if r == 29 else 10 if r != 3 else 9
        events += [step(pid, 0, 0, 20), step(pid, 1, 20, later), step(pid, 2, 20 + later, later)]
    path = write_trace(tmp_path / "many.json", events, {"gpu": "h100-sxm-80gb"})
    text = render(summarize(load(path)))
    rows = [line for line in text.splitlines() if line.startswith("rank ")]
    assert rows[0].split()[:2] == ["rank", "29"] and len(rows) <= 8  # the slowest first, not all 40
    assert "32 more ranks" in text
    assert "slowest rank 29, fastest rank 3: 33.33% apart" in text
