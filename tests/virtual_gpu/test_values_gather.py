"""all_gather_into_tensor carries shadows and values like all_gather (Hugging Face Trainer's
loss normalisation gathers a token count through Accelerate), and torch.empty reads the same
value on every run (a shadow of the host's uninitialized memory read differently each time)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.virtual_gpu.harness import BUILDS, assert_ran, run_traced


@BUILDS
@pytest.mark.parametrize("ranks", [1, 2])
def test_all_gather_into_tensor_carries_values(tmp_path: Any, user_python: str, ranks: int) -> None:
    proc, _ = run_traced(tmp_path, user_python, "values_gather_into_tensor.py", options=("--nproc-per-node", str(ranks)))
    assert_ran(proc, "empty_reads_default", "all_gather_into_tensor_values")
