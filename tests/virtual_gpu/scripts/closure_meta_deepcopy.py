"""Three paths Lightning's Trainer takes that plain loops do not (issue 15, Lightning):

- `optimizer.step(closure)`: Lightning's precision plugins run forward and backward inside the
  closure, i.e. inside Optimizer.step. Those ops are model code and must cost the host what they
  cost outside the step (they were charged as the optimizer's own ops, with no Python overhead:
  a Lightning step came out 2.7x too fast on a launch-bound model).
- FLOP counting on a meta copy of the model (Lightning's measure_flops for ThroughputMonitor):
  meta tensors hold no data, so nothing may read their values (it raised "Tensor.item() cannot be
  called on meta tensors") and their ops touch no memory (they were charged as CPU ops streaming
  their full size: 3 ms per init op).
- deepcopy of a tensor on the virtual GPU (ModelCheckpoint deep-copies the logged metrics) must
  not print a FakeTensor warning a GPU run never prints.
"""

import copy
import time
import warnings

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

torch.manual_seed(0)
model = nn.Sequential(*(nn.Sequential(nn.Linear(256, 256), nn.GELU()) for _ in range(8))).cuda()
opt = torch.optim.AdamW(model.parameters(), foreach=True)
x = torch.randn(64, 256, device="cuda")


def closure() -> torch.Tensor:
    opt.zero_grad()
    loss = model(x).square().mean()
    loss.backward()
    return loss


def timed(step) -> float:
    for _ in range(2):  # warm-up: optimizer state
        step()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(5):
        step()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / 5


def plain() -> None:
    closure()
    opt.step()


plain_s = timed(plain)
closure_s = timed(lambda: opt.step(closure))
print(f"plain loop {plain_s * 1e3:.4f} ms, optimizer.step(closure) {closure_s * 1e3:.4f} ms per step")
# both run the same ops with the same Python around them; only where the call sits differs
assert abs(closure_s - plain_s) <= 0.02 * plain_s, (plain_s, closure_s)
print("ok closure_costs_what_a_plain_step_costs")

t0 = time.perf_counter()
with torch.device("meta"):
    meta = nn.Sequential(nn.Embedding(32768, 1024), nn.Linear(1024, 1024), nn.Linear(1024, 32768))
    idx = torch.randint(0, 32768, (8, 512))
    with FlopCounterMode(display=False) as counter:
        meta(idx).sum().backward()
    # small meta tensors (attention's scale, RMSNorm's eps) hold no values to compute with
    q = torch.randn(2, 4, 16, 8, requires_grad=True)
    torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True).sum().backward()
    nn.RMSNorm(8)(torch.ones(4, 8) * 2).sum().backward()
meta_s = time.perf_counter() - t0
tokens = 8 * 512
# forward 2 * tokens * params of the two Linears; backward twice that (input and weight
# gradients; the embedding's output requires grad, and its own backward is not a matmul)
fwd = 2 * tokens * (1024 * 1024 + 1024 * 32768)
bwd = 2 * fwd
assert counter.get_total_flops() == fwd + bwd, (counter.get_total_flops(), fwd + bwd)
# init ops on 134 MB of meta weights streamed no memory (at 5 GB/s they cost 27 ms each);
# what remains is dispatch and module-call overhead of some 30 ops
assert meta_s < 2e-3, meta_s
print("ok meta_flop_counting")

loss = model(x).sum()
with warnings.catch_warnings(record=True) as caught:
    metrics = copy.deepcopy({"loss": loss.detach()})
assert metrics["loss"].device.type == "cuda" and metrics["loss"] is not loss
assert not [w for w in caught if "FakeTensor" in str(w.message)], [str(w.message) for w in caught]
print("ok deepcopy_is_quiet")
