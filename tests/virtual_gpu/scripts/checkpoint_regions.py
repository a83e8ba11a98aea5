"""Activation checkpointing, eager and compiled, as frameworks call it (issue 30).

  eager  : 3 regions with use_reentrant=False, 2 with use_reentrant=True, and 4 blocks wrapped by
           torch.distributed's checkpoint_wrapper (TorchTitan's and FSDP users' way), one forward
           and backward each: every region runs its forward once and again in backward
  compile: torch.compile(fullgraph=True) of a model whose blocks are checkpoint_wrapper'd, as
           TorchTitan compiles each block after applying activation checkpointing; Dynamo must
           see torch.utils.checkpoint.checkpoint itself to turn it into its checkpoint operator

The test counts phantora's `python: checkpoint` host slices (one per region entry and one per
recomputation) in the trace.
"""

import sys

import torch
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.utils.checkpoint import checkpoint

mode = sys.argv[1]
dev = torch.device("cuda")


def block(x: torch.Tensor) -> torch.Tensor:
    return torch.tanh(x @ x.T) @ x


if mode == "eager":
    x = torch.randn(64, 64, device=dev, requires_grad=True)
    y = x
    for _ in range(3):
        y = checkpoint(block, y, use_reentrant=False)
    for _ in range(2):
        y = checkpoint(block, y, use_reentrant=True)
    layers = torch.nn.Sequential(*[checkpoint_wrapper(torch.nn.Linear(64, 64)) for _ in range(4)]).to(dev)
    layers(y).sum().backward()
    assert x.grad is not None and x.grad.shape == x.shape
    torch.cuda.synchronize()
    print("ok eager")

if mode == "compile":
    model = torch.nn.Sequential(*[checkpoint_wrapper(torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.GELU()))
                                  for _ in range(2)]).to(dev)
    compiled = torch.compile(model, fullgraph=True)
    x = torch.randn(8, 64, device=dev, requires_grad=True)
    for _ in range(2):
        compiled(x).sum().backward()
    assert x.grad is not None
    torch.cuda.synchronize()
    print("ok compile")
