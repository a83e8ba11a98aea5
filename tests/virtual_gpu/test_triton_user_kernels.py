"""Triton kernels the program launches itself (issue 30): a `@triton.jit` function called as
`kernel[grid](...)` (Liger, Unsloth, TorchTitan's fused SwiGLU and grouped experts) failed in
Triton's CompiledKernel._init_handles (the virtual driver had no launcher: "'NoneType' object is
not callable"). Now Triton compiles it on the CPU and each launch is one kernel in the trace,
named after the jit function (op `triton_user::<name>`), moving its tensor arguments: those the
kernel stores to (found in its source: interpose/compile/user_kernels.py) written, the others
read, each once. A tensor it only reads keeps its values; one it writes reads as unknown.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from phantora.trace.check import load_chrome_trace
from tests.virtual_gpu.harness import BUILDS, assert_ran, run_traced

FP32, BF16 = 4, 2
N = 4096  # the script's add kernel: x, y, out fp32 [N]
M, K = 64, 128  # its copies: bf16 [M, K] -> fp32 [M, K]


def _user_kernels(path: Path) -> list[dict]:
    events = [e for e in load_chrome_trace(path)["traceEvents"] if e.get("ph") == "X" and e.get("cat") == "kernel"]
    return [e for e in sorted(events, key=lambda e: e["ts"]) if e["args"].get("op", "").startswith("triton_user::")]


@BUILDS
def test_user_triton_kernels_are_one_kernel_per_launch(tmp_path: Path, user_python: str) -> None:
    proc, trace = run_traced(tmp_path, user_python, "triton_user_kernels.py")
    assert_ran(proc, "add", "block_ptr", "tensor_descriptor", "custom_op")
    kernels = _user_kernels(trace)
    names = [k["name"] for k in kernels]
    block_ptr = ["block_copy_kernel"] if "block_copy_kernel" in names else []  # Triton < 3.9 only
    assert names == ["add_kernel", "add_kernel", *block_ptr, "desc_copy_kernel", "add_kernel"], names
    by_name = {}
    for k in kernels:
        by_name.setdefault(k["name"], []).append(k)
        assert k["args"]["op"] == f"triton_user::{k['name']}.default"
        assert k["args"]["flops"] == 0 and k["dur"] > 0
    add, add_twice, add_custom_op = by_name["add_kernel"]
    assert add["args"]["bytes"] == 3 * N * FP32  # x, y read, out written
    assert add_twice["args"]["bytes"] == 2 * N * FP32  # x passed twice is read once
    assert add_custom_op["args"]["bytes"] == 2 * 3 * FP32  # inside torch.library.custom_op
    copies = by_name["desc_copy_kernel"] + by_name.get("block_copy_kernel", [])
    for k in copies:  # through tl.make_tensor_descriptor / tl.make_block_ptr: src read, dst written
        assert k["args"]["bytes"] == M * K * (BF16 + FP32), k


def test_triton_compiles_are_charged_as_modelled_whatever_its_cache_holds(tmp_path: Path) -> None:
    """Triton compiles a kernel the program launches itself at its first launch with each
    specialization, with a Python front end that a warm on-disk cache skips. Each compile is one
    `triton compile` host slice of the modelled kernel compile (cost/host.py, 0.25 s), and the
    compiler's own Python does not count: a cold and a warm Triton cache simulate the same times
    under the counted host (before: 378.7 vs 364.9 ms, the front end's Python counted, no compile
    cost). The script compiles add_kernel three ways (BLOCK 1024 with 4 and 8 warps, BLOCK 512),
    the descriptor copy, and on Triton < 3.9 the block-pointer copy. On the CPU build only."""
    env = dict(os.environ, TRITON_CACHE_DIR=str(tmp_path / "triton-cache"))
    ends = []
    for name in ("cold.json", "warm.json"):
        proc, trace = run_traced(tmp_path, sys.executable, "triton_user_kernels.py", name=name, env=env,
                                 options=("--host-time", "counted"))
        assert_ran(proc, "add", "tensor_descriptor", "custom_op")
        events = [e for e in load_chrome_trace(trace)["traceEvents"] if e.get("ph") == "X"]
        block_ptr = 1 if any(e["name"] == "block_copy_kernel" for e in events) else 0
        compiles = [e for e in events if e["name"] == "triton compile"]
        assert len(compiles) == 4 + block_ptr, [e["ts"] for e in compiles]
        assert all(e["dur"] == pytest.approx(250_000) for e in compiles)  # us
        ends.append(max(e["ts"] + e["dur"] for e in events))
    assert any((tmp_path / "triton-cache").iterdir())  # the warm run had a cache to read
    assert ends[1] == ends[0]
