"""Transformer Engine's own modules (pip transformer_engine) forward and backward in BF16 on a
virtual H100: tests/virtual_gpu/test_transformer_engine.py."""
import torch
import transformer_engine.pytorch as te
import transformer_engine_torch as tex

assert getattr(tex, "__phantora_stand_in__", False), tex
print("ok stand_in")
s, b, h, f = 512, 2, 1024, 4096
x = torch.randn(s, b, h, device="cuda", dtype=torch.bfloat16, requires_grad=True)
mlp = te.LayerNormMLP(h, f, params_dtype=torch.bfloat16)
y = mlp(x)
y.sum().backward()
assert y.shape == x.shape and x.grad.shape == x.shape and mlp.fc1_weight.grad.shape == (f, h)
print("ok layernorm_mlp")
from transformer_engine.pytorch.attention.dot_product_attention import _attention_backends  # noqa: E402

# TE chooses its backend as on an H100: cuDNN's fused attention (FusedAttention, sub-backend
# F16_arbitrary_seqlen) for head dimension 64; for 264 (cuDNN on Hopper stops at 256) its unfused
# attention, two batched GEMMs around its fused softmax
dpa = te.DotProductAttention(16, 64, attn_mask_type="causal")
q = torch.randn(s, b, 16, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
o = dpa(q, q, q)
assert _attention_backends["use_fused_attention"] and _attention_backends["fused_attention_backend"] == 1, _attention_backends
o.sum().backward()
assert o.shape == (s, b, 1024) and q.grad.shape == q.shape
wide = te.DotProductAttention(4, 264, attn_mask_type="causal")
q = torch.randn(s, b, 4, 264, device="cuda", dtype=torch.bfloat16, requires_grad=True)
o = wide(q, q, q)
assert _attention_backends["use_unfused_attention"] and not _attention_backends["use_fused_attention"], _attention_backends
o.sum().backward()
assert o.shape == (s, b, 4 * 264) and q.grad.shape == q.shape
print("ok dot_product_attention")
from transformer_engine.common.recipe import DelayedScaling, Format  # noqa: E402

lnl = te.LayerNormLinear(h, f, params_dtype=torch.bfloat16)
with te.autocast(enabled=True, recipe=DelayedScaling(fp8_format=Format.HYBRID)):
    y = lnl(x)
y.sum().backward()
assert y.shape == (s, b, f) and lnl.weight.grad.shape == (f, h)
print("ok fp8_layernorm_linear")

# FP8 weights (quantized_model_init): on Hopper a Float8Tensor parameter holds its FP8 data and its
# FP8 transpose (for dgrad), 1 byte each per element, so 2 bytes per weight as in BF16, plus the
# recipe's small amax histories and scales
n = 2048
before = torch.cuda.memory_allocated()
with te.quantized_model_init(enabled=True, recipe=DelayedScaling(fp8_format=Format.HYBRID)):
    w8 = te.Linear(n, n, params_dtype=torch.bfloat16, bias=False)
grown = torch.cuda.memory_allocated() - before
assert type(w8.weight).__name__ == "Float8Tensor" and w8.weight._data.shape == (n, n), type(w8.weight)
assert w8.weight._transpose is not None and w8.weight._transpose.shape == (n, n)
assert 2 * n * n <= grown <= 2 * n * n + 256 * 1024, grown
print("ok fp8_weights")
torch.cuda.synchronize()
