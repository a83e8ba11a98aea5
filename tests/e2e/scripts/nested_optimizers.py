"""Three training steps through an optimizer container: an Optimizer subclass whose step() steps
one inner optimizer per model part, as TorchTitan's OptimizersContainer does (each model part
of a pipeline stage has its own).

    nested_optimizers.py [load]

With `load`, first read the inner optimizers' state as a checkpoint load (or save) does:
torch.distributed.checkpoint's get_optimizer_state_dict makes AdamW's state by stepping each
inner optimizer once, alone, with zero gradients (state_dict.py _init_optim_state)."""
import sys

import torch
from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

parts = [torch.nn.Linear(256, 256, device="cuda") for _ in range(2)]


class Container(torch.optim.Optimizer):
    def __init__(self, models):
        self.inner = [torch.optim.AdamW(m.parameters(), lr=1e-3) for m in models]
        super().__init__([p for m in models for p in m.parameters()], {})

    def step(self, closure=None):
        for opt in self.inner:
            opt.step()

    def zero_grad(self, set_to_none=True):
        for opt in self.inner:
            opt.zero_grad(set_to_none)


opt = Container(parts)
if sys.argv[1:] == ["load"]:
    for m, inner in zip(parts, opt.inner):
        get_optimizer_state_dict(m, inner)
for step in range(3):
    x = torch.randn(64, 256, device="cuda")
    for m in parts:
        x = m(x)
    x.sum().backward()
    opt.step()
    opt.zero_grad()
torch.cuda.synchronize()
print("done", flush=True)
