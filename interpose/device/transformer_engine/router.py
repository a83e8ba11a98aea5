"""Transformer Engine's fused MoE router kernels (csrc/extensions/router.cpp; Megatron's
`--moe-router-fusion`): the top-k router with its score function, the scores of the auxiliary
loss, and the auxiliary loss, forward and backward. Each allocates what the C++ allocates and
issues one `nvte::` op per kernel (ops.py; costed in phantora/cost/transformer_engine.py).

The routing decision is phantora's routing model's, as for an unfused router's `topk` over the
same scores (interpose/values/routing.py): the routing map (a bool per token and expert, or its
bits), or the dense top-k indices, hold the experts the model assigns, so the token counts the
dispatcher reads from them agree with the trace's routing.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from interpose.device.transformer_engine import ops as nvte_ops
from interpose.values import policy as values
from interpose.values import routing

BYTEMAP, BITMAP_U8 = 0, 1  # NVTERoutingMapFormat
SCORE_FUNCTIONS = ("sigmoid", "softmax", "sqrtsoftplus")


def _lead_and_experts(logits: torch.Tensor) -> tuple[list[int], int]:
    if logits.dim() < 1:
        raise RuntimeError("logits must have at least 1 dim")
    lead, experts = list(logits.shape[:-1]), int(logits.shape[-1])
    if int(np.prod(lead)) <= 0 or experts <= 0:
        raise RuntimeError("num_tokens and num_experts must be greater than 0")
    return lead, experts


def _routing_map(lead: list[int], experts: int, fmt: int, device: torch.device) -> torch.Tensor:
    if fmt == BITMAP_U8:
        return torch.empty([*lead, (experts + 7) // 8], dtype=torch.uint8, device=device)
    if fmt != BYTEMAP:
        raise RuntimeError(f"routing_map_format must be BYTEMAP (0) or BITMAP_U8 (1), got {fmt}")
    return torch.empty([*lead, experts], dtype=torch.bool, device=device)


def _hold_decision(logits: torch.Tensor, topk: int, out: torch.Tensor, dense: bool, fmt: int) -> None:
    """`out` (dense indices, or the routing map in `fmt`) holds the routing model's experts."""
    from interpose import runtime as rt_mod

    rt = rt_mod.current()
    obs = None if rt is None else rt.observer  # none outside a traced run (unit tests)
    if obs is None or not routing.unheld(obs, logits):
        return
    decided = routing.decide(obs, logits, topk, -1)
    if decided is None:
        return
    table, report = decided  # [*lead, topk] expert ids
    experts = logits.shape[-1]
    with values.real_cpu():
        if dense:
            held = table.to(out.dtype)
        else:
            chosen = torch.zeros([*table.shape[:-1], experts], dtype=torch.bool).scatter_(-1, table, True)
            held = chosen if fmt == BYTEMAP else torch.from_numpy(
                np.packbits(chosen.numpy(), axis=-1, bitorder="little"))
        values.set_shadow(out, held.contiguous())
    report()


def fused_topk_with_score_function_fwd(logits: torch.Tensor, topk: int, use_pre_softmax: bool, num_groups: Any,
                                       group_topk: Any, scaling_factor: Any, score_function: str,
                                       expert_bias: Any, routing_map_format: int = BYTEMAP,
                                       topk_indices: Any = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(probs in the logits' dtype, the routing map or the dense indices, fp32 intermediate)."""
    lead, experts = _lead_and_experts(logits)
    fmt = int(routing_map_format)
    if not 0 < topk <= experts:
        raise RuntimeError(f"topk must be in [1, num_experts], got topk={topk} num_experts={experts}")
    if score_function not in SCORE_FUNCTIONS:
        raise RuntimeError("score_function must be softmax, sigmoid or sqrtsoftplus for router fusion")
    if expert_bias is not None and score_function == "softmax":
        raise RuntimeError("score_function must be sigmoid or sqrtsoftplus when expert_bias is not None")
    if topk_indices is not None and fmt != BYTEMAP:
        raise RuntimeError("topk_indices output cannot be combined with non-default routing_map_format")
    probs = torch.empty(logits.shape, dtype=logits.dtype, device=logits.device)
    out = topk_indices if topk_indices is not None else _routing_map(lead, experts, fmt, logits.device)
    intermediate = torch.empty(logits.shape, dtype=torch.float32, device=logits.device)
    nvte_ops.define_ops()
    torch.ops.nvte.router_fwd(logits, expert_bias, probs, out, intermediate, "topk")
    _hold_decision(logits, int(topk), out, topk_indices is not None, fmt)
    return probs, out, intermediate


def fused_topk_with_score_function_bwd(routing_map: torch.Tensor, intermediate_output: torch.Tensor,
                                       grad_probs: torch.Tensor, grad_logits: torch.Tensor, *args: Any) -> None:
    nvte_ops.define_ops()
    torch.ops.nvte.router_bwd(routing_map, intermediate_output, grad_probs, grad_logits, "topk")


def fused_score_for_moe_aux_loss_fwd(logits: torch.Tensor, topk: int, score_function: str,
                                     routing_map_format: int = BYTEMAP) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(fp32 scores, the routing map of the auxiliary loss's top-k, fp32 intermediate)."""
    lead, experts = _lead_and_experts(logits)
    fmt = int(routing_map_format)
    if score_function not in SCORE_FUNCTIONS:
        raise RuntimeError("score_function must be softmax, sigmoid or sqrtsoftplus for router fusion")
    scores = torch.empty(logits.shape, dtype=torch.float32, device=logits.device)
    out = _routing_map(lead, experts, fmt, logits.device)
    intermediate = torch.empty(logits.shape, dtype=torch.float32, device=logits.device)
    nvte_ops.define_ops()
    torch.ops.nvte.router_fwd(logits, None, scores, out, intermediate, "aux_scores")
    _hold_decision(logits, int(topk), out, False, fmt)
    return scores, out, intermediate


def fused_score_for_moe_aux_loss_bwd(intermediate_output: torch.Tensor, grad_scores: torch.Tensor,
                                     grad_logits: torch.Tensor, topk: int, score_function: str) -> None:
    nvte_ops.define_ops()
    torch.ops.nvte.router_bwd(None, intermediate_output, grad_scores, grad_logits, "aux_scores")


def fused_moe_aux_loss_fwd(probs: torch.Tensor, tokens_per_expert: torch.Tensor, total_num_tokens: Any,
                           num_experts: int, num_rows: int, num_cols: int, topk: int,
                           coeff: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(the scalar loss in the probs' dtype, the fp32 constants the backward reads)."""
    aux_loss = torch.empty((), dtype=probs.dtype, device=probs.device)
    const_buf = torch.empty(2, dtype=torch.float32, device=probs.device)
    nvte_ops.define_ops()
    torch.ops.nvte.aux_loss_fwd(probs, tokens_per_expert, aux_loss, const_buf)
    return aux_loss, const_buf


def fused_moe_aux_loss_bwd(Const_buf: torch.Tensor, tokens_per_expert: torch.Tensor, num_rows: int,
                           num_cols: int, grad_aux_loss: torch.Tensor) -> torch.Tensor:
    grad_probs = torch.empty((int(num_rows), int(num_cols)), dtype=grad_aux_loss.dtype, device=grad_aux_loss.device)
    nvte_ops.define_ops()
    torch.ops.nvte.aux_loss_bwd(Const_buf, tokens_per_expert, grad_aux_loss, grad_probs)
    return grad_probs


FUNCTIONS = {
    "fused_topk_with_score_function_fwd": fused_topk_with_score_function_fwd,
    "fused_topk_with_score_function_bwd": fused_topk_with_score_function_bwd,
    "fused_score_for_moe_aux_loss_fwd": fused_score_for_moe_aux_loss_fwd,
    "fused_score_for_moe_aux_loss_bwd": fused_score_for_moe_aux_loss_bwd,
    "fused_moe_aux_loss_fwd": fused_moe_aux_loss_fwd,
    "fused_moe_aux_loss_bwd": fused_moe_aux_loss_bwd,
}
