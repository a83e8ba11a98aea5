from __future__ import annotations

import sys

import pytest


@pytest.fixture
def user_python(request: pytest.FixtureRequest) -> str:
    """The interpreter of the traced user process: the test's own (CPU build of torch) or one with
    the CUDA build (tests/conftest.py's cuda_torch_python)."""
    if request.param == "cuda-build":
        return request.getfixturevalue("cuda_torch_python")
    return sys.executable
