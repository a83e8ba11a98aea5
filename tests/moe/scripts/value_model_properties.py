"""Property test, run on a virtual GPU: for any router shape (tokens, experts, top-k, the expert
dimension's position), the per-expert counts a program can derive from a top-k over scores without
data agree on every path (histc, bincount, one_hot sums, per-expert torch.where, sort + split,
boolean masks), add up to tokens x k, and give each token k distinct experts. Under balanced
routing (the default) counts differ by at most one. argv[1]: the routing model phantora runs with
(for the balance check)."""

import sys

import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

BALANCED = sys.argv[1] == "balanced"
SHAPES = st.integers(1, 40).flatmap(
    lambda e: st.tuples(st.integers(1, 700), st.just(e), st.integers(1, e), st.booleans()))


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(shape=SHAPES)
def counts_agree(shape: tuple[int, int, int, bool]) -> None:
    n, e, k, experts_first = shape
    scores = torch.randn(e, n, device="cuda") if experts_first else torch.randn(n, e, device="cuda")
    ids = torch.topk(scores, k, dim=0 if experts_first else 1).indices
    ids = ids.t() if experts_first else ids  # [n, k]
    assert tuple(ids.shape) == (n, k)
    rows = ids.tolist()
    assert all(len(set(r)) == k and all(0 <= x < e for x in r) for r in rows), "a token's experts repeat"
    flat = ids.reshape(-1)
    by_bincount = torch.bincount(flat, minlength=e).tolist()
    by_histc = [int(v) for v in torch.histc(flat.float(), bins=e, min=0, max=e - 1).tolist()] if e > 1 else [n * k]
    by_one_hot = F.one_hot(ids, e).sum((0, 1)).tolist()
    expert_mask = F.one_hot(ids, num_classes=e).permute(2, 1, 0)
    by_where = [int(torch.where(expert_mask[x])[1].shape[0]) for x in range(e)]
    by_mask = [int(flat[flat == x].numel()) for x in range(e)]
    order = torch.argsort(flat, stable=True)
    by_split = [int(p.numel()) for p in order.split(by_bincount)]
    ends = torch.cumsum(torch.bincount(flat, minlength=e), 0).tolist()
    assert ends[-1] == n * k
    python_counts = [sum(r.count(x) for r in rows) for x in range(e)]
    for name, counts in [("histc", by_histc), ("one_hot", by_one_hot), ("where", by_where), ("mask", by_mask),
                         ("sort+split", by_split), ("tolist", python_counts)]:
        assert counts == by_bincount, (name, counts, by_bincount, shape)
    assert sum(by_bincount) == n * k
    if BALANCED:
        assert max(by_bincount) - min(by_bincount) <= 1, by_bincount


counts_agree()
print("ok properties", flush=True)
