"""examples/gpt_train.py under phantora dispatches the aten ops a real H100 run dispatches.

Expected counts come from the real-H100 torch-profiler runs of the same script
(tests/data/groundtruth/examples/profile_gpt_124m_b8.json and profile_gpt_124m_b4_ckpt.json:
8 steps, 12 blocks of width 768). Op counts do not depend on batch or sequence length, so the
simulated runs use tiny ones to stay fast.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from test_trace_cli import events, trace_script

PROFILES = Path(__file__).resolve().parents[1] / "data/groundtruth/examples"
PROFILED_STEPS = 8  # examples_probe.py runs --steps 8 under the profiler
TINY = ["--batch", "1", "--seq", "64", "--steps", "3"]


def profiled_calls(config: str) -> Counter:
    """Calls per aten op over the whole profiled run (all input shapes together)."""
    rows = json.loads((PROFILES / f"profile_{config}.json").read_text())["ops"]
    calls: Counter = Counter()
    for row in rows:
        calls[row["op"]] += row["count"]
    return calls


def simulated_calls_per_step(path: Path) -> Counter:
    """Host-track aten ops per training step after the first (the script synchronizes at the
    start of every step, which opens each step's window)."""
    evs = events(path)
    starts = sorted(e["ts"] for e in evs if e.get("cat") == "cuda_runtime" and e["name"] == "cudaDeviceSynchronize")
    assert len(starts) == 3, starts
    ops = Counter(e["name"] for e in evs if e.get("cat") == "cpu_op" and e["ts"] >= starts[1])
    return Counter({name: n / (len(starts) - 1) for name, n in ops.items()})


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Counter]:
    out = {}
    for name, extra in (("plain", []), ("checkpoint", ["--checkpoint"])):
        proc, path = trace_script(tmp_path_factory.mktemp(name), "examples/gpt_train.py", *TINY, *extra)
        assert proc.returncode == 0, proc.stderr[-3000:]
        out[name] = simulated_calls_per_step(path)
    return out


@pytest.mark.slow
def test_clip_grad_norm_takes_the_foreach_path_as_on_a_real_gpu(runs):
    # Real: clip_grad_norm_ is one _foreach_norm over the 100 gradients, a vector norm of the
    # stacked norms, and one _foreach_mul_; no per-parameter norm or mul_.
    real = profiled_calls("gpt_124m_b8")
    sim = runs["plain"]
    for op in ("aten::_foreach_norm", "aten::_foreach_mul_", "aten::linalg_vector_norm", "aten::mul_"):
        assert sim[op] == real[op] / PROFILED_STEPS, (op, sim[op], real[op])


@pytest.mark.slow
def test_checkpointing_adds_only_the_detaches_real_recomputation_makes(runs):
    # Checkpointing's own detaches per step: the real profiles differ by the saved tensors the
    # recomputation packs; phantora used to add one more per saved tensor unpacked in backward.
    real_added = (profiled_calls("gpt_124m_b4_ckpt")["aten::detach"]
                  - profiled_calls("gpt_124m_b8")["aten::detach"]) / PROFILED_STEPS
    sim_added = runs["checkpoint"]["aten::detach"] - runs["plain"]["aten::detach"]
    assert sim_added == real_added, (sim_added, real_added)


@pytest.mark.slow
def test_checkpointed_step_launches_the_real_number_of_gemms(runs):
    # 12 blocks: forward, recomputation (which stops before the last GEMM once every saved
    # tensor is back) and backward. Real: the profile's GEMM kernels per step.
    rows = json.loads((PROFILES / "profile_gpt_124m_b4_ckpt.json").read_text())["kernels"]
    real = sum(k["count"] for k in rows if k["name"].startswith("nvjet")) / PROFILED_STEPS
    assert runs["checkpoint"]["aten::mm"] == real
