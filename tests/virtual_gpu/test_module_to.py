"""Module.to() / .cuda() / .half() keep the Parameter objects, as on a real GPU (issue 14, cause 5).

Before the fix every conversion of a module whose parameters carry a weakref failed with
"_apply(): Couldn't swap Linear.weight" (torch sends FakeTensor parameters through swap_tensors,
which refuses tensors with weakrefs; DeepSpeed puts a weakref.finalize on every parameter).
"""

from __future__ import annotations

from pathlib import Path

from tests.virtual_gpu.harness import BUILDS, assert_ran, run_traced

CHECKS = (
    "to_cuda_keeps_parameters", "grads_move_with_parameters", "weakrefs_and_attributes_kept",
    "memory_counts_each_parameter_once", "optimizer_built_before_to_steps_on_gpu",
    "dtype_and_device_changes_keep_parameters", "cuda_cpu_to_empty_keep_parameters", "buffers_move",
    "real_cpu_parameter_moves",
)


@BUILDS
def test_module_conversions_keep_parameters(tmp_path: Path, user_python: str) -> None:
    proc, _ = run_traced(tmp_path, user_python, "module_to_checks.py")
    assert_ran(proc, *CHECKS)
