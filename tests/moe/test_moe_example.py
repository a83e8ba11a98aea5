"""examples/moe_train.py, the plain-PyTorch Mixtral-style model, under phantora: Mixtral's eager
expert loop (a host sync per expert: `torch.where` is nonzero), grouped GEMMs timed from the routed
counts, and expert parallelism over torchrun ranks with uneven all_to_alls under skewed routing."""

from __future__ import annotations

import re
import sys
from pathlib import Path

from phantora.query.db import load
from tests.virtual_gpu.harness import ROOT, run_traced

EXAMPLE = ROOT / "examples" / "moe_train.py"
SMALL = ("--layers", "2", "--dim", "512", "--expert-hidden", "1024", "--seq", "512", "--batch", "2", "--steps", "3")
LAYERS, DIM, HIDDEN, EXPERTS, TOP_K, TOKENS, STEPS = 2, 512, 1024, 8, 2, 1024, 3


def _ok(proc) -> str:
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    assert "unknown ops: none" in proc.stderr, proc.stderr[-3000:]
    assert len(re.findall(r"^step \d+: loss", proc.stdout, re.M)) == STEPS, proc.stdout
    return proc.stderr


def _arg(key: str) -> str:
    return f"extract_arg(arg_set_id, 'args.{key}')"


def test_eager_expert_loop_syncs_the_host_once_per_expert(tmp_path: Path) -> None:
    proc, out = run_traced(tmp_path, sys.executable, EXAMPLE, *SMALL)
    err = _ok(proc)
    assert len(re.findall(r"L\d MoE \(moe_train\.py:\d+\): 8 experts, top-2, 1,024 tokens over 1 rank\(s\), "
                          r"max/mean 1\.00", err)) == LAYERS, err
    db = load(out)
    # torch.where(expert_of_row == e) is a nonzero: one host sync per expert, layer and step
    syncs = db.query("select count(*) from slice where name = 'aten::nonzero' and category = 'cpu_op'").scalar()
    assert syncs == EXPERTS * LAYERS * STEPS
    # each expert's gate/up GEMM: its 256 routed rows (1,024 tokens x 2 / 8 experts) x 512 -> 2 x 1,024
    rows = TOKENS * TOP_K // EXPERTS
    gate_up = db.query(f"select count(*) from slice where {_arg('op')} = 'aten::mm.default' "
                       f"and {_arg('flops')} = {2.0 * rows * DIM * 2 * HIDDEN}").scalar()
    assert gate_up >= EXPERTS * LAYERS * STEPS


def test_grouped_experts_are_timed_from_the_routed_counts(tmp_path: Path) -> None:
    """A zipf routing: the grouped GEMM's offsets are the skewed counts; its FLOPs are all routed
    rows' (the groups add up to tokens x top-k) and the summary names the imbalance."""
    proc, out = run_traced(tmp_path, sys.executable, EXAMPLE, *SMALL, "--grouped", options=("--routing", "zipf:1.0"))
    err = _ok(proc)
    ratios = [float(r) for r in re.findall(r"L\d MoE .* max/mean ([\d.]+)", err)]
    assert len(ratios) == LAYERS and all(r > 1.3 for r in ratios), err
    db = load(out)
    flops = db.query(f"select {_arg('flops')} from slice where name like 'cutlass_grouped_gemm%'").rows
    # the gate/up projection of every routed row: forward, and in backward its input gradient
    # (rows x 2 hidden -> dim) and weight gradient (grouped over the rows): the same FLOPs each
    gate_up = 2.0 * TOKENS * TOP_K * DIM * 2 * HIDDEN
    assert sum(1 for (f,) in flops if f == gate_up) == 3 * LAYERS * STEPS, flops[:6]


def test_expert_parallel_skewed_all_to_alls_agree_across_ranks(tmp_path: Path) -> None:
    """torchrun, 2 ranks, 4 experts each, zipf routing: every rank sends the same split (routing does
    not depend on the rank), so the rank with the popular experts receives more rows; the
    simulator checks that what each rank expects from each other matches what that one sends."""
    proc, out = run_traced(tmp_path, sys.executable, EXAMPLE, *SMALL, "--ep", "2", "--grouped",
                           options=("--nproc-per-node", "2", "--routing", "zipf:1.0"))
    _ok(proc)
    db = load(out)
    rows = db.query(f"select upid, {_arg('bytes sent to each member[0]')}, {_arg('bytes sent to each member[1]')}, "
                    f"{_arg('bytes received from each member[0]')}, {_arg('bytes received from each member[1]')} "
                    f"from slice join thread_track tt on slice.track_id = tt.id join thread using (utid) "
                    f"where {_arg('op')} = 'all_to_all' and {_arg('dtype')} = 'bfloat16'").rows
    row_bytes = DIM * 2
    by_rank: dict[int, list[tuple]] = {}
    for upid, *sizes in rows:
        by_rank.setdefault(upid, []).append(tuple(sizes))
    assert len(by_rank) == 2, rows[:4]
    first, second = by_rank.values()
    # the forward dispatches: each rank sends tokens x top-k rows in all, the same split
    total = TOKENS * TOP_K * row_bytes
    dispatch = [s for s in first if s[0] + s[1] == total]
    assert dispatch and [s[:2] for s in dispatch] == [s[:2] for s in second if s[0] + s[1] == total]
    # rank 0 receives from each rank what each sends to rank 0; rank 1 likewise; not evenly
    assert all(s[2:] == (s[0], s[0]) and s[0] != s[1] for s in dispatch), dispatch
    assert all(s[2:] == (s[1], s[1]) for s in second if s[0] + s[1] == total)
