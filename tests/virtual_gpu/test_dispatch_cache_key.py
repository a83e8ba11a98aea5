"""FakeTensorMode's dispatch cache keys the program's plain tensors in phantora's cheaper form
(interpose/device/fake.py VirtualCudaFakeMode._prep_args_for_hash), and that form tells argument
lists apart exactly as stock FakeTensorMode's key does: shape, strides, storage offset and size,
dtype, device, requires_grad, inference, conjugate and negative views; scalars by type and value."""

from __future__ import annotations

import json
from pathlib import Path

from tests.virtual_gpu.harness import BUILDS, assert_ran, run_traced


@BUILDS
def test_dispatch_cache_key_distinguishes_what_stock_does(tmp_path: Path, user_python: str) -> None:
    proc, _ = run_traced(tmp_path, user_python, "dispatch_cache_key.py")
    assert_ran(proc, "made", "same_distinctions", "scalars", "stock_path", "cache_hits", "unsafe_view")


@BUILDS
def test_dispatch_cache_rebuilds_outputs_as_stock_does(tmp_path: Path, user_python: str) -> None:
    """A cache hit's outputs are built by phantora's short way (VirtualCudaFakeMode.
    _get_output_tensor_from_cache_entry) for plain, view and tuple outputs, and are what stock's
    build gives: class, Python attributes, metadata, dispatch keys, autograd state, shared storage."""
    proc, _ = run_traced(tmp_path, user_python, "dispatch_cache_output.py")
    assert_ran(proc, "same_outputs")


@BUILDS
def test_ops_answered_by_the_cache_keep_their_signatures(tmp_path: Path, user_python: str) -> None:
    """The observer reports an op the dispatch cache answered by the signature it remembered for
    that cache entry; with nothing remembered (every op keyed afresh) the trace's ops, shapes,
    dtypes, streams and times are the same, pinned and pageable copies told apart."""
    runs = []
    for name, extra in (("reuse.json", ()), ("fresh.json", ("--no-reuse",))):
        proc, out = run_traced(tmp_path, user_python, "signature_by_cache_entry.py", *extra, name=name)
        assert_ran(proc, "ran")
        events = json.loads(out.read_text())["traceEvents"]
        runs.append([e for e in events if e.get("ph") != "M"])
    assert runs[0] == runs[1]
    names = {e["name"] for e in runs[0]}
    copies = [e for e in runs[0] if e.get("args", {}).get("op") == "aten::_to_copy.default"]
    assert copies and len(names) > 10
