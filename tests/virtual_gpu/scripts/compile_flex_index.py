"""Compiled flex_attention in inference (torch.no_grad, as TorchTitan's validator runs it) with a
mask_mod that indexes a tensor it closes over by a Python integer, as context parallelism's
load-balanced masks do (`qkv_rearrange_indices[0][q_idx]`, torch/distributed/tensor/experimental/
_context_parallel/_attention.py). torch traces `idx[0]` there as `idx[torch.tensor(0)]`; Inductor used
to fail lowering the mask's subgraph (LoweringException: AttributeError: 'Tensor' object has no
attribute 'get_dtype', issue 30). Head-tail order of 4 chunks of 128 tokens (0, 3, 1, 2): the
causal mask on the original positions visits 10 of the 4 x 4 blocks."""

import torch
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

B, H, S, D = 1, 4, 512, 16
order = torch.arange(S, dtype=torch.int32).view(4, S // 4)[[0, 3, 1, 2]].reshape(1, S).to("cuda")


def causal_on_original_positions(b, h, q_idx, kv_idx):
    return order[0][q_idx] >= order[0][kv_idx]


mask = create_block_mask(causal_on_original_positions, B=None, H=None, Q_LEN=S, KV_LEN=S, device="cuda")
flex = torch.compile(flex_attention)
q, k, v = (torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
with torch.no_grad():
    out = flex(q, k, v, block_mask=mask)
torch.cuda.synchronize()
assert out.shape == (B, H, S, D)
print("ok flex_inference_index")
