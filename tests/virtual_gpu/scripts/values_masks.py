"""Masks over data phantora does not hold, on a virtual GPU, run with `--mask-fraction 0.25`
(tests/virtual_gpu/test_values_masks.py). Prints `ok NAME` for each check that holds."""

import torch
import torch.nn.functional as F

dev = "cuda"
N = 4096


def check(name: str, cond: bool, detail: object = "") -> None:
    assert cond, f"{name}: {detail}"
    print(f"ok {name}", flush=True)


torch.manual_seed(0)
x = torch.randn(N, 16, device=dev)
h = torch.nn.Linear(16, 16, device=dev)(x)  # activations: the default fraction
rows = h[h[:, 0] > 0].shape[0]
check("option_reached_the_rank", abs(rows / N - 0.25) < 0.05, rows)
above = torch.nonzero(x[:, 0] > 0).shape[0]
check("draws_keep_their_distribution", abs(above / N - 0.5) < 0.05, above)

m = x[:, 3] > 1.0
counts = {"x[m]": x[m].shape[0], "sum": int(m.sum().item()), "nonzero": torch.nonzero(m).shape[0],
          "where": torch.where(m)[0].shape[0], "masked_select": torch.masked_select(x[:, 3], m).shape[0],
          "cpu": int(m.cpu().sum()), "tolist": sum(m.tolist()), "float_sum": int(m.float().sum().item())}
check("counts_agree", len(set(counts.values())) == 1 and abs(counts["sum"] / N - 0.1587) < 0.03, counts)

torch.cuda.manual_seed(7)
first = torch.rand(N, device=dev) < 0.5
torch.cuda.manual_seed(7)  # replayed as activation checkpointing replays: the same state, the same draw
again = torch.rand(N, device=dev) < 0.5
check("same_generator_state_same_mask", first.tolist() == again.tolist() and torch.equal(first.cpu(), again.cpu()))
later = torch.rand(N, device=dev) < 0.5
torch.cuda.manual_seed(12345)  # an unseeded run's seed is random (torch.seed() at import): masks do not follow it
other_seed = torch.rand(N, device=dev) < 0.5
check("masks_do_not_follow_the_seed", other_seed.tolist() == first.tolist())
check("next_draw_another_mask", first.tolist() != later.tolist() and not torch.equal(first.cpu(), later.cpu()))

out, keep = torch.ops.aten.native_dropout(torch.ones(N, device=dev), 0.2, True)
kept = int(keep.sum())
check("dropout_mask", abs(kept / N - 0.8) < 0.05 and int((out > 0).sum()) == kept, (kept, int((out > 0).sum())))

# activation checkpointing replays the draw (the generator state is restored): the recomputed
# mask selects the same rows, so the recomputed shapes match (torch checks their metadata)
from torch.utils.checkpoint import checkpoint  # noqa: E402

lin = torch.nn.Linear(16, 16, device=dev)


def block(inp: torch.Tensor) -> torch.Tensor:
    h = F.dropout(lin(inp), 0.1, training=True)
    keep = torch.rand(inp.shape[0], device=dev) < 0.7
    sel = h[keep]
    return sel[sel[:, 0] > 0].sum()


xg = torch.randn(N, 16, device=dev, requires_grad=True)
checkpoint(block, xg, use_reentrant=False).backward()
check("checkpoint_replays_masks", xg.grad is not None)
