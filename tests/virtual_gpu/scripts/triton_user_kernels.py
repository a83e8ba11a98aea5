"""Triton kernels the program launches itself (`@triton.jit`, `kernel[grid](...)`), as Liger,
Unsloth and TorchTitan's fused SwiGLU do (issue 30): Triton compiles them on the CPU for the
simulated GPU and each launch is one kernel in the trace, named after the jit function, moving
its tensor arguments (interpose/compile/user_kernels.py). Launched directly, through a block
pointer, and inside a torch.library.custom_op. A tensor the kernel only reads keeps its known
values; one it writes no longer claims to hold what it held before."""

import torch
import triton
import triton.language as tl

N = 4096  # add: x, y fp32 read, out fp32 written
M, K = 64, 128  # block copy: src bf16 [M, K] read, dst fp32 [M, K] written


@triton.jit
def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    y = tl.load(y_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, x + y, mask=mask)


@triton.jit
def block_copy_kernel(src, dst, rows, cols, stride_row, BM: tl.constexpr, BN: tl.constexpr):
    pid = tl.program_id(0)
    s = tl.make_block_ptr(base=src, shape=(rows, cols), strides=(stride_row, 1), offsets=(pid * BM, 0),
                          block_shape=(BM, BN), order=(1, 0))
    d = tl.make_block_ptr(base=dst, shape=(rows, cols), strides=(stride_row, 1), offsets=(pid * BM, 0),
                          block_shape=(BM, BN), order=(1, 0))
    for _ in range(0, cols, BN):
        v = tl.load(s, boundary_check=(0, 1))
        tl.store(d, v.to(tl.float32), boundary_check=(0, 1))
        s = tl.advance(s, (0, BN))
        d = tl.advance(d, (0, BN))


@triton.jit
def desc_copy_kernel(src, dst, rows, cols, BM: tl.constexpr, BN: tl.constexpr):
    pid = tl.program_id(0)
    s = tl.make_tensor_descriptor(src, shape=[rows, cols], strides=[cols, 1], block_shape=[BM, BN])
    d = tl.make_tensor_descriptor(dst, shape=[rows, cols], strides=[cols, 1], block_shape=[BM, BN])
    for k in range(0, cols, BN):
        d.store([pid * BM, k], s.load([pid * BM, k]).to(tl.float32))


@torch.library.custom_op("phantora_test::triton_add", mutates_args=())
def triton_add(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    out = torch.empty_like(x)
    add_kernel[(triton.cdiv(x.numel(), 1024),)](x, y, out, x.numel(), BLOCK=1024, num_warps=8)
    return out


@triton_add.register_fake
def _(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


x = torch.arange(N).to(torch.float32).to("cuda")  # known values (a real CPU tensor moved to the GPU)
assert x.tolist()[:5] == [0.0, 1.0, 2.0, 3.0, 4.0], x.tolist()[:5]
y = torch.ones(N, device="cuda")
out = torch.zeros(N, device="cuda")  # reads as 0 before the kernel writes it
assert out.tolist()[:3] == [0.0, 0.0, 0.0]
add_kernel[(triton.cdiv(N, 1024),)](x, y, out, N, BLOCK=1024)
add_kernel[lambda meta: (triton.cdiv(N, meta["BLOCK"]),)](x, x, out, N, BLOCK=512)  # x passed twice: read once
torch.cuda.synchronize()
assert x.tolist()[:5] == [0.0, 1.0, 2.0, 3.0, 4.0], x.tolist()[:5]  # read only: its values survive
assert out.tolist()[:3] != [0.0, 0.0, 0.0], out.tolist()[:3]  # written: no longer the zeros
print("ok add")

src = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
dst = torch.empty(M, K, device="cuda", dtype=torch.float32)
if tuple(int(v) for v in triton.__version__.split(".")[:2]) < (3, 9):  # Triton 3.9 removed block pointers
    block_copy_kernel[(triton.cdiv(M, 16),)](src, dst, M, K, K, BM=16, BN=32)
    torch.cuda.synchronize()
print("ok block_ptr")
# device-side tensor descriptors need global scratch from the program's allocator, as on a GPU
triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device="cuda"))
desc_copy_kernel[(triton.cdiv(M, 16),)](src, dst, M, K, BM=16, BN=32)
torch.cuda.synchronize()
print("ok tensor_descriptor")

small = torch.tensor([5.0, 6.0, 7.0]).to("cuda")
res = triton_add(small, small)
torch.cuda.synchronize()
assert res.shape == small.shape and small.tolist() == [5.0, 6.0, 7.0], small.tolist()
print("ok custom_op")
