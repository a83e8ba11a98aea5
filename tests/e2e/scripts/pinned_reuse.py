"""Pinned host buffers are freed and their addresses reused by pageable tensors: only the
tensors pin_memory() returned may report is_pinned()."""
import torch

torch.cuda.set_device(0)
wrongly_pinned = 0
for _ in range(300):
    p = torch.randn(1024).pin_memory()
    assert p.is_pinned()
    view = p[1:]
    del p
    assert view.is_pinned()  # a view keeps the page-locked storage alive
    del view
    q = torch.randn(1024)
    wrongly_pinned += q.is_pinned()
print(f"PINNED_REUSE wrongly pinned {wrongly_pinned}")
