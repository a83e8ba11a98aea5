"""Issue 19, point 9: the simulated NCCL process group refuses the arguments ProcessGroupNCCL
refuses, with torch's exception types and messages, before anything is issued; a refused call
is not simulated (before the fix, all_gather_into_tensor with an output 8x too large was accepted
and timed as an 8x larger transfer)."""

from __future__ import annotations

from phantora.trace.check import check_chrome_trace, load_chrome_trace

from .harness import BUILDS, assert_ran, run_traced

REFUSED = [
    "all_gather_into_tensor_output_8x", "all_gather_into_tensor_dtype", "all_gather_into_tensor_non_contiguous",
    "reduce_scatter_tensor_size", "reduce_scatter_tensor_dtype", "all_reduce_cpu_tensor", "all_reduce_non_contiguous",
    "all_reduce_two_tensors", "all_reduce_coalesced_not_dense", "broadcast_non_contiguous", "reduce_cpu_tensor",
    "all_gather_own_slot_size", "reduce_scatter_own_slot_size", "all_to_all_single_split_sum",
    "all_to_all_single_split_count", "all_to_all_single_dim0", "all_to_all_devices", "send_cpu_tensor",
    "gather_list_size", "scatter_sizes",
]


@BUILDS
def test_collectives_check_their_arguments_as_processgroupnccl_does(tmp_path, user_python):
    proc, out = run_traced(tmp_path, user_python, "collective_checks_args.py", options=("--nproc-per-node", "2"))
    assert_ran(proc, *REFUSED, "good_calls")
    assert check_chrome_trace(out).ok
    # Only the good calls reached the simulator, each with the bytes NCCL moves.
    kernels = [(e["args"]["op"], e["args"]["bytes"]) for e in load_chrome_trace(out)["traceEvents"]
               if e.get("ph") == "X" and e["name"].startswith("ncclDevKernel") and e["pid"] == 1]
    assert kernels == [("all_gather", 32), ("reduce_scatter", 32), ("all_reduce", 16), ("all_reduce", 48),
                       ("all_gather", 32), ("all_to_all", 12), ("send", 64), ("reduce", 32)]
