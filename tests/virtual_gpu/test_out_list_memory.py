"""An op's `out=` list is keyed by its tensors' signatures, not by the tensors (interpose/ops/
observer.py _signature_key). Before, the key held the tensors themselves and phantora's table of
signatures kept them for the whole run: every call leaked its outputs (32 MiB per call here) and
added a signature. FSDP2 copies every all-gather out that way, into temporaries for parameters
sharded on dim 1 (TorchTitan shards experts so when EP x FSDP exceeds the expert count):
DeepSeek-V3 16B on 128 GPUs (EP 8) peaked at 17.35 GiB instead of 3.98."""

from __future__ import annotations

from pathlib import Path

from tests.virtual_gpu.harness import BUILDS, assert_ran, run_traced


@BUILDS
def test_out_list_tensors_are_freed_when_dropped(tmp_path: Path, user_python: str) -> None:
    proc, _ = run_traced(tmp_path, user_python, "out_list_memory.py")
    assert_ran(proc, "aten", "fsdp")
