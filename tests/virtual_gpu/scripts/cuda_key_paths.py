"""Ops that reach the CUDA dispatch key outside phantora's dispatch modes (issue 14, cause 1).

Framework code steps around Python dispatch in three ways seen in the wild; on a real GPU each
runs the CUDA kernels, on a virtual GPU each must act on virtual CUDA tensors:
  * `_disable_current_modes()`: DTensor's RNG tracker copies the CUDA RNG state to the GPU;
  * `no_dispatch()`: FSDP1 mixed precision calls Tensor.record_stream;
  * C++ element reads: `torch.tensor([0-dim CUDA tensors])` (Megatron's multi-tensor L2 norm).
"""
import torch
from torch.utils._mode_utils import no_dispatch
from torch.utils._python_dispatch import _disable_current_modes

x = torch.randn(4, 8, device="cuda")

# DTensor's OffsetBasedRNGTracker: the CUDA generator's state copied to the GPU with modes off.
with _disable_current_modes():
    host_state = torch.cuda.get_rng_state()
    state = host_state.to("cuda")
    blank = torch.empty(3, 4, device="cuda")
    ones = torch.ones(2, device="cuda", dtype=torch.bfloat16)
assert state.device == torch.device("cuda", 0), state.device
assert state.dtype == torch.uint8 and state.shape == host_state.shape, (state.dtype, state.shape)
assert blank.device.type == "cuda" and blank.shape == (3, 4)
assert ones.device.type == "cuda" and ones.dtype == torch.bfloat16
# ... and the program goes on using them, as DTensor's tracker does with its state.
seed_and_offset = state.view(torch.int64)
assert seed_and_offset.shape == (host_state.numel() // 8,) and seed_and_offset.device.type == "cuda"
y = (blank @ x).relu()
assert y.shape == (3, 8) and y.device.type == "cuda"
print("ok disabled_modes_to_cuda", flush=True)

# Values read with the modes off (DTensor's tracker compares states with `all(a == b)` inside
# DTensor's __torch_dispatch__, where the modes are stashed) read what they read elsewhere.
with _disable_current_modes():
    total = x.sum().item()
    same = [bool(v) for v in state == state]
    steps = torch.tensor(5, device="cuda").item()
assert total == x.sum().item(), total
assert len(same) == state.numel() and all(isinstance(v, bool) for v in same)
assert steps == 5, steps
print("ok disabled_modes_value_reads", flush=True)

# FSDP1 (mixed precision): record_stream of a virtual CUDA tensor under no_dispatch().
side = torch.cuda.Stream()
with no_dispatch():
    x.record_stream(side)
    z = x * 2
assert z.shape == x.shape and z.device.type == "cuda"
assert (z + x).shape == x.shape
print("ok no_dispatch_record_stream", flush=True)

# Megatron-Core's local_multi_tensor_l2_norm: torch.tensor over 0-dim CUDA tensors reads each
# element in C++; it reads what .item() reads.
norms = [torch.linalg.vector_norm(x), x.sum()]
t = torch.tensor(norms)
assert t.device.type == "cpu" and t.dtype == torch.float32, (t.device, t.dtype)
assert t.tolist() == [norms[0].item(), norms[1].item()], t.tolist()
# Small integer CUDA tensors hold real values (interpose/values/policy.py); C++ reads see them too.
n = torch.tensor(3, device="cuda")
counts = torch.tensor([n, n + 4, n * 2])
assert counts.tolist() == [3, 7, 6], counts.tolist()
on_gpu = torch.tensor([x.sum(), x.sum()], device="cuda")
assert on_gpu.device.type == "cuda" and on_gpu.shape == (2,)
nested = torch.tensor([[x.sum()], [x.mean()]], dtype=torch.float64)
assert nested.shape == (2, 1) and nested.dtype == torch.float64
print("ok tensor_from_cuda_scalars", flush=True)
