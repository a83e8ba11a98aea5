"""The counted host's costs (phantora/cost/host.py PythonWork) against host time measured per
training phase on a real H100 machine (tests/data/groundtruth/host_probe.json).

tests/data/counted_host_probe.json holds what phantora saw of the same phases: their host time with
every counted cost at 0 (dispatch, launches, syncs as modelled) and the Python each ran, counted
(benchmarks/host/fit_python_work.py records both). The prediction is that time plus the counted
Python and the per-op C++ at PythonWork's costs; it must land within the fit's stated error."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from phantora.cost.host import PYTHON_WORK

DATA = Path(__file__).parents[1] / "data"
REAL = {w["name"]: w for w in json.loads((DATA / "groundtruth/host_probe.json").read_text())["data"]}
SEEN = json.loads((DATA / "counted_host_probe.json").read_text())
CKPT_REGIONS = {"gpt_L6_ckpt": 6}  # blocks host_probe.py wraps in torch.utils.checkpoint
PHASES = ("fwd_nograd", "fwd", "fwd_bwd", "step")


def predicted_us(name: str, phase: str) -> float:
    w, c = REAL[name]["counts"], PYTHON_WORK
    instructions, calls, _, sites = SEEN["counts"][name][phase]
    python_ps = (instructions - sites) * c.instruction_ps + sites * c.call_site_ps + calls * c.call_ps
    fwd, both = w["fwd"], w["fwd_bwd"]
    own = w["fwd_nograd" if phase == "fwd_nograd" else "fwd"]
    ns = python_ps / 1e3
    if phase != "step":  # the optimizer's ops pay no model-code C++
        ns += (own["ops"] - own["views"]) * c.forward_op_ns
    if phase in ("fwd", "fwd_bwd"):
        ns += (fwd["ops"] - fwd["views"]) * c.records_grad_ns
    if phase == "fwd_bwd":
        views = both["views"] - fwd["views"]
        ns += (both["backward_ops"] - views) * c.backward_op_ns + views * c.backward_view_ns
    regions = CKPT_REGIONS.get(name, 0)
    ns += {"fwd_nograd": regions, "fwd": regions, "fwd_bwd": 2 * regions}.get(phase, 0) * c.checkpoint_region_ns
    return SEEN["base"][name][phase] + ns / 1e3


@pytest.mark.parametrize("name", list(REAL))
def test_each_phase_within_the_fits_stated_error(name):
    for phase in PHASES:
        real = REAL[name]["us"][phase]
        assert abs(predicted_us(name, phase) / real - 1) < 0.35, (name, phase, predicted_us(name, phase), real)


def test_mean_error_over_all_phases():
    errors = [abs(predicted_us(n, p) / REAL[n]["us"][p] - 1) for n in REAL for p in PHASES]
    assert sum(errors) / len(errors) < 0.15


def test_the_optimizer_step_is_its_python():
    """A step's host time beyond its launches is the optimizer's Python (AdamW, foreach or fused;
    SGD with GradScaler): counted, with no per-step figure of its own."""
    for name in REAL:
        real, base = REAL[name]["us"]["step"], SEEN["base"][name]["step"]
        assert predicted_us(name, "step") - base > 0.5 * (real - base)
