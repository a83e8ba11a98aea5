"""Issue 14, cause 2: the virtual GPUs' CUDA random number generators.

Before the fix torch.cuda.default_generators was empty, torch.Generator(device="cuda") raised
"Cannot get CUDA generator without ATen_cuda library" (on both builds: the shim's CUDA hooks win)
and torch.cuda.get_rng_state() returned 16 zero bytes whatever was set.
"""

from __future__ import annotations

import pytest

from tests.virtual_gpu.harness import BUILDS, assert_ran, run_traced


@BUILDS
def test_cuda_generators_keep_seed_and_offset_like_a_gpu(tmp_path, user_python):
    proc, _ = run_traced(tmp_path, user_python, "cuda_rng_state.py")
    assert_ran(proc, "default_generators", "new_generator", "seeds", "state_round_trip", "offsets_advance",
               "fork_rng", "graphsafe_state", "megatron_rng_tracker", "checkpoint_replays_rng")


@BUILDS
def test_dtensor_offset_based_rng_tracker(tmp_path, user_python):
    # DTensor's tracker copies the RNG state to cuda with the dispatch modes off
    # (OffsetBasedRNGTracker._get_device_state): that reaches the CUDA dispatch key.
    proc, _ = run_traced(tmp_path, user_python, "cuda_rng_dtensor.py", options=("--nproc-per-node", "2"))
    assert_ran(proc, "dtensor_random_factories", "dtensor_manual_seed", "dtensor_random_op_offsets")
