"""FFTs: _fft_r2c, _fft_c2r, _fft_c2c (torch.fft.*, torch.stft).

cuFFT is memory-bound: transforms that fit one thread block's shared memory (up to ~4096
points per dimension) take one read and one write of the data per transformed dimension;
longer ones take a pass per ~4096-fold factor. FLOPs: 5 N log2 N per complex transform
(half for real-to-complex and complex-to-real). A normalization other than "none" adds a
scaling pass.
"""

from __future__ import annotations

import math

from phantora.cost.roofline import CostContext, Kernel, OpCost, footprint_bytes, prod, streaming_kernel
from phantora.ops import OpSignature

POINTS_PER_PASS = 4096


def fft(sig: OpSignature, ctx: CostContext) -> OpCost:
    """_fft_*(self, dim, normalization, ...)."""
    x = sig.args[0]
    out = sig.tensors_out()[0]
    dims = sig.args[1] if isinstance(sig.args[1], tuple) else (sig.args[1],)
    normalization = sig.args[2] if len(sig.args) > 2 else 0
    big = x if x.numel * x.itemsize >= out.numel * out.itemsize else out
    points = prod(big.shape[d % len(big.shape)] for d in dims) if big.shape else 1
    passes = sum(max(1, math.ceil(math.log(max(big.shape[d % len(big.shape)], 2), POINTS_PER_PASS))) for d in dims)
    complex_elements = max(x.numel, out.numel)
    flops = 5.0 * complex_elements * math.log2(max(points, 2))
    if sig.short_name != "_fft_c2c":
        flops /= 2
    per_pass = float(footprint_bytes(x) + footprint_bytes(out))
    kernels: list[Kernel] = [
        streaming_kernel("regular_fft_factor", ctx.gpu, per_pass, flops / passes) for _ in range(passes)
    ]
    if normalization:
        kernels.append(streaming_kernel("elementwise_kernel<scale>", ctx.gpu, 2.0 * footprint_bytes(out)))
    return OpCost(tuple(kernels))
