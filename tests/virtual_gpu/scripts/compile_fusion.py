"""torch.compile of a pointwise chain and of a transformer MLP block (tests/virtual_gpu/test_compile.py).

    compile_fusion.py eager|compiled

Runs a pointwise chain relu(x * 2 + 1) once, then NVTX-marked steps of an MLP block (LayerNorm,
Linear, GELU, Linear, residual) forward and backward, eagerly or compiled with the default
Inductor backend and fullgraph=True (which raises on any graph break).
"""

import sys

import torch
import torch.nn as nn

mode = sys.argv[1]
compiled = mode == "compiled"


def chain(x: torch.Tensor) -> torch.Tensor:
    return torch.relu(x * 2 + 1)


class MLPBlock(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(d)
        self.up = nn.Linear(d, 4 * d)
        self.act = nn.GELU(approximate="tanh")
        self.down = nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(self.act(self.up(self.ln(x))))


x = torch.randn(1024, 1024, device="cuda")
fn = torch.compile(chain, fullgraph=True) if compiled else chain
torch.cuda.nvtx.range_push("chain")
y = fn(x)
torch.cuda.nvtx.range_pop()
assert y.shape == (1024, 1024) and y.device.type == "cuda"
print("ok chain")

block = MLPBlock(512).cuda()
run = torch.compile(block, fullgraph=True) if compiled else block
h = torch.randn(8, 256, 512, device="cuda", requires_grad=True)
for step in range(3):
    torch.cuda.nvtx.range_push(f"block step {step}")
    out = run(h)
    out.sum().backward()
    torch.cuda.nvtx.range_pop()
torch.cuda.synchronize()
assert block.up.weight.grad is not None and block.up.weight.grad.shape == (2048, 512)
print("ok block")
