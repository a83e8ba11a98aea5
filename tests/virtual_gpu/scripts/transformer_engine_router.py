"""TE's fused MoE router under phantora (tests/virtual_gpu/test_transformer_engine.py): 4,096 tokens
over 8 experts, top-2, over scores without data. Each routing map format TE offers must hold the
routing model's balanced decision (every token 2 experts, every expert 4,096 x 2 / 8 = 1,024
tokens), read on the host as a dispatcher reads it; then the auxiliary loss, and backward through
both. Prints `ok NAME` per check that passed."""
import numpy as np
import torch
from transformer_engine.pytorch.router import (fused_compute_score_for_moe_aux_loss, fused_moe_aux_loss,
                                               fused_topk_with_score_function)

tokens, experts, k = 4096, 8, 2
per_expert = [tokens * k // experts] * experts
logits = torch.randn(tokens, experts, device="cuda", dtype=torch.bfloat16, requires_grad=True)
common = dict(topk=k, use_pre_softmax=False, num_groups=None, group_topk=None, scaling_factor=None,
              score_function="softmax", expert_bias=None)

probs, routing_map = fused_topk_with_score_function(logits, **common)
assert routing_map.dtype == torch.bool and tuple(routing_map.shape) == (tokens, experts), routing_map.shape
assert probs.dtype == torch.bfloat16 and tuple(probs.shape) == (tokens, experts)
assert routing_map.sum(dim=0).tolist() == per_expert, routing_map.sum(dim=0).tolist()
assert set(routing_map.sum(dim=1).tolist()) == {k}
print("ok bytemap")

_, bits = fused_topk_with_score_function(logits, **common, routing_map_format="bitmap_u8")
assert bits.dtype == torch.uint8 and tuple(bits.shape) == (tokens, 1), (bits.dtype, bits.shape)
chosen = np.unpackbits(bits.cpu().numpy(), axis=1, bitorder="little")[:, :experts]
assert chosen.sum(axis=0).tolist() == per_expert and set(chosen.sum(axis=1).tolist()) == {k}
print("ok bitmap")

dense = torch.empty(tokens, k, dtype=torch.int32, device="cuda")
_, indices = fused_topk_with_score_function(logits, **common, topk_indices=dense)
assert indices.data_ptr() == dense.data_ptr()  # written in place
assert torch.bincount(indices.flatten().long(), minlength=experts).tolist() == per_expert
print("ok dense_indices")

probs.sum().backward()
assert logits.grad is not None and logits.grad.shape == logits.shape
print("ok router_backward")

logits.grad = None
aux_map, scores = fused_compute_score_for_moe_aux_loss(logits, topk=k, score_function="softmax")
assert scores.dtype == torch.float32 and aux_map.sum(dim=0).tolist() == per_expert
loss = fused_moe_aux_loss(scores, aux_map.sum(dim=0), tokens, experts, k, 1e-2)
assert loss.dim() == 0 and loss.dtype == torch.float32
loss.backward()
assert logits.grad is not None and logits.grad.dtype == torch.bfloat16
print("ok aux_loss")
