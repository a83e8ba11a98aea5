"""torch.compile of a pointwise chain and of a transformer MLP block (tests/virtual_gpu/test_compile.py).

    compile_fusion.py eager|compiled

Runs a pointwise chain relu(x * 2 + 1) once, then NVTX-marked steps of a Llama-style MLP block
(RMSNorm, SwiGLU, residual) forward and backward, eagerly or compiled with the default
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
    """A Llama-style MLP sub-block: RMSNorm written out (as Llama's reference code has it),
    SwiGLU, residual."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.norm_weight = nn.Parameter(torch.ones(d))
        self.w1 = nn.Linear(d, 4 * d, bias=False)
        self.w3 = nn.Linear(d, 4 * d, bias=False)
        self.w2 = nn.Linear(4 * d, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.norm_weight
        return x + self.w2(torch.nn.functional.silu(self.w1(h)) * self.w3(h))


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
assert block.w1.weight.grad is not None and block.w1.weight.grad.shape == (2048, 512)
print("ok block")
