"""Every op whose output shape depends on data, on a virtual GPU (issue 25's table, plain PyTorch).

Each check prints `ok NAME` when what a real GPU computes on the data phantora models agrees:
data copied from the CPU is exact; router scores have no data and are routed by the routing model
(balanced: 4,096 tokens x top-2 over 8 experts is 1,024 choices per expert); a mask compared from
randn data selects the fraction the distribution implies (x > 0: half), one from activations the
default fraction (--mask-fraction, 0.5).
"""

import torch
import torch.nn.functional as F

dev = "cuda"
N, E, K = 4096, 8, 2


def check(name: str, cond: bool, detail: object = "") -> None:
    assert cond, f"{name}: {detail}"
    print(f"ok {name}", flush=True)


# --- data copied from the CPU: every op computes what the CPU computes ----------------------------
cpu = torch.tensor([3, 0, 1, 3, 0, 2, 5, 0, 1, 1], dtype=torch.int64)
g = cpu.to(dev)
check("nonzero_exact", torch.nonzero(g).cpu().equal(torch.nonzero(cpu)))
check("nonzero_stride", torch.nonzero(g).stride() == (1, 7), torch.nonzero(g).stride())
check("argwhere_exact", torch.argwhere(g > 1).tolist() == torch.argwhere(cpu > 1).tolist())
check("where_cond_exact", torch.where(g == 0)[0].tolist() == torch.where(cpu == 0)[0].tolist())
check("mask_index_exact", g[g > 0].tolist() == cpu[cpu > 0].tolist())
check("masked_select_exact", torch.masked_select(g, g.bool()).tolist() == torch.masked_select(cpu, cpu.bool()).tolist())
u, inv, cnt = torch.unique(g, return_inverse=True, return_counts=True)
cu, cinv, ccnt = torch.unique(cpu, return_inverse=True, return_counts=True)
check("unique_exact", (u.tolist(), inv.tolist(), cnt.tolist()) == (cu.tolist(), cinv.tolist(), ccnt.tolist()))
check("unique_consecutive_exact", torch.unique_consecutive(g).tolist() == torch.unique_consecutive(cpu).tolist())
check("bincount_exact", torch.bincount(g).tolist() == torch.bincount(cpu).tolist())
check("repeat_interleave_exact",
      torch.repeat_interleave(torch.arange(10, device=dev), g).tolist() == torch.repeat_interleave(torch.arange(10), cpu).tolist())
check("nonzero_static_exact", torch.nonzero_static(g, size=4).tolist() == torch.nonzero_static(cpu, size=4).tolist())
x = torch.zeros(10, device=dev)
x[g > 1] = 7.0  # index_put_ with a mask
check("index_put_mask", x.tolist() == [7.0 if v > 1 else 0.0 for v in cpu.tolist()], x.tolist())
y = torch.zeros(10, device=dev, dtype=torch.int64).masked_scatter(g > 1, torch.arange(10, device=dev))
check("masked_scatter_exact", y.tolist() == torch.zeros(10, dtype=torch.int64).masked_scatter(cpu > 1, torch.arange(10)).tolist())
torch._assert_async(g.sum() > 0)
check("assert_async", True)

# --- router scores without data: the routing model decides, every path agrees -----------------------
x = torch.randn(N, 16, device=dev)
scores = torch.randn(N, E, device=dev).softmax(-1)
w, ids = torch.topk(scores, K, dim=-1)
check("topk_distinct_per_token", all(len(set(r)) == K for r in ids.tolist()))
by_histc = torch.histc(ids.float(), bins=E, min=0, max=E - 1).tolist()
by_bincount = torch.bincount(ids.view(-1), minlength=E).tolist()
by_one_hot = F.one_hot(ids, E).sum((0, 1)).tolist()
mask = F.one_hot(ids, num_classes=E).permute(2, 1, 0)
by_where = [torch.where(mask[e])[1].shape[0] for e in range(E)]
by_nonzero = [int(torch.nonzero(ids.view(-1) == e).shape[0]) for e in range(E)]
sorted_ids, order = torch.sort(ids.view(-1), stable=True)
by_split = [len(p) for p in order.split(by_bincount)]
by_searchsorted = torch.diff(torch.searchsorted(sorted_ids, torch.arange(E + 1, device=dev))).tolist()
by_unique = torch.unique(ids, return_counts=True)[1].tolist()
paths = {"histc": [int(v) for v in by_histc], "bincount": by_bincount, "one_hot.sum": by_one_hot, "where": by_where,
         "nonzero": by_nonzero, "sort+split": by_split, "searchsorted": by_searchsorted, "unique": by_unique}
check("counts_agree_on_every_path", all(v == by_bincount for v in paths.values()), paths)
check("counts_sum_to_n_times_k", sum(by_bincount) == N * K and by_bincount == [N * K // E] * E, by_bincount)
check("sorted_tokens_all_routed", torch.sort(order // K).values.tolist() == sorted([t for t in range(N) for _ in range(K)]))
counts_item = [int(torch.bincount(ids.view(-1), minlength=E)[e].item()) for e in range(E)]
check("item_of_counts", counts_item == by_bincount)
rep = torch.repeat_interleave(torch.arange(E, device=dev), torch.bincount(ids.view(-1), minlength=E))
check("repeat_interleave_counts", rep.shape == (N * K,) and rep.tolist() == sorted_ids.tolist())
amax = torch.argmax(scores, dim=-1)
check("argmax_balanced", torch.bincount(amax, minlength=E).tolist() == [N // E] * E)

# --- masks over data phantora does not hold (docs/moe.md): x is randn, so x > 0 selects about half;
# every way of counting one mask agrees; activations select the default fraction (0.5) --------------
m = x[:, 0] > 0
sel = x[m]
rows = sel.shape[0]
check("randn_mask_selects_half", sel.shape[1:] == (16,) and abs(rows / N - 0.5) < 0.05, rows)
counts = {"x[m]": rows, "sum": int(m.sum()), "count_nonzero": int(torch.count_nonzero(m)),
          "nonzero": torch.nonzero(m).shape[0], "where": torch.where(m)[0].shape[0],
          "masked_select": torch.masked_select(x[:, 0], m).shape[0], "tolist": sum(m.tolist()),
          "argwhere": torch.argwhere(m).shape[0], "complement": N - int((~m).sum())}
check("mask_counts_agree", len(set(counts.values())) == 1, counts)
check("masked_select_of_randn", abs(torch.masked_select(x, x > 0).shape[0] / (N * 16) - 0.5) < 0.02)
r = torch.rand(N, device=dev)
check("rand_below_p", abs(int((r < 0.3).sum()) / N - 0.3) < 0.05, int((r < 0.3).sum()))
h = torch.nn.Linear(16, 16, device=dev)(x)  # activations: nothing known about them
check("activations_select_default", abs(h[h[:, 0] > 0].shape[0] / N - 0.5) < 0.05, h[h[:, 0] > 0].shape[0])
check("unique_of_placeholder", tuple(torch.unique(x.long()).shape) == (1,))
check("bincount_of_placeholder", torch.bincount(x[:, 0].long().clamp(min=0)).tolist() == [0, N])
check("mask_false_selects_none", tuple(x[torch.isnan(x[:, 0])].shape) == (0, 16))
check("sort_of_placeholder_is_identity", torch.sort(x[:, 0], stable=True).indices.tolist() == list(range(N)))
