"""Transformer Engine's fused attention in the virtual `transformer_engine_torch`.

TE's `DotProductAttention` asks the extension which cuDNN sub-backend can run a configuration
(`get_fused_attn_backend`), then calls `fused_attn_fwd` / `fused_attn_bwd`
(csrc/extensions/attention.cpp), which allocate what the C++ allocates and run cuDNN's fused
flash-attention kernels (nvte_fused_attn_fwd / _bwd of the core library).

Here:
  * `get_fused_attn_backend` answers as the core library's nvte_get_fused_attn_backend does for
    BF16/FP16 on the virtual GPU's architecture and the cuDNN phantora reports
    (CUDNN_VERSION): the F16_arbitrary_seqlen sub-backend where cuDNN supports the
    head dimensions, masks, bias, formats and windows, else No_Backend with the reason (TE then
    picks another backend, as on a GPU). FP8 attention (the FP8 sub-backend, TE's `fp8_dpa`) and
    paged KV caches are not modelled: No_Backend, with a reason that says so.
  * `fused_attn_fwd` returns O (in `o_format`, `fake_dtype`; zeroed for THD as the C++ does), the
    softmax statistics (fp32 [b, h, sq, 1], or [tq, h, 1] for THD), the optional max logits and
    the RNG state, and issues `nvte::fused_attn_fwd`.
  * `fused_attn_bwd` allocates dQ, dK, dV as the C++ does for the gradient layout (one packed
    buffer for 3HD / H3D, dK and dV packed for the 2HD / H2D layouts, separate otherwise), dBias
    and dSoftmaxOffset when asked, and cuDNN's backward workspace (the fp32 dQ accumulator and
    softmax sums, held while the kernel runs), and issues `nvte::fused_attn_bwd`.
The kernels are timed as cuDNN's attention kernels on the same shapes (phantora/cost/attention.py,
transformer_engine.fused_attn), sliding windows (`window_size`, (left, right), -1 unbounded) as
the key blocks the window touches.
"""

from __future__ import annotations

import enum
from typing import Any

import torch

from interpose.device.transformer_engine import ops as nvte_ops
from interpose.device.transformer_engine.errors import not_modelled, plain

# What the virtual machine reports: the cuDNN that torch 2.14's CUDA 13 wheels bring (9.24.0,
# encoded as cudnnGetVersion does).
CUDNN_VERSION = 92400


class NVTE_Fused_Attn_Backend(enum.IntEnum):
    NVTE_No_Backend = -1
    NVTE_F16_arbitrary_seqlen = 1
    NVTE_FP8 = 2


CAUSAL_MASKS = ("NVTE_CAUSAL_MASK", "NVTE_PADDING_CAUSAL_MASK", "NVTE_CAUSAL_BOTTOM_RIGHT_MASK",
                "NVTE_PADDING_CAUSAL_BOTTOM_RIGHT_MASK")
PADDING_MASKS = ("NVTE_PADDING_MASK", "NVTE_PADDING_CAUSAL_MASK", "NVTE_PADDING_CAUSAL_BOTTOM_RIGHT_MASK")
BOTTOM_RIGHT_MASKS = ("NVTE_CAUSAL_BOTTOM_RIGHT_MASK", "NVTE_PADDING_CAUSAL_BOTTOM_RIGHT_MASK")


def _name(value: Any) -> str:
    return getattr(value, "name", str(value))


def layout_formats(layout: Any) -> tuple[str, str]:
    """(q format, kv format) of an NVTE_QKV_Layout: "sbhd", "bshd", "bhsd" or "thd"."""
    parts = _name(layout).removeprefix("NVTE_").removeprefix("Paged_KV_").split("_")

    def fmt(part: str) -> str:
        if part.startswith("SB"):
            return "sbhd"
        if part.startswith("BS"):
            return "bshd"
        if part.startswith("BH"):
            return "bhsd"
        if part.startswith("T"):
            return "thd"
        raise ValueError(f"QKV layout {_name(layout)} not supported")
    return fmt(parts[0]), fmt(parts[-1])


def gradient_layout_group(layout: Any) -> str:
    """nvte_get_qkv_layout_group: how dQ, dK and dV share buffers."""
    parts = _name(layout).removeprefix("NVTE_").split("_")
    if len(parts) == 1:
        return "3HD" if "3H" in parts[0] else "H3D"
    if len(parts) == 2:
        return "HD_2HD" if "2H" in parts[1] else "HD_H2D"
    return "HD_HD_HD"


def _dims(shape: tuple[int, ...], fmt: str) -> tuple[int | None, int, int, int]:
    """(batch, sequence or tokens, heads, head dim) of a q/k/v/o tensor in `fmt` (batch None for thd)."""
    if fmt == "thd":
        return None, shape[0], shape[1], shape[2]
    if fmt == "sbhd":
        return shape[1], shape[0], shape[2], shape[3]
    if fmt == "bshd":
        return shape[0], shape[1], shape[2], shape[3]
    return shape[0], shape[2], shape[1], shape[3]  # bhsd


def _shape(batch: int | None, seq: int, heads: int, dim: int, fmt: str) -> list[int]:
    if fmt == "thd":
        return [seq, heads, dim]
    if fmt == "sbhd":
        return [seq, batch or 1, heads, dim]
    if fmt == "bshd":
        return [batch or 1, seq, heads, dim]
    return [batch or 1, heads, seq, dim]


def _format_of(value: Any, default: str) -> str:
    """"sbhd" / "bshd" / "bhsd" / "thd" of an NVTE_QKV_Format (NOT_SET and the mixed ones: default)."""
    name = _name(value).removeprefix("NVTE_").lower()
    return name if name in ("sbhd", "bshd", "bhsd", "thd") else default


# --- get_fused_attn_backend ----------------------------------------------------------------------

def _arch() -> int:
    major, minor = torch.cuda.get_device_capability()
    return major * 10 + minor


def unsupported_reason(p: Any, cudnn_version: int) -> str:
    """Why cuDNN (the core library's nvte_get_fused_attn_backend) has no F16 sub-backend for the
    FusedAttentionParams `p`, or "" when it has."""
    sm = _arch()
    dtype = _name(p.qkv_dtype)
    if dtype in ("kFloat8E4M3", "kFloat8E5M2"):
        return ("phantora: FP8 fused attention (the FP8 sub-backend, TE's fp8_dpa) is not modelled by the "
                "virtual transformer_engine_torch; leave fp8_dpa off (attention in BF16, as by default)")
    if dtype not in ("kFloat16", "kBFloat16"):
        return f"unsupported qkv_dtype {dtype}"
    if _name(p.qkv_layout).startswith("NVTE_Paged_KV"):
        return "phantora: fused attention over a paged KV cache is not modelled"
    if sm < 80:
        return f"cuDNN fused attention needs compute capability 8.0 or newer (sm{sm})"
    dqk, dv, training = p.head_dim_qk, p.head_dim_v, p.is_training
    if dqk % 8 or dv % 8:
        return f"head dimensions must be multiples of 8 (d_qk={dqk}, d_v={dv})"
    supported_dims = (
        (dqk <= 128 and dv <= 128)
        or (dqk <= 256 and dv <= 256 and sm == 90)
        or (not training and sm >= 100 and p.max_seqlen_q > 1)
        or (training and sm >= 100 and (dqk, dv) == (192, 128)))
    if not supported_dims:
        return f"head dimensions d_qk={dqk}, d_v={dv} not supported on sm{sm} ({'training' if training else 'inference'})"
    if training and sm == 90 and dqk >= 128 and dv >= 128 and dqk != dv and (dqk, dv) != (192, 128):
        return f"cuDNN >= 9.11 on sm90: backward with d_qk={dqk} != d_v={dv} not supported"
    mask, bias = _name(p.attn_mask_type), _name(p.bias_type)
    if bias == "NVTE_PRE_SCALE_BIAS":
        return "pre-scale bias not supported"
    if bias == "NVTE_ALIBI" and (sm < 90 or mask not in CAUSAL_MASKS or mask in PADDING_MASKS):
        return "ALiBi needs a causal mask without padding on sm90+"
    if bias == "NVTE_POST_SCALE_BIAS" and mask in ("NVTE_PADDING_MASK", "NVTE_PADDING_CAUSAL_MASK"):
        return "post-scale bias with a padding mask not supported"
    if mask in PADDING_MASKS and (bias != "NVTE_NO_BIAS" or p.dropout != 0.0):
        return "padding masks need no bias and no dropout"
    if mask in BOTTOM_RIGHT_MASKS and p.max_seqlen_q > p.max_seqlen_kv:
        return "bottom-right causal masks need max_seqlen_q <= max_seqlen_kv"
    q_format, kv_format = layout_formats(p.qkv_layout)
    if "thd" in (q_format, kv_format) and sm < 90:
        return "the THD format needs sm90+"
    if cudnn_version < 90600 and p.window_size_left >= 0:
        return "sliding windows need cuDNN 9.6"
    return ""


def get_fused_attn_backend(params: Any) -> tuple[Any, str]:
    reason = unsupported_reason(params, CUDNN_VERSION)
    if reason:
        return NVTE_Fused_Attn_Backend.NVTE_No_Backend, reason
    return NVTE_Fused_Attn_Backend.NVTE_F16_arbitrary_seqlen, ""


# --- forward and backward ------------------------------------------------------------------------

def _attention_dims(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: Any, cu_seqlens_q: Any,
                    max_seqlen_q: int, max_seqlen_kv: int) -> tuple[int, int, int, int, int, int]:
    """(batch, query heads, seq_q, seq_kv, d_qk, d_v) the kernel works on. THD: the sequences'
    count from cu_seqlens and their mean length, bounded by the max (as aten's varlen ops)."""
    q_format, kv_format = layout_formats(layout)
    b, sq, h, dqk = _dims(tuple(q.shape), q_format)
    bk, skv, _, _ = _dims(tuple(k.shape), kv_format)
    dv = _dims(tuple(v.shape), kv_format)[3]
    if b is None or bk is None:
        batch = max(int(cu_seqlens_q.shape[0]) - 1, 1) if isinstance(cu_seqlens_q, torch.Tensor) else 1
        if b is None:
            sq = max(min(sq // batch, int(max_seqlen_q) or sq), 1)
        if bk is None:
            skv = max(min(skv // batch, int(max_seqlen_kv) or skv), 1)
        b = batch
    return b, h, sq, skv, dqk, dv


def _window(window_size: Any) -> tuple[int, int]:
    """(left, right) of TE's window_size; -1 for an unbounded side (TE's (-1, -1) and (-1, 0))."""
    if window_size is None or len(window_size) != 2:
        return -1, -1
    return int(window_size[0]), int(window_size[1])


def fused_attn_fwd(max_seqlen_q: int, max_seqlen_kv: int, is_training: bool, attn_scale: float, p_dropout: float,
                   set_zero: bool, qkv_layout: Any, o_format: Any, qkv_scale_inv_format: Any, bias_type: Any,
                   attn_mask_type: Any, softmax_type: Any, window_size: Any, bottom_right_diagonal: bool,
                   cu_seqlens_q: torch.Tensor, cu_seqlens_kv: torch.Tensor, Q: Any, K: Any, V: Any,
                   fake_dtype: torch.dtype, cu_seqlens_q_padded: Any, cu_seqlens_kv_padded: Any, page_table_k: Any,
                   page_table_v: Any, s_quantizer: Any, o_quantizer: Any, Bias: Any, SoftmaxOffset: Any,
                   rng_gen: Any, rng_elts_per_thread: int, return_max_logit: bool, cuda_graph: bool) -> list[Any]:
    q, k, v = (plain(t, f"fused attention's {what}") for t, what in ((Q, "Q"), (K, "K"), (V, "V")))
    if o_quantizer is not None:
        raise not_modelled(f"fused attention with a quantized output ({type(o_quantizer).__name__}): FP8 attention")
    if page_table_k is not None:
        raise not_modelled("fused attention over a paged KV cache")
    q_format, _ = layout_formats(qkv_layout)
    out_format = _format_of(o_format, q_format)
    b, sq, h, _ = _dims(tuple(q.shape), q_format)
    batch, heads, seq_q, seq_kv, d_qk, d_v = _attention_dims(q, k, v, qkv_layout, cu_seqlens_q,
                                                              max_seqlen_q, max_seqlen_kv)
    o = torch.empty(_shape(b, sq, h, d_v, out_format), dtype=fake_dtype, device=q.device)
    if out_format == "thd":
        o.zero_()
    # the softmax statistics (log-sum-exp per query row), and the max logits when asked
    stats_shape = [sq, h, 1] if q_format == "thd" else [b, h, sq, 1]
    stats = torch.empty(stats_shape, dtype=torch.float32, device=q.device)
    causal = _name(attn_mask_type) in CAUSAL_MASKS
    bias = Bias if isinstance(Bias, torch.Tensor) and _name(bias_type) not in ("NVTE_NO_BIAS", "NVTE_ALIBI") else None
    nvte_ops.define_ops()
    torch.ops.nvte.fused_attn_fwd(q, k, v, bias, o, stats, batch, heads, seq_q, seq_kv, d_qk, d_v, causal,
                                  *_window(window_size))
    outputs: list[Any] = [o, stats]
    if return_max_logit:
        outputs.append(torch.empty(stats_shape, dtype=torch.float32, device=q.device))
    outputs.append(torch.empty(2, dtype=torch.int64, device=q.device))  # the RNG state (philox seed, offset)
    if bias is not None:
        outputs.append(bias)
    if _name(softmax_type) != "NVTE_VANILLA_SOFTMAX" and isinstance(SoftmaxOffset, torch.Tensor):
        outputs.append(SoftmaxOffset)
    return outputs


def _gradients(dq_shape: list[int], dk_shape: list[int], dv_shape: list[int], group: str, dtype: torch.dtype,
               device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """dQ, dK, dV allocated as fused_attn_bwd does for the gradient layout's group."""
    def empty(shape: list[int]) -> torch.Tensor:
        return torch.empty(shape, dtype=dtype, device=device)
    if group in ("3HD", "H3D"):
        dim = len(dq_shape) - (2 if group == "3HD" else 1)
        packed = empty(dq_shape[:dim] + [3] + dq_shape[dim:])
        return packed.select(dim, 0), packed.select(dim, 1), packed.select(dim, 2)
    dq = empty(dq_shape)
    if group in ("HD_2HD", "HD_H2D"):
        dim = len(dk_shape) - (2 if group == "HD_2HD" else 1)
        packed = empty(dk_shape[:dim] + [2] + dk_shape[dim:])
        return dq, packed.select(dim, 0), packed.select(dim, 1)
    return dq, empty(dk_shape), empty(dv_shape)


def fused_attn_bwd(max_seqlen_q: int, max_seqlen_kv: int, attn_scale: float, p_dropout: float, set_zero: bool,
                   qkv_layout: Any, o_format: Any, do_format: Any, dqkv_layout: Any, qkv_scale_inv_format: Any,
                   do_scale_inv_format: Any, bias_type: Any, attn_mask_type: Any, softmax_type: Any,
                   window_size: Any, bottom_right_diagonal: bool, deterministic: bool, cu_seqlens_q: torch.Tensor,
                   cu_seqlens_kv: torch.Tensor, Q: Any, K: Any, V: Any, O: Any, dO: Any, fake_dtype: torch.dtype,
                   Aux_CTX_Tensors: list, cu_seqlens_q_padded: Any, cu_seqlens_kv_padded: Any, s_quantizer: Any,
                   dp_quantizer: Any, dqkv_quantizer: Any, cuda_graph: bool) -> list[Any]:
    q, k, v, o, do = (plain(t, f"fused attention's {what}")
                      for t, what in ((Q, "Q"), (K, "K"), (V, "V"), (O, "O"), (dO, "dO")))
    if dqkv_quantizer is not None:
        raise not_modelled(f"fused attention backward with quantized gradients ({type(dqkv_quantizer).__name__})")
    q_format, kv_format = layout_formats(qkv_layout)
    dq_format, dkv_format = layout_formats(dqkv_layout)
    b, sq, h_q, d_qk = _dims(tuple(q.shape), q_format)
    bk, skv, h_kv, _ = _dims(tuple(k.shape), kv_format)
    d_v = _dims(tuple(v.shape), kv_format)[3]
    dq, dk, dv = _gradients(_shape(b, sq, h_q, d_qk, dq_format), _shape(bk, skv, h_kv, d_qk, dkv_format),
                            _shape(bk, skv, h_kv, d_v, dkv_format), gradient_layout_group(dqkv_layout),
                            fake_dtype, q.device)
    if dq_format == "thd":
        dq.fill_(0)
    if dkv_format == "thd":
        dk.fill_(0)
        dv.fill_(0)
    dbias = None
    if _name(bias_type) not in ("NVTE_NO_BIAS", "NVTE_ALIBI"):
        shape = list(Aux_CTX_Tensors[-1].shape) if len(Aux_CTX_Tensors) >= 2 else [1, h_q, max_seqlen_q, max_seqlen_kv]
        dbias = torch.empty(shape, dtype=fake_dtype, device=q.device)
    dsoftmax_offset = None
    if _name(softmax_type) != "NVTE_VANILLA_SOFTMAX":
        dsoftmax_offset = torch.empty([1, h_q, 1, 1], dtype=torch.float32, device=q.device)
    batch, heads, seq_q, seq_kv, d_qk, d_v = _attention_dims(q, k, v, qkv_layout, cu_seqlens_q,
                                                              max_seqlen_q, max_seqlen_kv)
    # cuDNN's backward workspace: the fp32 dQ accumulator and the per-row softmax sums
    workspace = torch.empty(batch * heads * seq_q * (d_qk + 1) * 4, dtype=torch.uint8, device=q.device)
    stats = Aux_CTX_Tensors[0]
    causal = _name(attn_mask_type) in CAUSAL_MASKS
    nvte_ops.define_ops()
    torch.ops.nvte.fused_attn_bwd(q, k, v, o, do, stats, dq, dk, dv, dbias, workspace, batch, heads, seq_q, seq_kv,
                                  d_qk, d_v, causal, *_window(window_size))
    del workspace
    return [dq, dk, dv, dbias, dsoftmax_offset]
