"""The estimator against torch.profiler kernel times measured on an H100 (h100_kernel_profile.json):
single calls of the ops a transformer step spends its time in, re-captured here on fake tensors.

Unlike the calibration file these times carry no launch gap, so the tolerance is one number:
every case within 20%, except KNOWN_DIFFERENCES.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from .workloads import PROFILE_CASES, capture_call

PROFILE = json.loads((Path(__file__).parents[1] / "data" / "groundtruth" / "h100_kernel_profile.json").read_text())

KNOWN_DIFFERENCES = {
    # A 1-element kernel runs 1.2 us; phantora's floor is 2 us per kernel on purpose (a stream
    # of tiny kernels also pays the gap between them).
    "add_ 1 element",
    # 33 MB of weights re-read by back-to-back calls stay in the 50 MB L2; the model assumes HBM.
    "mm 16x4096x4096 bf16",
}


@pytest.mark.parametrize("case", sorted(PROFILE["cases_us"]))
def test_profiled_case(estimator, case):
    measured_us = PROFILE["cases_us"][case]
    estimated_us = sum(estimator.estimate(s).duration_ns for s in capture_call(PROFILE_CASES[case])) / 1e3
    ratio = estimated_us / measured_us
    if case in KNOWN_DIFFERENCES:
        assert 1.0 < ratio < 2.0
    else:
        assert 0.8 < ratio < 1.2, f"{case}: estimated {estimated_us:.1f} us, profiled {measured_us:.1f} us"


def test_every_profile_case_has_a_measurement():
    assert set(PROFILE["cases_us"]) == set(PROFILE_CASES)


def test_gpt_step_total(estimator, gpt_fused_sigs):
    """Whole TinyGPT step: profiled 7.3 ms of kernels on the H100. The capture here runs CPU
    autocast, whose cast list differs a little from CUDA's, so the bound is looser."""
    measured_us = PROFILE["gpt_step"]["measured_kernel_us"]
    estimated_us = sum(estimator.estimate(s).duration_ns for s in gpt_fused_sigs) / 1e3
    assert 0.8 < estimated_us / measured_us < 1.25
