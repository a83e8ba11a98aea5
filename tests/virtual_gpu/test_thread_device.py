"""A tensor's device, read in one thread while another thread's op runs its fake kernel, is the
tensor's own device, never "meta" (nn.DataParallel's replica threads under HF Trainer on a
multi-GPU node failed at random with FakeTensorDeviceMismatchError: cuda:0 and meta)."""

from __future__ import annotations

from typing import Any

from tests.virtual_gpu.harness import BUILDS, assert_ran, run_traced


@BUILDS
def test_device_reads_across_threads(tmp_path: Any, user_python: str) -> None:
    proc, _ = run_traced(tmp_path, user_python, "thread_device_reads.py")
    assert_ran(proc, "device_read_during_other_threads_kernel", "data_parallel_device_reads")
