"""Control-flow and wrapper higher-order ops run eagerly on a virtual GPU; the ops of their bodies
are what the GPU runs. Each check uses tensors of a shape of its own, so the test can find its
kernels in the trace:
  cond, virtual predicate          x [3, 5]    x.sum() < 0 reads False (x's value is 1): one sin
  cond, isfinite(...).all()        x [3, 6]    true branch (isfinite reads True): cos, mul
  cond with autograd               x [3, 7]    false branch forward (sin) and its backward
  while_loop, counter 0 -> 3       y [7, 11]   three mul
  wrap / tag_activation_checkpoint x [4, 9]    one tanh each, and the checkpoint's recompute
  invoke_subgraph (called directly)  x [5, 13]   one exp
  map over 3 slices                x [3, 4, 8] three relu of [4, 8]
"""

import torch
from torch._higher_order_ops.wrap import tag_activation_checkpoint, wrap

# Branches without side effects: torch.cond compiles them with Dynamo (fullgraph), which refuses
# a branch that mutates outer state (on a GPU too). Which branch ran is read from the trace.
def true_fn(x):
    return x.cos() * 2


def false_fn(x):
    return x.sin()


x = torch.randn(3, 5, device="cuda")
out = torch.cond(x.sum() < 0, true_fn, false_fn, (x,))
assert out.shape == (3, 5) and out.device.type == "cuda"
print("ok cond_virtual_predicate")

x = torch.randn(3, 6, device="cuda")
out = torch.cond(torch.isfinite(x).all(), true_fn, false_fn, (x,))
assert out.shape == (3, 6)
print("ok cond_hinted_predicate")

x = torch.randn(3, 7, device="cuda", requires_grad=True)
out = torch.cond(x.detach().sum() < 0, true_fn, false_fn, (x,))
out.sum().backward()
assert x.grad is not None and x.grad.shape == (3, 7)
print("ok cond_backward")

from torch._higher_order_ops.while_loop import while_loop  # noqa: E402

i = torch.tensor(0, device="cuda")  # a small integer tensor: it keeps its real value
y = torch.randn(7, 11, device="cuda")
i_out, y_out = while_loop(lambda i, y: i < 3, lambda i, y: (i + 1, y * 2), (i, y))
assert i_out.item() == 3, i_out.item()
assert y_out.shape == (7, 11)
print("ok while_loop")

x = torch.randn(4, 9, device="cuda", requires_grad=True)
assert wrap(torch.tanh, x).shape == (4, 9)
print("ok wrap")


class Block(torch.nn.Module):
    def forward(self, x):
        return torch.tanh(x)


gm = torch.fx.symbolic_trace(Block())
out = tag_activation_checkpoint(gm, x, use_reentrant=False)
out.sum().backward()
assert x.grad.shape == (4, 9)
print("ok tag_activation_checkpoint")

from torch._higher_order_ops.invoke_subgraph import invoke_subgraph  # noqa: E402
from torch._higher_order_ops.map import map as map_hop  # noqa: E402

x = torch.randn(5, 13, device="cuda")
(out,) = invoke_subgraph(lambda t: (t.exp(),), "subgraph_0", x)
assert out.shape == (5, 13)
print("ok invoke_subgraph")

xs = torch.randn(3, 4, 8, device="cuda")
assert map_hop(torch.relu, xs).shape == (3, 4, 8)
print("ok map")
torch.cuda.synchronize()
