"""The host-time model against host time measured per training phase on a real H100 machine.

tests/data/groundtruth/host_probe.json holds, per small workload (MLPs, GPTs with and without
activation checkpointing, a ResNet), the wall time of each phase with shapes so small that the
GPU never limits, and what that phase dispatched. The model's prediction from those counts
must land within the fit's stated per-phase error, and in total close to the measured sum.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from phantora import protocol as P
from phantora.cost import COMPUTE, NO_GPU_WORK
from phantora.cost.host import HOST_COSTS, PYTHON_OVERHEAD, host_event_ns, host_ns, python_overhead_ns

DATA = json.loads((Path(__file__).parents[1] / "data/groundtruth/host_probe.json").read_text())["data"]
CKPT_REGIONS = {"gpt_L6_ckpt": 6}  # blocks wrapped in torch.utils.checkpoint in host_probe.py


def _forward_us(c: dict, grad: bool, regions: int) -> float:
    op = host_ns(COMPUTE, 1, "pointwise") + python_overhead_ns(
        P.OP_IN_MODULE | (P.OP_RECORDS_GRAD if grad else 0), True)
    view = host_ns(NO_GPU_WORK, 0, "view") + python_overhead_ns(P.OP_IN_MODULE, False)
    ns = ((c["ops"] - c["views"]) * op + c["views"] * view + host_event_ns("module_call", c["module_calls"])
          + host_event_ns("checkpoint", regions))
    return ns / 1e3


def _predicted_us(w: dict) -> dict[str, float]:
    counts, regions = w["counts"], CKPT_REGIONS.get(w["name"], 0)
    fwd, both = counts["fwd"], counts["fwd_bwd"]
    bwd_views = both["views"] - fwd["views"]
    bwd_ops = both["backward_ops"] - bwd_views
    bwd_modules = both["module_calls"] - fwd["module_calls"]  # recomputed by checkpointing
    backward = (bwd_ops * (host_ns(COMPUTE, 1, "pointwise") + python_overhead_ns(P.OP_BACKWARD, True))
                + bwd_views * (host_ns(NO_GPU_WORK, 0, "view") + python_overhead_ns(P.OP_BACKWARD, False))
                + host_event_ns("module_call", bwd_modules) + host_event_ns("checkpoint", regions)) / 1e3
    return {
        "fwd_nograd": _forward_us(counts["fwd_nograd"], False, regions),
        "fwd": _forward_us(fwd, True, regions),
        "fwd_bwd": _forward_us(fwd, True, regions) + backward,
    }


@pytest.mark.parametrize("workload", DATA, ids=[w["name"] for w in DATA])
def test_each_phase_within_the_fits_stated_error(workload):
    for phase, predicted in _predicted_us(workload).items():
        measured = workload["us"][phase]
        assert abs(predicted / measured - 1) < 0.50, (workload["name"], phase, predicted, measured)


def test_total_over_all_phases_close_to_measured():
    predicted = sum(sum(_predicted_us(w).values()) for w in DATA)
    measured = sum(w["us"][p] for w in DATA for p in ("fwd_nograd", "fwd", "fwd_bwd"))
    assert abs(predicted / measured - 1) < 0.10, (predicted, measured)


def test_bare_op_outside_modules_costs_only_dispatch_and_launch():
    # shared/calibration: a loop of 1-element in-place adds costs ~6.4 us per launch on that host
    total = host_ns(COMPUTE, 1, "pointwise") + python_overhead_ns(0, True)
    assert total == pytest.approx(6_400, rel=0.05)


def test_optimizer_ops_pay_no_python_overhead_but_the_step_does():
    assert python_overhead_ns(P.OP_IN_OPTIMIZER | P.OP_IN_MODULE, True) == 0
    assert host_event_ns("optimizer_step", 100) == PYTHON_OVERHEAD.optimizer_step_ns + 100 * PYTHON_OVERHEAD.optimizer_param_ns


def test_unknown_host_event_is_an_error():
    with pytest.raises(ValueError, match="unknown host event"):
        host_event_ns("garbage_collect", 1)


def test_backward_costs_more_than_forward_per_op():
    fwd = python_overhead_ns(P.OP_IN_MODULE | P.OP_RECORDS_GRAD, True)
    assert python_overhead_ns(P.OP_BACKWARD, True) > fwd > python_overhead_ns(P.OP_IN_MODULE, True)
    assert HOST_COSTS.view_ns < HOST_COSTS.dispatch_ns
