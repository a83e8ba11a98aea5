"""Ops whose shapes depend on data (interpose/values/data_dependent.py, interpose/values/routing.py) on virtual
GPUs: the issue's table re-run as a traced script on both torch builds, a property test of the
value model's consistency across ops, the host stall where CUDA reads a count back, and what the
trace and the summary say about routing."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from phantora.query.db import load
from tests.virtual_gpu.harness import BUILDS, assert_ran, run_traced

SCRIPTS = Path(__file__).resolve().parent / "scripts"


def rows(db, sql: str) -> list[tuple]:
    return [tuple(r) for r in db.query(sql).rows]

TABLE_CHECKS = (
    "nonzero_exact", "nonzero_stride", "argwhere_exact", "where_cond_exact", "mask_index_exact",
    "masked_select_exact", "unique_exact", "unique_consecutive_exact", "bincount_exact", "repeat_interleave_exact",
    "nonzero_static_exact", "index_put_mask", "masked_scatter_exact", "assert_async", "topk_distinct_per_token",
    "counts_agree_on_every_path", "counts_sum_to_n_times_k", "sorted_tokens_all_routed", "item_of_counts",
    "repeat_interleave_counts", "argmax_balanced", "randn_mask_selects_half", "mask_counts_agree",
    "masked_select_of_randn", "rand_below_p", "activations_select_default", "unique_of_placeholder",
    "bincount_of_placeholder", "mask_false_selects_none", "sort_of_placeholder_is_identity",
)


@BUILDS
def test_every_data_dependent_op_runs_with_consistent_values(tmp_path: Path, user_python: str) -> None:
    proc, _ = run_traced(tmp_path, user_python, SCRIPTS / "data_dependent_ops.py")
    assert_ran(proc, *TABLE_CHECKS)


@pytest.mark.parametrize("routing", ["balanced", "zipf:1.3", "dirichlet:0.2"])
def test_counts_agree_on_every_path_for_any_router_shape(tmp_path: Path, routing: str) -> None:
    """Hypothesis, inside the traced process: 40 router shapes per routing model."""
    proc, _ = run_traced(tmp_path, sys.executable, SCRIPTS / "value_model_properties.py", routing.split(":")[0],
                         options=("--routing", routing))
    assert_ran(proc, "properties")


STALL = """
import torch
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
b = a @ a  # about 1.5 ms on an H100
idx = torch.nonzero(b[:, 0] > 0)  # CUDA copies the count to the host and waits for it
c = torch.randn(1024, device="cuda")  # launched only once the host has the count
torch.cuda.synchronize()
print("ok stall", idx.shape[0])
"""


def test_nonzero_stalls_the_host_until_the_gpu_reaches_it(tmp_path: Path) -> None:
    script = tmp_path / "stall.py"
    script.write_text(STALL)
    proc, out = run_traced(tmp_path, sys.executable, script)
    assert_ran(proc, "stall")
    db = load(out)
    mm = rows(db, "select ts + dur from slice where name like '%gemm%' order by dur desc limit 1")[0][0]
    host = rows(db, "select ts, ts + dur from slice where name = 'aten::nonzero' and category = 'cpu_op'")
    assert host, "no host slice of aten::nonzero"
    begin, end = host[0]
    assert end >= mm, f"the host left nonzero at {end} before the GEMM ended at {mm}"
    later = rows(db, f"select min(ts) from slice where category = 'cpu_op' and ts > {begin}")[0][0]
    assert later is not None and later >= mm, "the next launch came before the count was back"


MOE = """
import torch, torch.nn as nn, torch.nn.functional as F

class Router(nn.Module):
    def __init__(self, experts):
        super().__init__()
        self.gate = nn.Linear(64, experts, bias=False)

    def forward(self, x):
        return torch.topk(self.gate(x).softmax(-1), 2, dim=-1).indices

layers = [Router(8).cuda(), Router(8).cuda(), Router(4).cuda()]
x = torch.randn(1000, 64, device="cuda")
for step in range(2):
    for r in layers:
        ids = r(x)
        print("counts", torch.bincount(ids.view(-1), minlength=r.gate.out_features).tolist())
"""


def _run_moe(tmp_path: Path, *options: str):
    script = tmp_path / "routers.py"
    script.write_text(MOE)
    proc, out = run_traced(tmp_path, sys.executable, script, options=options)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc, out


def test_routing_is_shown_per_layer_in_summary_trace_and_metadata(tmp_path: Path) -> None:
    routing = tmp_path / "fractions.json"
    routing.write_text(json.dumps({"layers": [[0.5, 0.2, 0.1, 0.1, 0.05, 0.05, 0.0, 0.0]],
                                   "default": [0.125] * 8}))
    proc, out = _run_moe(tmp_path, "--routing", str(routing))
    counts = [json.loads(c) for c in re.findall(r"counts (\[.*\])", proc.stdout)]
    # layer 0 from the file's list, layer 1 from its default; the same in step 2
    assert counts[:2] == counts[3:5] == [[1000, 400, 200, 200, 100, 100, 0, 0], [250] * 8]
    # the third router chooses among 4 experts, the default lists 8: balanced, with a warning
    assert counts[2] == [500] * 4
    assert re.search(r"phantora: warning: routing file .* default has 8 fractions, but MoE layer 2 .* 4 experts", proc.stderr)


def test_a_layer_past_the_routing_file_fails_the_script_naming_it(tmp_path: Path) -> None:
    routing = tmp_path / "fractions.json"
    routing.write_text(json.dumps({"layers": [[0.125] * 8, [0.125] * 8]}))
    script = tmp_path / "routers.py"
    script.write_text(MOE)
    proc, _ = run_traced(tmp_path, sys.executable, script, options=("--routing", str(routing)))
    assert proc.returncode == 1
    assert re.search(r"RoutingModelError: routing file .* lists 2 MoE layers and no \"default\"; the program routed "
                     r"tokens in MoE layer 2", proc.stderr), proc.stderr[-3000:]


def test_routing_summary_counts_and_counters(tmp_path: Path) -> None:
    proc, out = _run_moe(tmp_path, "--routing", "zipf:1.0")
    assert "MoE routing: zipf:1 (seed 0" in proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if re.match(r"\s+L\d Router", ln)]
    assert len(lines) == 3, proc.stderr
    db = load(out)
    layers = db.metadata["moe_routing"]["layers"]
    assert [(d["layer"], d["experts"], d["top_k"], d["tokens"]) for d in layers] == [(0, 8, 2, 1000), (1, 8, 2, 1000),
                                                                                      (2, 4, 2, 1000)]
    for d in layers:
        assert sum(d["tokens_per_expert"]) == 2000
        assert d["max_over_mean"] == pytest.approx(max(d["tokens_per_expert"]) / (2000 / d["experts"]), abs=1e-3)
    printed = [json.loads(c) for c in re.findall(r"counts (\[.*\])", proc.stdout)[:3]]
    assert printed == [d["tokens_per_expert"] for d in layers]
    # one counter per layer, a series per expert, written once (routing does not change per step)
    series = rows(db, "select t.name, count(*), max(c.value) from counter c join counter_track t on c.track_id = t.id "
                    "where t.name like 'MoE L%' group by t.name order by t.name")
    assert len(series) == 8 + 8 + 4 and all(n == 1 for _, n, _ in series)
    assert [v for name, _, v in series if name.startswith("MoE L0 ")] == [float(c) for c in layers[0]["tokens_per_expert"]]
    # `phantora summary` reads it back: the model and each layer's imbalance
    shown = subprocess.run([sys.executable, "-m", "phantora.cli", "summary", str(out)], capture_output=True, text=True,
                           timeout=300)
    assert shown.returncode == 0, shown.stderr
    assert "MoE routing: zipf:1 (seed 0" in shown.stdout
    for d in layers:
        assert re.search(rf"{d['name']}\s+Router \(routers\.py:\d+\)\s+{d['experts']}\s+2\s+1,000\s+1\s+"
                         rf"{d['max_over_mean']:.2f}", shown.stdout), shown.stdout[-2000:]
