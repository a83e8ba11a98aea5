"""Tensors on virtual GPUs (and CPU tensors without data) have distinct data pointers, as on a
GPU: Accelerate's FSDP2 prepare maps optimizer parameters by data_ptr(), and with every pointer
0 it gave the optimizer one parameter over and over."""

from __future__ import annotations

from typing import Any

from tests.virtual_gpu.harness import BUILDS, assert_ran, run_traced


@BUILDS
def test_data_pointers_are_distinct(tmp_path: Any, user_python: str) -> None:
    proc, _ = run_traced(tmp_path, user_python, "data_ptr_addresses.py")
    assert_ran(proc, "cuda_addresses", "parameter_addresses")
