"""Eager flex_attention on a virtual GPU: causal, sliding-window, document and full masks, forward
and backward (cuda, bf16, B=2, H=4, S=512, D=64), then SDPA of the same shape for comparison.
The test reads the kernels of the trace in this order: causal, sliding, document, full, sdpa."""

import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import AuxRequest, create_block_mask, flex_attention

B, H, S, D = 2, 4, 512, 64
WINDOW = 128


def qkv():
    return [torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3)]


def causal(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


def sliding(b, h, q_idx, kv_idx):
    return (q_idx >= kv_idx) & (q_idx - kv_idx <= WINDOW)


# Three documents of 200, 200 and 112 tokens; the ids live on the (virtual) GPU, as in training.
document_id = torch.repeat_interleave(torch.arange(3), torch.tensor([200, 200, 112])).to("cuda")


def document(b, h, q_idx, kv_idx):
    return document_id[q_idx] == document_id[kv_idx]


masks = {
    "causal": create_block_mask(causal, B=None, H=None, Q_LEN=S, KV_LEN=S, device="cuda"),
    "sliding": create_block_mask(sliding, B=None, H=None, Q_LEN=S, KV_LEN=S, device="cuda"),
    "document": create_block_mask(document, B=None, H=None, Q_LEN=S, KV_LEN=S, device="cuda"),
}

for name in ("causal", "sliding", "document"):
    q, k, v = qkv()
    out = flex_attention(q, k, v, block_mask=masks[name])
    assert out.shape == (B, H, S, D) and out.dtype == torch.bfloat16 and out.device.type == "cuda"
    out.sum().backward()
    assert q.grad.shape == q.shape and k.grad.shape == k.shape and v.grad.shape == v.shape
    torch.cuda.synchronize()
    print(f"ok flex_{name}")

q, k, v = qkv()
out, aux = flex_attention(q, k, v, return_aux=AuxRequest(lse=True))  # no block mask: every block
lse = aux.lse
assert lse.shape == (B, H, S) and lse.dtype == torch.float32
out.sum().backward()
torch.cuda.synchronize()
print("ok flex_full")

q, k, v = qkv()
F.scaled_dot_product_attention(q, k, v).sum().backward()
torch.cuda.synchronize()
print("ok sdpa")

# 128-token blocks: causal sees 10 of the 4 x 4 blocks, the 128-token window 7 (diagonal and the
# one below it); the CPU-evaluated masks carry their real block counts.
assert masks["causal"].kv_num_blocks.device.type == "cuda"
assert abs(masks["causal"].sparsity() - 100 * (1 - 10 / 16)) < 1e-6, masks["causal"].sparsity()
assert abs(masks["sliding"].sparsity() - 100 * (1 - 7 / 16)) < 1e-6, masks["sliding"].sparsity()
print("ok block_mask_sparsity")

# A long causal mask (12288^2 cells, beyond what is built at once on the CPU) is counted in
# slices of query rows: 96 blocks per side, 96 * 97 / 2 of them visited.
long_mask = create_block_mask(causal, B=None, H=None, Q_LEN=12288, KV_LEN=12288, device="cuda")
assert abs(long_mask.sparsity() - 100 * (1 - 96 * 97 / 2 / 96**2)) < 1e-6, long_mask.sparsity()
print("ok block_mask_sliced")

# torch.compile(flex_attention), as TorchTitan wraps it, runs the same way.
q, k, v = qkv()
compiled = torch.compile(flex_attention)
out = compiled(q, k, v, block_mask=masks["causal"])
assert out.shape == (B, H, S, D)
print("ok flex_compiled_wrapper")
