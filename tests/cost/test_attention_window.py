"""Sliding-window attention in the fused-attention model (phantora/cost/attention.py): the kernels
visit only the key blocks a query block's window touches, and FLOPs count the cells inside it.
GPT-OSS (window 128 on every other layer, Megatron-Core through Transformer Engine), Mistral and
Gemma train with windows; before, every windowed layer was timed as full causal attention.

Hand counts, 4,096 tokens, causal, window (127, 0) (each row sees itself and the 127 keys before
it): cells = 1 + 2 + ... + 128 for the first 128 rows, then 128 per row: 8,256 + 3,968 x 128 =
516,160; key blocks of 128: the first query block sees its own block, each of the other 31 sees
its own and the one before: 63 block pairs (528 for full causal attention)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from phantora.cost.attention import AttentionShape, attention, flash_attn_3, with_window
from phantora.cost.roofline import CostContext
from phantora.cost.transformer_engine import fused_attn
from phantora.hardware import lookup_gpu
from phantora.ops import OpSignature

from .tensors import cuda_tensor

CTX = CostContext(lookup_gpu("h100-sxm-80gb"))
B, H, S, D = 1, 64, 4096, 64  # one GPT-OSS micro-batch: 64 query heads of 64 at sequence 4,096


def test_a_causal_window_counts_the_cells_and_blocks_it_touches() -> None:
    shape = AttentionShape(B, H, S, S, D, D, True, window_left=127, window_right=0)
    assert shape.windowed
    assert shape.forward_flops() == 2.0 * B * H * 516_160 * (D + D)
    assert shape.block_pairs() == 63
    assert shape.longest_block() == 2
    full = AttentionShape(B, H, S, S, D, D, True)
    assert full.block_pairs() == 528 and not full.windowed


def test_a_window_on_both_sides_of_a_full_mask() -> None:
    """Non-causal, window (2, 1) over 6 x 6: rows 0..5 see keys 0..1, 0..2, 0..3, 1..4, 2..5, 3..5: 20 cells."""
    shape = AttentionShape(1, 1, 6, 6, 8, 8, False, window_left=2, window_right=1)
    assert shape.forward_flops() == 2.0 * 20 * 16


def _te_signature(window: tuple[int, int], backward: bool = False) -> OpSignature:
    sbhd = cuda_tensor((S, B, H, D), "bfloat16")
    kv = cuda_tensor((S, B, 8, D), "bfloat16")
    stats = cuda_tensor((B, H, S, 1), "float32")
    dims = (B, H, S, S, D, D, True, *window)
    if not backward:
        return OpSignature("nvte::fused_attn_fwd", "default", (sbhd, kv, kv, None, sbhd, stats, *dims), ())
    ws = cuda_tensor((B * H * S * (D + 1) * 4,), "uint8")
    return OpSignature("nvte::fused_attn_bwd", "default",
                       (sbhd, kv, kv, sbhd, sbhd, stats, sbhd, kv, kv, None, ws, *dims), ())


@pytest.mark.parametrize("backward", [False, True])
def test_transformer_engine_s_windowed_attention_costs_the_window(backward: bool) -> None:
    """nvte::fused_attn_fwd / _bwd with GPT-OSS's window (127, 0) against the same call without one:
    FLOPs in the ratio of the cells (516,160 of 8,390,656), and much less time (63 of 528 block
    pairs; each query block's fixed cost stays)."""
    windowed = fused_attn(_te_signature((127, 0), backward), CTX)
    causal = fused_attn(_te_signature((-1, 0), backward), CTX)
    main = 1 if backward else 0
    assert windowed.kernels[main].flops / causal.kernels[main].flops == pytest.approx(516_160 / (S * (S + 1) / 2))
    assert windowed.kernels[main].duration_ns < 0.35 * causal.kernels[main].duration_ns


def _flash_fwd(window_left, window_right) -> OpSignature:
    q = cuda_tensor((B, S, H, D), "bfloat16")
    # (q, k, v, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p, is_causal, return_debug_mask, scale,
    #  window_size_left, window_size_right)
    return OpSignature("aten::_flash_attention_forward", "default",
                       (q, q, q, None, None, S, S, 0.0, True, False, None, window_left, window_right), ())


def test_aten_flash_attention_reads_its_window() -> None:
    windowed = attention(_flash_fwd(127, 0), CTX).kernels[0]
    causal = attention(_flash_fwd(None, None), CTX).kernels[0]
    assert windowed.flops == 2.0 * B * H * 516_160 * (D + D)
    assert causal.flops == 2.0 * B * H * S * (S + 1) / 2 * (D + D)
    assert windowed.duration_ns < 0.35 * causal.duration_ns


def test_flash_attention_3_reads_its_window() -> None:
    q = cuda_tensor((B, S, H, D), "bfloat16")
    args = [q, q, q] + [None] * 21 + [True, 127, 0]  # causal (24), window_left (25), window_right (26)
    out = cuda_tensor((B, S, H, D), "bfloat16")
    windowed = flash_attn_3(OpSignature("flash_attn_3::fwd", "default", tuple(args), (out,)), CTX).kernels[0]
    assert windowed.flops == 2.0 * B * H * 516_160 * (D + D)


@settings(max_examples=60, deadline=None)
@given(seq=st.integers(1, 3000), left=st.integers(0, 4000), causal=st.booleans())
def test_a_window_that_hides_nothing_costs_what_the_mask_alone_costs(seq: int, left: int, causal: bool) -> None:
    """A window at least as wide as the sequence leaves the mask's own cost; a narrower one never
    costs more, and widening a window never costs less."""
    plain = AttentionShape(2, 4, seq, seq, 64, 64, causal)
    call = dict(ctx=CTX, backend="cudnn", dtype="bfloat16", backward=False)
    from phantora.cost.attention import main_loop_ns

    def cost(shape: AttentionShape) -> tuple[float, float]:
        return main_loop_ns(shape, **call), shape.forward_flops()

    wide = with_window(plain, max(left, seq), -1 if causal else max(left, seq))
    assert cost(wide) == pytest.approx(cost(plain))
    narrow = with_window(plain, left, -1 if causal else left)
    wider = with_window(plain, left + 64, -1 if causal else left + 64)
    assert cost(narrow)[0] <= cost(plain)[0] * (1 + 1e-9) and cost(narrow)[1] <= cost(plain)[1] * (1 + 1e-9)
    assert cost(narrow)[0] <= cost(wider)[0] * (1 + 1e-9) and cost(narrow)[1] <= cost(wider)[1] * (1 + 1e-9)
