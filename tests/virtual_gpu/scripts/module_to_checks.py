"""Module.to() / .cuda() / .half() on parameters built on the CPU, as a real GPU does them.

Run under `phantora trace`. On a real GPU torch converts each parameter with `param.data = ...`:
the Parameter objects, their gradients (moved too), attributes set on them, weakrefs and
weakref.finalize on them (DeepSpeed puts one on every parameter) and an optimizer built before
the move all stay valid. Prints `ok <check>` per passed check.
"""

import weakref

import numpy as np
import torch
import torch.nn as nn


def model() -> nn.Module:
    return nn.Sequential(nn.Linear(256, 256), nn.LayerNorm(256), nn.Linear(256, 128))


m = model()
params = list(m.parameters())
finalizers = [weakref.finalize(p, lambda: None) for p in params]
refs = [weakref.ref(p) for p in params]
for i, p in enumerate(params):
    p.ds_id = i  # DeepSpeed-style attribute on the parameter object
opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
m(torch.randn(4, 256)).sum().backward()
grads = [p.grad for p in params]
assert all(g is not None and g.device.type == "cpu" for g in grads)

m.to("cuda")
moved = list(m.parameters())
assert all(a is b for a, b in zip(moved, params)), "Module.to() replaced Parameter objects"
assert all(p.device == torch.device("cuda:0") for p in moved), [p.device for p in moved]
assert all(isinstance(p, nn.Parameter) and p.requires_grad and p.is_leaf for p in moved)
print("ok to_cuda_keeps_parameters")

assert all(p.grad is g for p, g in zip(moved, grads)), "gradients were replaced"
assert all(p.grad.device == torch.device("cuda:0") for p in moved)
print("ok grads_move_with_parameters")

assert all(f.alive and f.peek()[0] is p for f, p in zip(finalizers, params))
assert all(r() is p for r, p in zip(refs, params))
assert [p.ds_id for p in moved] == list(range(len(params)))
print("ok weakrefs_and_attributes_kept")

expected = sum(p.nbytes for p in moved) * 2  # parameters + gradients, each a multiple of 512 B
assert torch.cuda.memory_allocated() == expected, (torch.cuda.memory_allocated(), expected)
print("ok memory_counts_each_parameter_once")

opt.zero_grad()
with torch.autocast("cuda", dtype=torch.bfloat16):
    out = m(torch.randn(4, 256, device="cuda"))
assert out.dtype == torch.bfloat16 and out.device.type == "cuda"
out.float().sum().backward()
assert all(p.grad.device.type == "cuda" for p in moved)
opt.step()
state = opt.state[params[0]]
assert state["exp_avg"].device == torch.device("cuda:0"), state["exp_avg"].device
print("ok optimizer_built_before_to_steps_on_gpu")

m.half()
assert all(a is b for a, b in zip(m.parameters(), params))
assert all(p.dtype == torch.float16 and p.grad.dtype == torch.float16 for p in params)
m.to(torch.bfloat16)
assert all(p.dtype == torch.bfloat16 for p in params)
m.to("cuda:1", torch.float32)
assert all(a is b for a, b in zip(m.parameters(), params))
assert all(p.device == torch.device("cuda:1") and p.dtype == torch.float32 for p in params)
assert all(p.grad.device == torch.device("cuda:1") for p in params)
print("ok dtype_and_device_changes_keep_parameters")

m2 = model()
p2 = list(m2.parameters())
fins2 = [weakref.finalize(p, lambda: None) for p in p2]
m2.cuda()
assert all(a is b and a.device == torch.device("cuda:0") for a, b in zip(m2.parameters(), p2))
m2.to("cuda")  # already there: .to() returns each parameter itself
assert all(a is b and a.device == torch.device("cuda:0") for a, b in zip(m2.parameters(), p2))
m2.cpu()
assert all(a is b and a.device.type == "cpu" for a, b in zip(m2.parameters(), p2))
m2.to_empty(device="cuda")
assert all(a is b and a.device == torch.device("cuda:0") for a, b in zip(m2.parameters(), p2))
print("ok cuda_cpu_to_empty_keep_parameters")

bn = nn.BatchNorm1d(8)
bn.to("cuda")
assert bn.running_mean.device.type == "cuda" and bn.num_batches_tracked.device.type == "cuda"
print("ok buffers_move")

# A parameter around a real CPU array (loaded weights): moving it to the GPU still works.
lin = nn.Linear(4, 4, bias=False)
lin.weight = nn.Parameter(torch.from_numpy(np.ones((4, 4), dtype=np.float32)))
lin.to("cuda")
assert lin.weight.device == torch.device("cuda:0") and isinstance(lin.weight, nn.Parameter)
y = lin(torch.ones(2, 4, device="cuda"))
assert y.shape == (2, 4) and y.device.type == "cuda"
print("ok real_cpu_parameter_moves")
