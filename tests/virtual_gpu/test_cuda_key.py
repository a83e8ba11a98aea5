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
    assert_ran(proc, "disabled_modes_to_cuda", "disabled_modes_value_reads", "no_dispatch_record_stream",
               "tensor_from_cuda_scalars")
    ops = _cpu_op_counts(trace)
    # Host-to-device copies: the RNG state and torch.tensor(5, device="cuda") with the modes off,
    # torch.tensor(3 / [x.sum(), x.sum()], device="cuda") with them on.
    assert ops["aten::_to_copy"] == 4, ops
    # Allocated with the modes off: torch.empty and torch.ones (a composite: its allocation is the
    # op that reaches the CUDA key).
    assert ops["aten::empty"] == 2, ops
    # Computed under no_dispatch(): x * 2 (n * 2 is the script's other aten::mul).
    assert ops["aten::mul"] == 2, ops
    # Device-to-host reads, like .item(): with the modes off 1 + 16 + 1; each element torch.tensor
    # reads in C++, 2 + 3 + 2 + 2; the script's own .item() calls, 2 + 1.
    assert ops["aten::_local_scalar_dense"] == 30, ops


@BUILDS
def test_two_ranks_ddp_unused_parameters_and_dtensor_rng(tmp_path: Path, user_python: str) -> None:
    """Cause 9: DDP's reducer asserts is_pinned() on host memory it allocates pinned in C++.
    Cause 1: DTensor's RNG tracker makes CUDA tensors while the dispatch modes are stashed."""
    proc, _ = run_traced(tmp_path, user_python, "cuda_key_two_ranks.py", options=("--nproc-per-node", "2"))
    assert_ran(proc, *(f"rank{r}_{check}" for r in (0, 1)
                       for check in ("ddp_find_unused_parameters", "pinned_host_memory", "dtensor_random_init")))
