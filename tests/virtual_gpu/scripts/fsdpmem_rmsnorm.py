"""nn.RMSNorm on a GPU runs the fused op and saves the bf16 input and rstd for backward.

    phantora trace -o run.json -- python tests/virtual_gpu/scripts/fsdpmem_rmsnorm.py

On a CUDA build of torch, rms_norm calls _fused_rms_norm, whose autograd node
(FusedRmsNormBackward0) saves the input, the weight and rstd (T x 1 fp32); the forward allocates
the output (2 T D bytes in bf16) and rstd. A decomposition would save the input in fp32 and more.
  fused_rms_norm   the grad_fn is the fused op's and the forward allocates only output and rstd
  backward         the gradients have the input's and weight's shapes and dtypes
"""

from __future__ import annotations

import torch
import torch.nn as nn

T, D = 4096, 2048


def main() -> None:
    norm = nn.RMSNorm(D, eps=1e-5, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(T, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    base = torch.cuda.memory_allocated()
    y = norm(x)
    assert type(y.grad_fn).__name__ == "FusedRmsNormBackward0", y.grad_fn
    grown = torch.cuda.memory_allocated() - base
    assert grown == 2 * T * D + 4 * T, grown  # output bf16 + rstd fp32 (sizes are multiples of 512)
    print("ok fused_rms_norm")
    y.sum().backward()
    assert x.grad.shape == x.shape and x.grad.dtype == torch.bfloat16, (x.grad.shape, x.grad.dtype)
    assert norm.weight.grad.shape == (D,), norm.weight.grad.shape
    print("ok backward")


if __name__ == "__main__":
    main()
