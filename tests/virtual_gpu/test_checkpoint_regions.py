"""Activation checkpointing regions are charged their host time without phantora replacing
torch.utils.checkpoint.checkpoint (issue 30).

Until issue 30 phantora wrapped torch.utils.checkpoint.checkpoint to count regions. Dynamo turns
that function into its checkpoint operator only when the object it meets *is* the function, and
torch.distributed's checkpoint_wrapper (TorchTitan's activation checkpointing) holds the original,
imported before phantora's hook: compiling a checkpoint_wrapper'd block failed with "the function
`checkpoint` in torch/_compile.py should not be traced" (TorchTitan's 1d_compile, 1d_compile_sac_op,
2d_compile, 3d_compile), and its eager regions were never counted. Regions are now recognised from
the state torch keeps while one runs (interpose/host/python_events.py CheckpointRegions).
"""

from __future__ import annotations

import sys
from pathlib import Path

from phantora.cost.host import DEFAULT_HOST, PYTHON_OVERHEAD, lookup_host
from phantora.trace.check import load_chrome_trace
from tests.virtual_gpu.harness import assert_ran, run_traced


def _checkpoint_slices(trace: Path) -> list[dict]:
    return [e for e in load_chrome_trace(trace)["traceEvents"] if e.get("ph") == "X" and e["name"] == "python: checkpoint"]


def test_every_region_charged_in_forward_and_recomputation(tmp_path: Path) -> None:
    """3 regions with use_reentrant=False, 2 with use_reentrant=True and 4 checkpoint_wrapper'd
    blocks, one forward and backward: each region's Python is charged when it runs and again when
    backward recomputes it, 18 slices of the modelled region cost."""
    proc, trace = run_traced(tmp_path, sys.executable, "checkpoint_regions.py", "eager",
                             options=("--host-time", "modelled"))
    assert_ran(proc, "eager")
    slices = _checkpoint_slices(trace)
    assert len(slices) == 2 * (3 + 2 + 4), len(slices)
    expected_us = PYTHON_OVERHEAD.checkpoint_region_ns * lookup_host(DEFAULT_HOST).speed / 1e3
    assert {e["dur"] for e in slices} == {expected_us}


def test_compiled_checkpoint_wrapper_blocks(tmp_path: Path) -> None:
    """torch.compile(fullgraph=True) over checkpoint_wrapper'd blocks traces into Dynamo's checkpoint
    operator; the compiled code has no Python region to charge. On the CPU build only (the failure
    reproduced on both builds; the CUDA build's compile path runs in test_torchtitan_integration's
    1d_compile)."""
    proc, trace = run_traced(tmp_path, sys.executable, "checkpoint_regions.py", "compile",
                             options=("--host-time", "modelled"))
    assert_ran(proc, "compile")
    assert _checkpoint_slices(trace) == []
