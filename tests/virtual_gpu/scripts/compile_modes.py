"""torch.compile features beyond one full graph (tests/virtual_gpu/test_compile.py): graph breaks
with fullgraph=False, dynamic=False, a compiled optimizer step, activation checkpointing inside a
compiled region, compiled flex_attention forward and backward with causal, sliding-window and
document masks, mode="reduce-overhead" (CUDA graphs), and a custom backend callable refused with
one line."""

import torch
import torch.nn as nn
from torch.nn.attention.flex_attention import create_block_mask, flex_attention
from torch.utils.checkpoint import checkpoint

# --- graph break: print() between two halves ---------------------------------------------------
def with_break(x: torch.Tensor) -> torch.Tensor:
    y = torch.sin(x) * 2
    print("graph break here")
    return torch.cos(y) + 1


x = torch.randn(256, 256, device="cuda")
out = torch.compile(with_break, dynamic=False)(x)
assert out.shape == (256, 256)
print("ok graph_break")

# --- activation checkpointing inside the compiled region -----------------------------------------
lin1, lin2 = nn.Linear(256, 256).cuda(), nn.Linear(256, 256).cuda()


def ckpt_body(t: torch.Tensor) -> torch.Tensor:
    return lin2(torch.relu(lin1(t)))


def ckpt_model(t: torch.Tensor) -> torch.Tensor:
    return checkpoint(ckpt_body, t, use_reentrant=False).sum()


inp = torch.randn(64, 256, device="cuda", requires_grad=True)
torch.compile(ckpt_model, fullgraph=True)(inp).backward()
assert lin1.weight.grad is not None
print("ok checkpoint")

# --- compiled optimizer step ---------------------------------------------------------------------
model = nn.Linear(256, 256).cuda()
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
model(torch.randn(32, 256, device="cuda")).sum().backward()


@torch.compile(fullgraph=False)
def opt_step() -> None:
    opt.step()


opt_step()
opt_step()
assert opt.state[model.weight]["exp_avg"].shape == (256, 256)
print("ok optimizer")

# --- flex attention, compiled, forward and backward ----------------------------------------------
B, H, S, D = 2, 4, 512, 64
doc = torch.zeros(S, dtype=torch.long, device="cuda")
doc[S // 2:] = 1


def causal(b, h, q, kv):
    return q >= kv


def sliding(b, h, q, kv):
    return (q >= kv) & (q - kv < 128)


def document(b, h, q, kv):
    return doc[q] == doc[kv]


flex = torch.compile(flex_attention, fullgraph=True)
for name, mod in (("causal", causal), ("sliding", sliding), ("document", document)):
    mask = create_block_mask(mod, B=None, H=None, Q_LEN=S, KV_LEN=S, device="cuda")
    q, k, v = (torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    torch.cuda.nvtx.range_push(f"flex {name}")
    o = flex(q, k, v, block_mask=mask)
    o.sum().backward()
    torch.cuda.nvtx.range_pop()
    assert o.shape == (B, H, S, D) and q.grad.shape == q.shape
    print(f"ok flex_{name}")

# --- mode="reduce-overhead": the compiled graph captured once into a CUDA graph, then replayed --
def pointwise(t: torch.Tensor) -> torch.Tensor:
    return torch.tanh(t) * 3 + t


fast = torch.compile(pointwise, mode="reduce-overhead")
xs = torch.randn(512, 512, device="cuda")
for _ in range(4):
    ys = fast(xs)
torch.cuda.synchronize()
assert ys.shape == (512, 512)
print("ok reduce_overhead")

# --- a backend phantora cannot see inside ------------------------------------------------------
def my_backend(gm, example_inputs):
    return gm.forward


try:
    torch.compile(with_break, backend=my_backend)
except RuntimeError as e:
    assert "phantora" in str(e) and "my_backend" in str(e), e
    print("ok custom_backend_refused")

# --- the current stream in compiled code: Dynamo traces torch.cuda.current_stream() into the
# graph (its handler for torch's function), as on a GPU; no graph break, no warning about code
# of phantora's it tried to trace
import warnings  # noqa: E402

from torch._dynamo.utils import counters  # noqa: E402


def on_current_stream(t: torch.Tensor) -> torch.Tensor:
    s = torch.cuda.current_stream()
    return t * 2 + s.device.index


before = sum(counters["graph_break"].values())
with warnings.catch_warnings(record=True) as seen:
    warnings.simplefilter("always")
    out = torch.compile(on_current_stream, backend="eager")(torch.randn(8, device="cuda"))
assert out.shape == (8,) and sum(counters["graph_break"].values()) == before, dict(counters["graph_break"])
assert not [w for w in seen if "Dynamo" in str(w.message)], [str(w.message)[:200] for w in seen]
print("ok current_stream")
