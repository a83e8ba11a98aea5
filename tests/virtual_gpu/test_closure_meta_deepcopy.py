"""Paths Lightning's Trainer takes that plain training loops do not (issue 15, Lightning): the
optimizer's closure runs forward and backward inside Optimizer.step; ThroughputMonitor's FLOP
count runs the model on the meta device; ModelCheckpoint deep-copies logged tensors. The script
checks each against what a GPU run does (see its docstring)."""

from __future__ import annotations

from pathlib import Path

from tests.virtual_gpu.harness import BUILDS, assert_ran, run_traced


@BUILDS
def test_closure_meta_flops_and_deepcopy(tmp_path: Path, user_python: str) -> None:
    proc, _ = run_traced(tmp_path, user_python, "closure_meta_deepcopy.py", timeout=300)
    assert_ran(proc, "closure_costs_what_a_plain_step_costs", "meta_flop_counting", "deepcopy_is_quiet")
