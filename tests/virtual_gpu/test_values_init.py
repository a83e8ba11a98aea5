"""Weight initialisation on virtual GPUs: rejection samplers end, meta-device model builds run
(TorchTitan's llama3 init path, issue 15)."""

from __future__ import annotations

from typing import Any

from tests.virtual_gpu.harness import BUILDS, assert_ran, run_traced


@BUILDS
def test_initialisers_end_and_meta_builds_run(tmp_path: Any, user_python: str) -> None:
    proc, _ = run_traced(tmp_path, user_python, "values_init.py", timeout=300)
    assert_ran(proc, "trunc_normal_ends", "meta_build")
