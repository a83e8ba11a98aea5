"""A script's tensors compare equal to torch.Tensor as a class, as on a GPU (interpose/device/fake.py,
docs/virtual-gpu.md): frameworks pick their paths with `type(t) == torch.Tensor` or `type(t) in
(torch.Tensor, ...)` (Transformer Engine's fused attention), while identity and lookups keyed by
class (torch.compile's type dispatch) still see a FakeTensor."""

from __future__ import annotations

from pathlib import Path

from tests.virtual_gpu.harness import BUILDS, assert_ran, run_traced


@BUILDS
def test_tensor_class_compares_as_torch_tensor(tmp_path: Path, user_python: str) -> None:
    proc, _ = run_traced(tmp_path, user_python, "tensor_class.py")
    assert_ran(proc, "compares_as_tensor", "lookups_by_class", "parameters_and_copies",
               "inner_dispatch_called_directly", "compiled")
