"""Issue 14, cause 1: no op on a virtual CUDA tensor reaches "no kernel" (CPU build) or a real CUDA
kernel (CUDA build, no driver), whichever way it reaches the CUDA dispatch key; and such ops are
reported to the simulator like every other op."""

from __future__ import annotations

import collections
import json
from pathlib import Path

from tests.virtual_gpu.harness import BUILDS, assert_ran, run_traced


def _cpu_op_counts(trace: Path) -> collections.Counter:
    events = json.loads(trace.read_text())["traceEvents"]
    return collections.Counter(e["name"] for e in events if e.get("ph") == "X" and e.get("cat") == "cpu_op")


@BUILDS
def test_ops_outside_the_dispatch_modes(tmp_path: Path, user_python: str) -> None:
    proc, trace = run_traced(tmp_path, user_python, "cuda_key_paths.py")
    assert_ran(proc, "disabled_modes_to_cuda", "no_dispatch_record_stream", "tensor_from_cuda_scalars")
    ops = _cpu_op_counts(trace)
    # Made under _disable_current_modes(): the GPU copy of the RNG state, torch.empty and
    # torch.ones (a composite: its allocation is the op that reaches the CUDA key).
    assert ops["aten::empty_strided"] >= 1, ops
    assert ops["aten::empty"] == 2, ops
    # Computed under no_dispatch(): x * 2 (the script's only multiplication of a float tensor by 2
    # happens there; n * 2 is the other aten::mul).
    assert ops["aten::mul"] == 2, ops
    # Each element torch.tensor reads in C++ is a device-to-host read, like .item(): 2 + 3 + 2 + 2
    # of them, plus the script's two explicit .item() calls.
    assert ops["aten::_local_scalar_dense"] == 11, ops


@BUILDS
def test_ddp_find_unused_parameters_on_two_ranks(tmp_path: Path, user_python: str) -> None:
    """Issue 14, cause 9: DDP's reducer asserts is_pinned() on host memory it allocates pinned in C++."""
    proc, _ = run_traced(tmp_path, user_python, "cuda_key_ddp_unused.py", options=("--nproc-per-node", "2"))
    assert_ran(proc, *(f"rank{r}_{check}" for r in (0, 1)
                       for check in ("ddp_find_unused_parameters", "pinned_host_memory")))
