"""FlashAttention 3 on a virtual H100 (interpose/device/flash_attn3.py): torch's FA3 activation,
varlen attention through it, and FA3's own Python API, forward and backward.

The test (tests/virtual_gpu/test_flash_attn3.py) reads the FA3 kernels of the trace in this
order: varlen with known offsets, varlen with unknown offsets, flash_attn_func (GQA),
flash_attn_varlen_func; a forward then a backward each.
"""

import torch
from torch.nn.attention import activate_flash_attention_impl, current_flash_attention_impl
from torch.nn.attention.varlen import AuxRequest, varlen_attn

H, D = 4, 64
LENGTHS = (300, 500, 224)  # three packed sequences
T = sum(LENGTHS)
OFFSETS = (0, 300, 800, 1024)

assert torch.cuda.get_device_capability() == (9, 0)
activate_flash_attention_impl("FA3")
assert current_flash_attention_impl() == "FA3"
import flash_attn_interface  # noqa: E402  (imported by the activation above: the stand-in)

assert getattr(flash_attn_interface, "__phantora_stand_in__", False)
assert hasattr(torch.ops.flash_attn_3, "fwd") and hasattr(torch.ops.flash_attn_3, "bwd")
print("ok activate")


def packed(*shape, heads=H):
    return [torch.randn(*shape, heads, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
            for _ in range(3)]


def varlen(cu, name):
    q, k, v = packed(T)
    out, lse = varlen_attn(q, k, v, cu, cu, max(LENGTHS), max(LENGTHS), window_size=(-1, 0),
                           return_aux=AuxRequest(lse=True))
    assert out.shape == (T, H, D) and out.dtype == torch.bfloat16 and out.device.type == "cuda"
    assert lse.shape == (H, T) and lse.dtype == torch.float32
    out.sum().backward()
    for x in (q, k, v):
        assert x.grad.shape == x.shape and x.grad.dtype == torch.bfloat16
    torch.cuda.synchronize()
    print(f"ok {name}")


# Offsets copied from the CPU: phantora holds their values, the cost is summed per sequence.
varlen(torch.tensor(OFFSETS, dtype=torch.int32).to("cuda"), "varlen_known")
# Offsets computed on the GPU hold no data: every sequence is costed at the average length.
varlen(torch.empty(len(OFFSETS), dtype=torch.int32, device="cuda"), "varlen_unknown")

# FA3's own API, dense with grouped-query attention: q [B, S, 8, D], k and v [B, S, 2, D].
q = torch.randn(2, 512, 8, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
k, v = packed(2, 512, heads=2)[:2]
out, lse = flash_attn_interface.flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
assert out.shape == (2, 512, 8, D) and out.dtype == torch.bfloat16
assert lse.shape == (2, 8, 512) and lse.dtype == torch.float32
out.sum().backward()
assert q.grad.shape == q.shape and k.grad.shape == k.shape and v.grad.shape == v.shape
torch.cuda.synchronize()
print("ok flash_attn_func")

q, k, v = packed(T)
cu = torch.tensor(OFFSETS, dtype=torch.int32).to("cuda")
out = flash_attn_interface.flash_attn_varlen_func(q, k, v, cu, cu, max(LENGTHS), max(LENGTHS), causal=True)
assert out.shape == (T, H, D)
out.sum().backward()
assert q.grad.shape == q.shape
torch.cuda.synchronize()
print("ok flash_attn_varlen_func")

try:
    flash_attn_interface.flash_attn_with_kvcache(q, k, v)
except NotImplementedError as e:
    assert "not modelled" in str(e)
    print("ok unmodelled_api")
