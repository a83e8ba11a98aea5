"""Ops FakeTensorMode's dispatch cache answers are reported by the signature remembered for the
cache entry (interpose/ops/observer.py _report): tests/virtual_gpu/test_dispatch_cache_key.py runs
this twice, remembering and not, and compares the traces."""
import sys

import torch

from interpose import runtime

rt = runtime.get()
if "--no-reuse" in sys.argv:
    class _Forgets(dict):
        # nothing is remembered, so every op is keyed afresh; dict.get stores nothing and, being C,
        # adds no Python of this program's own to its counted host time
        __setitem__ = dict.get

    rt.sig_by_cache_entry = _Forgets()

x = torch.randn(64, 32, device="cuda")
w = torch.randn(32, 16, device="cuda", requires_grad=True)
pinned = torch.randn(64, 32).pin_memory()
plain = torch.randn(64, 32)
for step in range(3):
    y = (x @ w).relu()
    y.sum().backward()
    x.add_(0.5 * step)  # a float scalar that changes: one signature, several cache keys
    x.narrow(0, 8, 16).mul_(2)
    z = torch.cat([x, x.t().contiguous().t()], dim=0)
    idx = torch.nonzero(z[:, 0] > 0)  # reads a count back: its own path
    a = x.to(torch.bfloat16) * 3
    b = torch.randn(64, 32, device="cuda:1").sum(dim=1)
    c = pinned.to("cuda", non_blocking=True)  # a pinned copy and a pageable one: two signatures
    d = plain.to("cuda", non_blocking=True)
    e = c.view(-1)[:100].float().mean()
    m = torch.randn(32, 16, device="cuda")
    u = torch.ops.aten._unsafe_view(m, [4, 8, 16])  # answered by view's cache entry: still reported as itself
    v = m.view([4, 8, 16])
    torch.cuda.synchronize()
if "--no-reuse" not in sys.argv:
    assert len(rt.sig_by_cache_entry) > 10, len(rt.sig_by_cache_entry)
print("ok ran")
