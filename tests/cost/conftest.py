"""Fixtures for the cost-model tests: the H100 estimator, signatures captured from training
steps (see workloads.py), and the shared H100 calibration data."""

from __future__ import annotations

import pytest

from phantora.cost.analytical import AnalyticalEstimator
from phantora.cost.measurements import Measurement, load_measurements
from phantora.hardware import lookup_gpu
from phantora.ops import OpSignature

from .workloads import CALIBRATION, capture, cnn_step, gpt_step


# --- fixtures ----------------------------------------------------------------------------

@pytest.fixture(scope="session")
def h100():
    return lookup_gpu("h100")


@pytest.fixture(scope="session")
def estimator(h100) -> AnalyticalEstimator:
    return AnalyticalEstimator(h100)


@pytest.fixture(scope="session")
def gpt_fused_sigs() -> list[OpSignature]:
    return capture(lambda: gpt_step(fused=True))


@pytest.fixture(scope="session")
def gpt_foreach_sigs() -> list[OpSignature]:
    return capture(lambda: gpt_step(fused=False, backend="efficient"))


@pytest.fixture(scope="session")
def cnn_sigs() -> list[OpSignature]:
    return capture(cnn_step)


@pytest.fixture(scope="session")
def measurements() -> list[Measurement]:
    return load_measurements(CALIBRATION)
