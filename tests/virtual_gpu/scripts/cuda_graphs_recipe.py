"""CUDA graphs as PyTorch's documentation uses them (notes/cuda.html#cuda-graphs), on a
launch-bound MLP: annotations and subclasses at import, the whole-network capture recipe
(forward, backward, optimizer step), replays against eager steps, and the graph's memory pool."""

import os
import tempfile
import time
import warnings

import torch

# What `import transformers` does at import time (annotations are evaluated here: no
# `from __future__ import annotations`), and a subclass as frameworks write them.
maybe_graph: torch.cuda.CUDAGraph | None = None


class StepGraph(torch.cuda.CUDAGraph):
    def __init__(self, name: str = "step") -> None:
        super().__init__()
        self.name = name


print("ok import-time annotation and subclass")

REPLAYS = 20
torch.manual_seed(0)
model = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU()) for _ in range(4)]).cuda()
loss_fn = torch.nn.MSELoss()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
static_input = torch.randn(8, 64, device="cuda")
static_target = torch.randn(8, 64, device="cuda")


def step() -> torch.Tensor:
    y = model(static_input)
    loss = loss_fn(y, static_target)
    loss.backward()
    optimizer.step()
    return loss


# Eager: host time per step (no sync) and step time (synchronized).
for _ in range(3):
    optimizer.zero_grad(set_to_none=True)
    step()
torch.cuda.synchronize()
t0 = time.perf_counter()
for _ in range(REPLAYS):
    optimizer.zero_grad(set_to_none=True)
    step()
t1 = time.perf_counter()
torch.cuda.synchronize()
t2 = time.perf_counter()
eager_host = (t1 - t0) / REPLAYS
eager_step = (t2 - t0) / REPLAYS

assert isinstance(torch.cuda.graph_pool_handle(), tuple)
assert not torch.cuda.is_current_stream_capturing()

# The documented recipe: warm up on a side stream, capture, replay.
s = torch.cuda.Stream()
s.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(s):
    for _ in range(3):
        optimizer.zero_grad(set_to_none=True)
        step()
torch.cuda.current_stream().wait_stream(s)

torch.cuda.synchronize()
torch.cuda.empty_cache()
reserved_before = torch.cuda.memory_reserved()
g = StepGraph()
assert isinstance(g, torch.cuda.CUDAGraph) and g.name == "step"
optimizer.zero_grad(set_to_none=True)
capturing_inside = None
with torch.cuda.graph(g):
    capturing_inside = torch.cuda.is_current_stream_capturing()
    static_loss = step()
assert capturing_inside is True, capturing_inside
assert not torch.cuda.is_current_stream_capturing()
print("ok is_current_stream_capturing during capture only")
pool = g.pool()
assert isinstance(pool, tuple) and len(pool) == 2, pool

torch.cuda.empty_cache()
reserved_captured = torch.cuda.memory_reserved()
assert reserved_captured > reserved_before, (reserved_before, reserved_captured)
print("ok graph pool stays reserved through empty_cache")

real_inputs = [torch.rand_like(static_input) for _ in range(REPLAYS)]
real_targets = [torch.rand_like(static_target) for _ in range(REPLAYS)]
torch.cuda.synchronize()
t0 = time.perf_counter()
for data, target in zip(real_inputs, real_targets):
    static_input.copy_(data)
    static_target.copy_(target)
    g.replay()
t1 = time.perf_counter()
torch.cuda.synchronize()
t2 = time.perf_counter()
graph_host = (t1 - t0) / REPLAYS
graph_step = (t2 - t0) / REPLAYS
print(f"eager: host {eager_host * 1e6:.1f} us/step, step {eager_step * 1e6:.1f} us; "
      f"graph: host {graph_host * 1e6:.1f} us/step, step {graph_step * 1e6:.1f} us")
assert graph_host * 10 < eager_host, (graph_host, eager_host)
print("ok host time per replay is a small fraction of an eager step's")
assert graph_step < eager_step, (graph_step, eager_step)
print("ok launch-bound step is faster with CUDA graphs")
assert torch.cuda.memory_reserved() == reserved_captured  # a replay allocates nothing
print("ok replays allocate nothing")

# Errors a real GPU gives.
try:
    g.capture_begin()
except RuntimeError as e:
    assert "already owns a captured graph" in str(e), e
else:
    raise AssertionError("a second capture into one graph must fail")
try:
    torch.cuda.CUDAGraph().replay()
except RuntimeError as e:
    # torch 2.14's Python replay() instantiates first, so its C++ check speaks
    assert "without a preceding successful capture" in str(e) or "capture_end() must have been called" in str(e), e
else:
    raise AssertionError("replay before capture must fail")
try:
    torch.cuda.CUDAGraph().capture_begin()
except RuntimeError as e:
    assert "non-default stream" in str(e), e
else:
    raise AssertionError("capture on the default stream must fail")
h = torch.cuda.CUDAGraph()
try:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the aborted capture is empty
        with torch.cuda.graph(h):
            torch.cuda.synchronize()
except RuntimeError as e:
    assert "operation not permitted when stream is capturing" in str(e), e
else:
    raise AssertionError("synchronize inside a capture must fail")
print("ok capture errors as on CUDA")

# Destroying the graph releases its pool: with its static tensors gone, empty_cache frees it.
g.reset()
del g, static_loss
optimizer.zero_grad(set_to_none=True)
torch.cuda.empty_cache()
assert torch.cuda.memory_reserved() < reserved_captured, (torch.cuda.memory_reserved(), reserved_captured)
print("ok reset releases the graph pool")

# make_graphed_callables (torch's implementation) on a small module.
mlp = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64)).cuda()
x = torch.randn(8, 64, device="cuda", requires_grad=True)
graphed = torch.cuda.make_graphed_callables(mlp, (x,))
out = graphed(torch.randn(8, 64, device="cuda", requires_grad=True))
out.sum().backward()
torch.cuda.synchronize()
print("ok make_graphed_callables forward and backward")

# Fork and join inside a capture: a stream that waits on the capturing stream joins the capture
# (cudaStreamWaitEvent), so its work is recorded too, and it stops capturing with the capture.
side = torch.cuda.Stream()
fj = torch.cuda.CUDAGraph()
with torch.cuda.graph(fj):
    a = static_input * 2
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        side_capturing = torch.cuda.is_current_stream_capturing()
        b = static_input + 1
    torch.cuda.current_stream().wait_stream(side)
    c = a + b
assert side_capturing, "a stream that waited on a capturing stream captures too"
with torch.cuda.stream(side):
    assert not torch.cuda.is_current_stream_capturing()
fj.replay()
print("ok fork and join inside a capture")

# Sharing a pool between captures, and debug_dump (a DOT file of the captured ops).
d = torch.cuda.CUDAGraph()
d.enable_debug_mode()
shared = torch.cuda.graph_pool_handle()
with torch.cuda.graph(d, pool=shared):
    doubled = static_input * 2
e = torch.cuda.CUDAGraph()
with torch.cuda.graph(e, pool=d.pool()):
    tripled = static_input * 3
assert d.pool() == e.pool() == shared, (d.pool(), e.pool(), shared)
d.replay()
e.replay()
path = os.path.join(tempfile.mkdtemp(), "graph.dot")
d.debug_dump(path)
with open(path) as f:
    dot = f.read()
assert dot.startswith("digraph") and "aten.mul" in dot, dot
print("ok shared pool and debug_dump")
