"""Expert parallelism: all_to_all with uneven split sizes that agree across ranks, simulated as
flows of those sizes (phantora/engine/collectives.py, phantora/net), and the expert GEMMs timed
from the routed token counts. A hand count with 2 experts under a skewed routing file."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from phantora.engine.collectives import CollectiveCall, CollectiveMatcher, CollectiveMismatch, split_matrix
from phantora.net.cluster import load_cluster
from phantora.net.network import Network
from phantora.net.records import CollectiveSpec
from phantora.query.db import load
from tests.virtual_gpu.harness import assert_ran, run_traced

SCRIPTS = Path(__file__).resolve().parent / "scripts"


def a2a(rank: int, send: tuple[int, ...], recv: tuple[int, ...], group=(0, 1, 2), **kw) -> CollectiveCall:
    return CollectiveCall(rank, "all_to_all", tuple(group), 0, sum(send), dtype="bfloat16", send_splits=send,
                          recv_splits=recv, site=f"ep.py:{10 + rank}", **kw)


def test_uneven_splits_that_agree_make_one_collective_with_a_split_matrix() -> None:
    m = CollectiveMatcher()
    sends = {0: (10, 20, 30), 1: (1, 2, 3), 2: (0, 0, 7)}
    for r in (0, 1, 2):
        recv = tuple(sends[s][r] for s in (0, 1, 2))
        p = m.arrive(a2a(r, sends[r], recv), 0)
    assert p is not None and p.complete()
    assert split_matrix([p.arrivals[r] for r in p.members]) == ((10, 20, 30), (1, 2, 3), (0, 0, 7))


def test_even_all_to_all_keeps_the_even_network_path() -> None:
    calls = [a2a(r, (8, 8, 8), (8, 8, 8)) for r in range(3)]
    assert split_matrix(calls) is None


def test_splits_that_disagree_name_both_ranks_and_the_sizes() -> None:
    m = CollectiveMatcher()
    m.arrive(a2a(0, (10, 20, 30), (10, 1, 0)), 0)
    m.arrive(a2a(1, (1, 2, 3), (20, 2, 0)), 0)
    with pytest.raises(CollectiveMismatch) as e:
        m.arrive(a2a(2, (0, 0, 7), (30, 3, 8)), 0)  # expects 8 from itself, sends itself 7
    msg = str(e.value)
    assert "mismatched all_to_all" in msg
    assert "rank 2 expects 8 bytes from rank 2, which sends it 7" in msg
    assert e.value.ranks == (0, 1, 2)


def test_a_mirrored_members_receive_sizes_are_not_checked() -> None:
    """Under --ranks auto a mirrored rank's call is its representative's copy: its sends stand for
    its own, its receive sizes do not."""
    m = CollectiveMatcher()
    m.arrive(a2a(0, (10, 20), (10, 1), group=(0, 1)), 0)
    done = m.arrive(a2a(1, (1, 2), (10, 1), group=(0, 1), mirrored=True), 0)
    assert done is not None


def test_the_network_moves_each_split_as_a_flow_of_its_size() -> None:
    """Two ranks on different nodes: 3 MB one way, 1 MB the other, at the same inter-node
    bandwidth, so the collective lasts as long as the larger flow alone would."""
    cluster = load_cluster("dgx-h100", nodes=2)
    ranks = (0, 8)

    def end(split: tuple[tuple[int, ...], ...] | None, nbytes: int) -> int:
        net = Network(cluster)
        h = net.submit(CollectiveSpec("all_to_all", nbytes, ranks, split_bytes=split), 0)
        return net.finish_time(h)

    uneven = end(((0, 3 << 20), (1 << 20, 0)), 4 << 20)
    three = end(((0, 3 << 20), (3 << 20, 0)), 6 << 20)
    one = end(((0, 1 << 20), (1 << 20, 0)), 2 << 20)
    assert uneven == three > one


@pytest.mark.slow
def test_two_experts_skewed_hand_count_of_bytes_and_flops(tmp_path: Path) -> None:
    """Fractions [0.75, 0.25], 2,048 tokens per rank, top-1: each rank routes 1,536 tokens to
    expert 0 (rank 0) and 512 to expert 1 (rank 1). Rank 0's GEMM has 1,536 + 1,536 = 3,072 rows,
    rank 1's 1,024. Token all-to-all, rows of 1,024 bf16 (2,048 bytes): rank 0 sends 512 rows to
    rank 1 (1,048,576 bytes), rank 1 sends 1,536 rows to rank 0 (3,145,728 bytes)."""
    routing = tmp_path / "two.json"
    routing.write_text(json.dumps({"layers": [[0.75, 0.25]]}))
    proc, out = run_traced(tmp_path, sys.executable, SCRIPTS / "ep_two_experts.py",
                           options=("--nproc-per-node", "2", "--routing", str(routing)))
    assert_ran(proc, "rank 0", "rank 1")
    assert "rank 0 send [1536, 512] recv [1536, 1536] gemm_rows 3072" in proc.stdout
    assert "rank 1 send [1536, 512] recv [512, 512] gemm_rows 1024" in proc.stdout
    db = load(out)

    def arg(key: str) -> str:
        return f"extract_arg(arg_set_id, 'args.{key}')"

    gemms = sorted(r[0] for r in db.query(f"select {arg('flops')} from slice where {arg('op')} = 'aten::mm.default' "
                                          f"and {arg('flops')} > 1e9").rows)
    D, H = 1024, 4096
    assert gemms == [2.0 * 1024 * D * H, 2.0 * 3072 * D * H]
    members = ", ".join(arg(f"{what} each member[{i}]") for what in ("bytes sent to", "bytes received from")
                        for i in (0, 1))
    sent = db.query(f"select {members} from slice where {arg('op')} = 'all_to_all' and {arg('seq')} = 1").rows
    row = 2 * D
    assert sorted(tuple(r) for r in sent) == sorted([
        (1536 * row, 512 * row, 1536 * row, 1536 * row),  # rank 0: sends 512 rows to rank 1, receives 1,536
        (1536 * row, 512 * row, 512 * row, 512 * row),  # rank 1: sends 1,536 rows to rank 0, receives 512
    ])
    assert re.search(r"L0 .*2 experts, top-1, 4,096 tokens over 2 rank\(s\), max/mean 1\.50", proc.stderr)


def test_mismatched_all_to_all_splits_stop_the_run_naming_ranks_and_sizes(tmp_path: Path) -> None:
    proc, _ = run_traced(tmp_path, sys.executable, SCRIPTS / "ep_mismatch.py", options=("--nproc-per-node", "2"))
    assert proc.returncode != 0 and "not reached" not in proc.stdout
    text = proc.stdout + proc.stderr
    assert "mismatched all_to_all" in text, text[-3000:]
    # 2 rows of 8 float32 = 64 bytes sent; 3 rows = 96 bytes expected
    assert "rank 1 expects 96 bytes from rank 0, which sends it 64" in text, text[-3000:]
    assert "ep_mismatch.py:13" in text  # the call site
