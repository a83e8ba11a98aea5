"""Fused attention: the SDPA ops of every backend, forward and backward.

Ops: _scaled_dot_product_{flash,efficient,cudnn}_attention(+_backward),
_scaled_dot_product_fused_attention_overrideable(+_backward), _flash_attention_forward/backward,
_efficient_attention_forward/backward, _cudnn_attention_forward/backward, and flex attention
(higher_order::flex_attention / flex_attention_backward, reported by interpose/ops/hops.py; see
"flex attention" below), and FlashAttention 3's flash_attn_3::fwd / bwd (the stand-in of
interpose/device/flash_attn3.py), timed exactly as aten's _flash_attention_forward / _backward
on the same shapes (see "FlashAttention 3" below).

Varlen calls (packed q [total, H, D] with cumulative sequence offsets): where the program's data
holds the offsets (OpSignature.data, e.g. offsets copied from the CPU; the flash ops only), each
sequence is costed at its own length and the work summed over sequences; where it does not, every
sequence is taken to have the average length total / number of sequences.

Time model, FlashAttention-style: each thread block owns a BLOCK_Q-row block of queries of one
(batch, head) and walks the BLOCK_KV-column blocks of keys it may see (all of them, or those on
and below the diagonal when causal, which halves the work). One (query block, key block) pair
costs its two matrix products (QK^T and PV) plus the softmax's exponentials, which run on the
special-function units (one costs GPUSpec.exp_cost_flops of tensor-core time: 256 on Hopper)
and are only partly hidden behind the matrix products. Every block also pays a fixed
prologue/epilogue (load Q, write O and the log-sum-exp). Backward redoes QK^T and adds dV,
dP, dQ, dK: 5 products per pair, plus a preprocessing kernel (rowsum(dO * O)) and a kernel
converting the fp32 dQ accumulator.

The matrix-product rate is the bf16 peak times GPUSpec.attention_efficiency[backend]; the
constants below are shared by all backends and GPUs (fitted on the H100, see below).

FLOPs reported follow torch.utils.flop_counter (2 products forward, 5 backward, recompute
included) except that causal masking halves them, as the kernels skip masked blocks.
Sliding windows (local attention: query row i sees keys i - left .. i + right, aligned to the
top-left diagonal; -1 leaves a side unbounded; a causal mask bounds the right side at 0): the
kernels visit only the key blocks a query block's window touches, so the work is those block pairs,
and FLOPs count the cells inside the window. Windows come from aten's flash ops
(window_size_left / _right), FlashAttention 3 and Transformer Engine's fused attention.
Not modelled: dropout inside the kernel (the signature carries dropout_p only as "<float>"),
attention bias reads beyond their bytes.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from phantora.cost.fitted import kernel_ns
from phantora.cost.roofline import (
    CostContext,
    Kernel,
    OpCost,
    ceil_div,
    footprint_bytes,
    matmul_compute_type,
    memory_ns,
    peak_flops,
    streaming_kernel,
)
from phantora.ops import OpSignature, TensorMeta

BLOCK_Q = 128
BLOCK_KV = 128
# Fraction of the softmax exponentials (each costing GPUSpec.exp_cost_flops of tensor-core
# time) that is not hidden behind the matrix products.
EXP_EXPOSED_FRACTION = 0.5
# Prologue + epilogue of one query block (load Q, rescale, write O and the log-sum-exp), in units
# of (query block, key block) pairs; and, where query blocks walk unequal rows (causal, or a
# block-sparse mask), the tail of the longest rows, which the even spread over the SMs misses.
# Fitted together at 4.0 to causal H100 timings (below); split by the sweeps' one large
# non-causal case, cuDNN 8x16x1024x128 forward (117.2 us on the H100, 117.3 on the H200), which
# the 4.0 put at +33%: a query block's own overhead is about one pair, the rest is the tail.
BLOCK_OVERHEAD_PAIRS = 1.0
RAGGED_TAIL_PAIRS = 3.0
# fp32 inputs (only the CUTLASS memory-efficient backend takes them) run on tensor cores as
# 3xTF32, whatever torch.backends.cuda.matmul.allow_tf32 says: torch's mem_eff_attention
# gemm_kernel_utils.h DefaultGemmType<ArchTag >= 80, float> is OpClassTensorOp with
# OpMultiplyAddFastF32, which splits each operand into a big and a small TF32 part and issues
# three TF32 MMAs per product (big*big + big*small + small*big) for fp32 accuracy.
FAST_F32_MMA_PASSES = 3
# Backward main loop sustains this fraction of the forward's matrix-product rate (more
# operands in flight, atomics on dQ). 0.7 from the H100 calibration below; 0.78 since 2026-11-30,
# fitted to the backward kernels (bprop, rowsum(dO * O), the dQ conversion) of the sweeps' seven
# cuDNN cases, H100 and H200 (median -0.1%; causal 8k head dim 128 +10.7 / +10.9%, the ViT-shaped
# 197 tokens -12.9%), which 0.7 put at a median +9.8%. Held out, the lent H200's Llama profiles'
# attention backward (GQA, tests/data/groundtruth/h200_vm/examples): 1B / 3B / 8B / 1B-8k
# +4.9 / +17.5 / +9.6 / -0.3% -> -4.4 / +7.1 / -0.0 / -10.0%.
BACKWARD_RATE_FACTOR = 0.78
# The three constants above and the H100 backend efficiencies were fitted together to causal
# bf16 H100 timings: the 8 calibration points (cuDNN, B x H x S x D = 1x32x4096x128,
# 2x32x8192x128, 16x12x512x64, 8x8x2048x64, forward and forward+backward) and torch.profiler
# kernel times (cuDNN, FA2 and CUTLASS at 4x16x2048x128 forward; FA2 at 8x16x1024x64 forward
# and backward; tests/data/groundtruth/h100_kernel_profile.json). All within 15% except the 16x12x512x64
# forward+backward calibration point (host-bound: autograd's own overhead is as long).

KERNEL_NAMES = {
    "flash": ("flash_fwd_kernel", "flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel"),
    "cudnn": ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob",
              "cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_f16_knob"),
    "efficient": ("fmha_cutlassF_bf16_aligned_64x64_rf_sm80",
                  "fmha_cutlassB_bf16_aligned_64x64_k128_sm80"),
}


@dataclass(frozen=True, slots=True)
class AttentionShape:
    batch: int
    heads: int  # query heads (GQA: key/value heads may be fewer; work follows query heads)
    seq_q: int
    seq_kv: int
    head_dim: int
    head_dim_v: int
    causal: bool
    # Block-sparse masks (flex attention): the fraction of (query block, key block) pairs the
    # kernel visits, and the most key blocks one query block visits. None: not block-sparse.
    block_fraction: float | None = None
    longest_row: int | None = None
    # Varlen with known offsets: (query length, key length) of each sequence; batch, seq_q and
    # seq_kv then hold their count and the longest lengths. Empty: batch sequences of seq_q x seq_kv.
    lengths: tuple[tuple[int, int], ...] = ()
    # Sliding window: query row i sees keys i - window_left .. i + window_right (-1: unbounded).
    window_left: int = -1
    window_right: int = -1

    def _pieces(self) -> list["AttentionShape"]:
        """One shape per sequence (varlen with known lengths), else [self]."""
        if not self.lengths:
            return [self]
        return [replace(self, batch=1, seq_q=q, seq_kv=k, lengths=())
                for q, k in self.lengths if q > 0 and k > 0]  # an empty sequence does no work

    @property
    def windowed(self) -> bool:
        """Whether a sliding window hides keys that the mask alone (causal or none) would show."""
        return self.window_left >= 0 or (self.window_right >= 0 and not self.causal)

    def _window_bounds(self) -> tuple[int, int]:
        """(left, right) reach of a query row in keys; unbounded sides as the key length."""
        left = self.window_left if self.window_left >= 0 else self.seq_kv
        right = 0 if self.causal else (self.window_right if self.window_right >= 0 else self.seq_kv)
        return left, right

    def _window_blocks(self) -> list[int]:
        """Key blocks each query block's window touches."""
        left, right = self._window_bounds()
        blocks = []
        for first in range(0, self.seq_q, BLOCK_Q):
            last = min(first + BLOCK_Q, self.seq_q) - 1
            lo, hi = max(0, first - left), min(self.seq_kv - 1, last + right)
            blocks.append(hi // BLOCK_KV - lo // BLOCK_KV + 1 if hi >= lo else 0)
        return blocks

    def _window_cells(self) -> float:
        """Cells of the S_q x S_kv score matrix inside the window."""
        left, right = self._window_bounds()
        rows = np.arange(self.seq_q, dtype=np.int64)
        seen = np.minimum(self.seq_kv - 1, rows + right) - np.maximum(0, rows - left) + 1
        return float(np.clip(seen, 0, None).sum())

    def total_block_pairs(self) -> int:
        """(query block, key block) pairs over every (sequence, head)."""
        return sum(p.batch * p.heads * p.block_pairs() for p in self._pieces())

    def query_blocks(self) -> int:
        """Query blocks over every (sequence, head): the thread blocks of the main kernel."""
        return sum(p.batch * p.heads * ceil_div(p.seq_q, BLOCK_Q) for p in self._pieces())

    def query_rows(self) -> int:
        """Query rows over every (sequence, head)."""
        return sum(p.batch * p.heads * p.seq_q for p in self._pieces())

    def block_pairs(self) -> int:
        """(query block, key block) pairs one (batch, head) computes."""
        n_q, n_kv = ceil_div(self.seq_q, BLOCK_Q), ceil_div(self.seq_kv, BLOCK_KV)
        if self.block_fraction is not None:
            return max(1, round(n_q * n_kv * self.block_fraction))
        if self.windowed:
            return sum(self._window_blocks())
        return int(_causal_visible(n_q, n_kv)) if self.causal else n_q * n_kv

    @property
    def ragged(self) -> bool:
        """Whether query blocks walk unequal numbers of key blocks (causal, block-sparse)."""
        return self.causal or (self.block_fraction is not None and self.block_fraction < 1.0)

    def overhead_pairs(self) -> float:
        """A query block's fixed cost, in block pairs (BLOCK_OVERHEAD_PAIRS, RAGGED_TAIL_PAIRS)."""
        return BLOCK_OVERHEAD_PAIRS + (RAGGED_TAIL_PAIRS if self.ragged else 0.0)

    def useful_pairs_fraction(self) -> float:
        """Fraction of the full S_q x S_kv score matrix that is computed (~0.5 when causal;
        block-sparse kernels compute whole blocks, masked cells included)."""
        if self.block_fraction is not None:
            return self.block_fraction
        if self.windowed:
            return self._window_cells() / (self.seq_q * self.seq_kv)
        if not self.causal:
            return 1.0
        return _causal_visible(self.seq_q, self.seq_kv) / (self.seq_q * self.seq_kv)

    def longest_block(self) -> int:
        """Key blocks the busiest query block walks."""
        if self.lengths:
            return max((p.longest_block() for p in self._pieces()), default=0)
        n_q, n_kv = ceil_div(self.seq_q, BLOCK_Q), ceil_div(self.seq_kv, BLOCK_KV)
        if self.longest_row is not None:
            return min(self.longest_row, n_kv)
        if self.windowed:
            return max(self._window_blocks(), default=0)
        return min(n_q, n_kv) if self.causal else n_kv

    def forward_flops(self) -> float:
        if self.lengths:
            return sum(p.forward_flops() for p in self._pieces())
        full = 2.0 * self.batch * self.heads * self.seq_q * self.seq_kv * (self.head_dim + self.head_dim_v)
        return full * self.useful_pairs_fraction()


def _causal_visible(rows: int, cols: int) -> float:
    """Cells of a rows x cols grid on or below the top-left aligned diagonal (torch's is_causal:
    row i sees columns 0..i): the sum over rows of min(cols, i + 1)."""
    if rows <= cols:
        return rows * (rows + 1) / 2
    return cols * (cols + 1) / 2 + (rows - cols) * cols


def _pair_flops(shape: AttentionShape) -> float:
    return 2.0 * BLOCK_Q * BLOCK_KV * (shape.head_dim + shape.head_dim_v)


def main_loop_ns(shape: AttentionShape, backend: str, ctx: CostContext, dtype: str, backward: bool) -> float:
    """Time of the main attention kernel: block pairs spread over the SMs, in waves."""
    gpu = ctx.gpu
    efficiency = _efficiency(gpu, backend, backward)
    rate_per_sm = peak_flops(gpu, matmul_compute_type(dtype, True)) * efficiency / gpu.sm_count
    if dtype == "float32":
        rate_per_sm /= FAST_F32_MMA_PASSES
    if backward:
        rate_per_sm *= BACKWARD_RATE_FACTOR
    matmuls = 2.5 if backward else 1.0  # backward: 5 products per pair vs 2
    exp_flops = BLOCK_Q * BLOCK_KV * gpu.exp_cost_flops * EXP_EXPOSED_FRACTION
    pair_ns = (_pair_flops(shape) * matmuls + exp_flops) / rate_per_sm * 1e9
    overhead = shape.overhead_pairs()
    total_pairs = shape.total_block_pairs() + shape.query_blocks() * overhead
    # Work spread evenly over the SMs, but never faster than the longest block's own work.
    pairs_per_sm = max(total_pairs / gpu.sm_count, shape.longest_block() + overhead)
    return pairs_per_sm * pair_ns


# --- reading shapes from the different op schemas -------------------------------------------

def _bhsd(q: TensorMeta, k: TensorMeta, v: TensorMeta, causal: bool) -> AttentionShape:
    """q [B, H, S, D] (the _scaled_dot_product_* ops)."""
    return AttentionShape(q.shape[0], q.shape[1], q.shape[2], k.shape[2], q.shape[3], v.shape[3], causal)


def _bshd(q: TensorMeta, k: TensorMeta, v: TensorMeta, causal: bool, cum_seq_q, max_q, max_k,
          offsets: tuple[tuple[int, ...] | None, tuple[int, ...] | None] = (None, None)) -> AttentionShape:
    """q [B, S, H, D] (the _flash_/_efficient_attention_* ops), or varlen q [total, H, D].

    Varlen (cumulative sequence offsets given): with the offsets' values (`offsets`, for q and
    k, from OpSignature.data) each sequence has its own length; without them every sequence is
    taken to have the average length total / batch (bounded by max_q / max_k).
    """
    if isinstance(cum_seq_q, TensorMeta) and len(q.shape) == 3:
        lengths = _varlen_lengths(offsets, q.shape[0], k.shape[0])
        if lengths:
            return AttentionShape(len(lengths), q.shape[1], max(lq for lq, _ in lengths),
                                  max(lk for _, lk in lengths), q.shape[2], v.shape[2], causal, lengths=lengths)
        batch = max(cum_seq_q.shape[0] - 1, 1)
        s_q = max(q.shape[0] // batch, 1)
        s_kv = max(k.shape[0] // batch, 1)
        if isinstance(max_q, int) and max_q > 0:
            s_q = min(s_q, max_q)
        if isinstance(max_k, int) and max_k > 0:
            s_kv = min(s_kv, max_k)
        return AttentionShape(batch, q.shape[1], s_q, s_kv, q.shape[2], v.shape[2], causal)
    return AttentionShape(q.shape[0], q.shape[2], q.shape[1], k.shape[1], q.shape[3], v.shape[3], causal)


def with_window(shape: AttentionShape, left, right) -> AttentionShape:
    """`shape` with a sliding window (left, right); None or a negative side is unbounded."""
    left = left if isinstance(left, int) and left >= 0 else -1
    right = right if isinstance(right, int) and right >= 0 else -1
    if (left, right) == (shape.window_left, shape.window_right):
        return shape
    return replace(shape, window_left=left, window_right=right)


def _varlen_lengths(offsets: tuple[tuple[int, ...] | None, tuple[int, ...] | None], total_q: int,
                    total_k: int) -> tuple[tuple[int, int], ...]:
    """(query, key) length of each sequence from the cumulative offsets' values; () when they are
    unknown or do not describe the packed tensors: offsets start at 0, never decrease and end at
    the packed total (a tensor whose values phantora does not know reads as one value in every
    element, which never does)."""
    cq, ck = offsets
    if ck is None and total_k == total_q:
        ck = cq  # self-attention: the key offsets are the query offsets' tensor
    if cq is None or ck is None or len(cq) != len(ck) or len(cq) < 2:
        return ()
    lq = [b - a for a, b in zip(cq, cq[1:])]
    lk = [b - a for a, b in zip(ck, ck[1:])]
    if cq[0] != 0 or ck[0] != 0 or cq[-1] != total_q or ck[-1] != total_k or min(lq) < 0 or min(lk) < 0:
        return ()
    return tuple(zip(lq, lk))


def _offsets(sig: OpSignature, q_name: str, k_name: str) -> tuple[tuple[int, ...] | None, tuple[int, ...] | None]:
    return sig.data_of(q_name), sig.data_of(k_name)


@dataclass(frozen=True, slots=True)
class AttentionCall:
    backend: str
    shape: AttentionShape
    dtype: str
    io_tensors: tuple[TensorMeta, ...]  # what the kernels read and write besides the scores
    backward: bool


def _arg(sig: OpSignature, i: int):
    return sig.args[i] if i < len(sig.args) else None


def parse_attention(sig: OpSignature) -> AttentionCall:
    """Backend, shape and causality of any SDPA op, from its schema's argument positions."""
    n = sig.short_name
    a = sig.args
    outs = tuple(sig.tensors_out())
    tensors_in = tuple(t for t in a if isinstance(t, TensorMeta))
    io = tensors_in + outs
    if n == "_scaled_dot_product_flash_attention":
        causal = bool(_arg(sig, 7)) if sig.overload == "quantized" else bool(_arg(sig, 4))
        return AttentionCall("flash", _bhsd(a[0], a[1], a[2], causal), a[0].dtype, io, False)
    if n == "_scaled_dot_product_flash_attention_backward":
        return AttentionCall("flash", _bhsd(a[1], a[2], a[3], bool(_arg(sig, 11))), a[1].dtype, io, True)
    if n == "_scaled_dot_product_efficient_attention":
        return AttentionCall("efficient", _bhsd(a[0], a[1], a[2], bool(_arg(sig, 6))), a[0].dtype, io, False)
    if n == "_scaled_dot_product_efficient_attention_backward":
        return AttentionCall("efficient", _bhsd(a[1], a[2], a[3], bool(_arg(sig, 11))), a[1].dtype, io, True)
    if n == "_scaled_dot_product_cudnn_attention":
        return AttentionCall("cudnn", _bhsd(a[0], a[1], a[2], bool(_arg(sig, 6))), a[0].dtype, io, False)
    if n == "_scaled_dot_product_cudnn_attention_backward":
        return AttentionCall("cudnn", _bhsd(a[1], a[2], a[3], bool(_arg(sig, 14))), a[1].dtype, io, True)
    if n == "_scaled_dot_product_fused_attention_overrideable":
        return AttentionCall("flash", _bhsd(a[0], a[1], a[2], bool(_arg(sig, 5))), a[0].dtype, io, False)
    if n == "_scaled_dot_product_fused_attention_overrideable_backward":
        return AttentionCall("flash", _bhsd(a[1], a[2], a[3], bool(_arg(sig, 13))), a[1].dtype, io, True)
    cum = _offsets(sig, "cum_seq_q", "cum_seq_k")
    # the flash ops' keyword-only window_size_left / _right follow `scale`
    if n == "_flash_attention_forward":
        shape = _bshd(a[0], a[1], a[2], bool(_arg(sig, 8)), a[3], _arg(sig, 5), _arg(sig, 6), cum)
        return AttentionCall("flash", with_window(shape, _arg(sig, 11), _arg(sig, 12)), a[0].dtype, io, False)
    if n == "_flash_attention_forward_no_dropout_inplace":  # (out, q, k, v, ...): writes `out`
        shape = _bshd(a[1], a[2], a[3], bool(_arg(sig, 9)), a[4], _arg(sig, 6), _arg(sig, 7), cum)
        return AttentionCall("flash", with_window(shape, _arg(sig, 12), _arg(sig, 13)), a[1].dtype, io, False)
    if n == "_flash_attention_backward":
        shape = _bshd(a[1], a[2], a[3], bool(_arg(sig, 11)), a[6], _arg(sig, 8), _arg(sig, 9), cum)
        return AttentionCall("flash", with_window(shape, _arg(sig, 15), _arg(sig, 16)), a[1].dtype, io, True)
    if n == "_efficient_attention_forward":
        causal = _arg(sig, 9) in (1, 2)  # custom_mask_type: 1 top-left, 2 bottom-right causal
        shape = _bshd(a[0], a[1], a[2], causal, a[4], _arg(sig, 6), _arg(sig, 7))
        return AttentionCall("efficient", shape, a[0].dtype, io, False)
    if n == "_efficient_attention_backward":
        causal = _arg(sig, 14) in (1, 2)
        shape = _bshd(a[1], a[2], a[3], causal, a[6], _arg(sig, 8), _arg(sig, 9))
        return AttentionCall("efficient", shape, a[1].dtype, io, True)
    if n == "_cudnn_attention_forward":
        causal = bool(_arg(sig, 10))
        if isinstance(a[4], TensorMeta) and len(a[0].shape) == 3:
            shape = _bshd(a[0], a[1], a[2], causal, a[4], _arg(sig, 6), _arg(sig, 7))
        else:
            shape = _bhsd(a[0], a[1], a[2], causal)
        return AttentionCall("cudnn", shape, a[0].dtype, io, False)
    if n == "_cudnn_attention_backward":
        causal = bool(_arg(sig, 14))
        if isinstance(a[9], TensorMeta) and len(a[1].shape) == 3:
            shape = _bshd(a[1], a[2], a[3], causal, a[9], _arg(sig, 11), _arg(sig, 12))
        else:
            shape = _bhsd(a[1], a[2], a[3], causal)
        return AttentionCall("cudnn", shape, a[1].dtype, io, True)
    raise KeyError(f"not an attention op: {sig.full_name}")


def attention(sig: OpSignature, ctx: CostContext) -> OpCost:
    return backend_attention_cost(parse_attention(sig), ctx)


def backend_attention_cost(call: AttentionCall, ctx: CostContext) -> OpCost:
    """The kernels of `call.backend` ("flash", "cudnn", "efficient") for one fused attention call."""
    fwd_name, bwd_name = KERNEL_NAMES.get(call.backend, KERNEL_NAMES["flash"])
    prefix = bwd_name.split("_")[0]
    return _fused_attention_cost(call, ctx, fwd_name,
                                 (f"{prefix}_bwd_dot_do_o_kernel", bwd_name, f"{prefix}_bwd_convert_dq_kernel"))


def _fused_attention_cost(call: AttentionCall, ctx: CostContext, fwd_name: str,
                          bwd_names: tuple[str, str, str]) -> OpCost:
    gpu = ctx.gpu
    shape = call.shape
    io_bytes = float(sum(footprint_bytes(t) for t in call.io_tensors))
    # short sequences: reading q, k, v and writing o (and their gradients) bounds the kernel
    main_ns = max(main_loop_ns(shape, call.backend, ctx, call.dtype, call.backward) + gpu.kernel_ramp_ns,
                  memory_ns(io_bytes, gpu))
    if not call.backward:
        flops = shape.forward_flops()
        return OpCost((Kernel(fwd_name, main_ns, flops, io_bytes),))
    # Backward: rowsum(dO * O) first, then the main kernel, then dQ fp32 -> input dtype.
    q_elems = shape.query_rows()
    o_bytes = q_elems * shape.head_dim_v * 2.0
    preprocess = streaming_kernel(bwd_names[0], gpu, 2 * o_bytes + q_elems * 4)
    if call.backend == "cudnn":  # cuDNN's own kernel: about half the streaming rate (H100 sweep, sweep_fit.py)
        nbytes = 2 * o_bytes + q_elems * 4
        preprocess = Kernel(bwd_names[0], kernel_ns("cudnn_dot_do_o", nbytes, 1, gpu), 0.0, nbytes)
    main = Kernel(bwd_names[1], main_ns, 2.5 * shape.forward_flops(), io_bytes)
    dq_elems = q_elems * shape.head_dim
    convert = streaming_kernel(bwd_names[2], gpu, dq_elems * 6.0)
    return OpCost((preprocess, main, convert))


# --- FlashAttention 3 (flash_attn_3::fwd / bwd) -----------------------------------------------
#
# The ops of the FA3 stand-in (interpose/device/flash_attn3.py; FA3's own schemas, from
# Dao-AILab/flash-attention hopper/flash_api.cpp) are timed exactly as aten's
# _flash_attention_forward / _flash_attention_backward on the same shapes: the same main-loop
# model at the GPU's "flash" efficiency, the same io tensors (q, k, v, the offsets, out and
# softmax_lse; backward dout, q, k, v, out, softmax_lse, the offsets and dq, dk, dv, not the
# workspaces FA3 allocates), the same varlen rule. Only the kernel names are FA3's. FA3 is faster
# than FA2 on Hopper (its paper reports 1.5-2x in bf16), so this is an upper bound on its time
# until FA3 has measurements of its own. Not modelled: paged KV (page_table), appended KV
# (k_new), fp8 descaling and softcap. Sliding windows are modelled as for aten's flash ops.
FA3_FORWARD_KERNEL = "flash::FlashAttnFwdSm90"
FA3_BACKWARD_KERNELS = ("flash::FlashAttnBwdPreprocess", "flash::FlashAttnBwdSm90",
                        "flash::FlashAttnBwdPostprocessConvertdQ")
# Argument positions in the flash_attn_3 schemas.
_FA3_FWD = {"q": 0, "k": 1, "v": 2, "page_table": 14, "cu_q": 7, "cu_k": 8, "max_q": 12, "max_k": 13,
            "causal": 24, "window_left": 25, "window_right": 26}
_FA3_BWD = {"dout": 0, "q": 1, "k": 2, "v": 3, "out": 4, "lse": 5, "dq": 6, "dk": 7, "dv": 8, "cu_q": 9,
            "cu_k": 10, "max_q": 13, "max_k": 14, "causal": 16, "window_left": 17, "window_right": 18}


def parse_flash_attn_3(sig: OpSignature) -> AttentionCall:
    backward = sig.name == "flash_attn_3::bwd"
    pos = _FA3_BWD if backward else _FA3_FWD
    if sig.name not in ("flash_attn_3::fwd", "flash_attn_3::bwd"):
        raise KeyError(f"not a FlashAttention 3 op: {sig.full_name}")
    if not backward and _arg(sig, pos["page_table"]) is not None:
        raise ValueError("paged KV (page_table) is not modelled")

    def arg(name: str):
        return _arg(sig, pos[name])

    q, k, v = arg("q"), arg("k"), arg("v")
    # FA3 reads is_causal=False with window (-1, 0) as causal too (flash_api.cpp)
    left, right = arg("window_left"), arg("window_right")
    causal = bool(arg("causal")) or (isinstance(left, int) and left < 0 and right == 0)
    cu_q, cu_k = arg("cu_q"), arg("cu_k")
    shape = with_window(_bshd(q, k, v, causal, cu_q, arg("max_q"), arg("max_k"),
                              _offsets(sig, "cu_seqlens_q", "cu_seqlens_k")), left, right)
    offsets = tuple(t for t in (cu_q, cu_k) if isinstance(t, TensorMeta))
    outs = sig.tensors_out()
    if backward:
        dout, out, lse = arg("dout"), arg("out"), arg("lse")
        grads = tuple(t for t in outs[:3])
        io = (dout, q, k, v, out, lse, *offsets, *grads)
    else:
        io = (q, k, v, *offsets, *outs[:2])
    return AttentionCall("flash", shape, q.dtype, tuple(t for t in io if isinstance(t, TensorMeta)), backward)


def flash_attn_3(sig: OpSignature, ctx: CostContext) -> OpCost:
    """flash_attn_3::fwd / bwd, timed as aten's flash attention on the same shapes."""
    return _fused_attention_cost(parse_flash_attn_3(sig), ctx, FA3_FORWARD_KERNEL, FA3_BACKWARD_KERNELS)


def _efficiency(gpu, backend: str, backward: bool) -> float:
    """Fraction of the bf16 peak the main loop sustains on this GPU for this backend."""
    if backend == "flex":
        flash = gpu.attention_efficiency.get("flash", gpu.gemm_efficiency * 0.6)
        return flash * (FLEX_VS_FLASH_BACKWARD if backward else FLEX_VS_FLASH_FORWARD)
    return gpu.attention_efficiency.get(backend, gpu.gemm_efficiency * 0.6)


# --- flex attention (torch.ops.higher_order.flex_attention and its backward) -----------------
#
# The fused kernel torch.compile generates for flex_attention (an Inductor Triton template,
# FlashAttention-2's algorithm with the score_mod / mask_mod inlined) walks, for each query block,
# only the key blocks its BlockMask lists: partial blocks (mask_mod applied per cell) and full
# blocks, so its work is the visited fraction of the block grid (interpose/ops/hops.py sends the count
# of visited blocks, summed over the mask's batch, head and query-block dims, and the longest
# row; None when the mask's values are unknown, and then every block is taken as visited, an
# upper bound). FLOPs follow: 2 products forward, 5 backward, over the visited blocks' cells
# (masked cells of partial blocks included: the kernel computes them).
# Rate: the FlexAttention authors measured 90% of FlashAttention-2's throughput forward and 85%
# backward (PyTorch blog "FlexAttention", Aug 2024); FLEX_VS_FLASH_* scale the GPU's "flash"
# efficiency by that. Backward is one kernel here: the rowsum(dO * O) preprocessing (a separate
# small kernel in compiled code) is folded into its time. Not modelled: the score_mod's own
# arithmetic (a few FLOPs per cell, hidden behind the products for the usual mods).
FLEX_VS_FLASH_FORWARD = 0.90
FLEX_VS_FLASH_BACKWARD = 0.85
FLEX_KERNEL_NAMES = ("triton_tem_flex_attention", "triton_tem_flex_attention_backward")
# Where the BlockMask tuple sits among each HOP's arguments (torch 2.13 and 2.14 agree).
FLEX_BLOCK_MASK_ARG = {"flex_attention": 4, "flex_attention_backward": 9}
# In BlockMask.as_tuple(): (q_len, kv_len, kv_num_blocks, ..., Q_BLOCK_SIZE, KV_BLOCK_SIZE, mask_mod)
_MASK_KV_LEN, _MASK_KV_NUM_BLOCKS, _MASK_KV_BLOCK_FROM_END = 1, 2, 2


@dataclass(frozen=True, slots=True)
class FlexCall:
    shape: AttentionShape
    dtype: str
    io_tensors: tuple[TensorMeta, ...]
    backward: bool
    mask_known: bool


def _flex_sparsity(mask: tuple, visited) -> tuple[float | None, int | None]:
    """(visited fraction of the mask's block grid, longest row in cost-model blocks)."""
    if not isinstance(visited, (tuple, list)) or len(visited) != 2:
        return None, None
    counts = mask[_MASK_KV_NUM_BLOCKS]
    kv_len, kv_block = mask[_MASK_KV_LEN], mask[-_MASK_KV_BLOCK_FROM_END]
    if not isinstance(counts, TensorMeta) or not isinstance(kv_len, int) or not isinstance(kv_block, int):
        return None, None
    grid = counts.numel * ceil_div(kv_len, kv_block)
    if grid <= 0:
        return None, None
    total, longest = visited
    return min(1.0, total / grid), ceil_div(longest * kv_block, BLOCK_KV)


def parse_flex_attention(sig: OpSignature) -> FlexCall:
    backward = sig.short_name == "flex_attention_backward"
    q, k, v = sig.args[0], sig.args[1], sig.args[2]
    mask = sig.args[FLEX_BLOCK_MASK_ARG[sig.short_name]]
    fraction, longest = _flex_sparsity(mask, sig.args[-1]) if isinstance(mask, tuple) else (None, None)
    shape = AttentionShape(q.shape[0], q.shape[1], q.shape[2], k.shape[2], q.shape[3], v.shape[3], False,
                           block_fraction=1.0 if fraction is None else fraction, longest_row=longest)
    dense_args = sig.args[: 7 if backward else 3]  # q, k, v (+ out, lse, grad_out, grad_lse)
    io = tuple(t for t in dense_args if isinstance(t, TensorMeta)) + tuple(sig.tensors_out())
    return FlexCall(shape, q.dtype, io, backward, fraction is not None)


def flex_attention(sig: OpSignature, ctx: CostContext) -> OpCost:
    call = parse_flex_attention(sig)
    gpu, shape = ctx.gpu, call.shape
    io_bytes = float(sum(footprint_bytes(t) for t in call.io_tensors))
    main_ns = max(main_loop_ns(shape, "flex", ctx, call.dtype, call.backward) + gpu.kernel_ramp_ns,
                  memory_ns(io_bytes, gpu))
    if not call.backward:
        return OpCost((Kernel(FLEX_KERNEL_NAMES[0], main_ns, shape.forward_flops(), io_bytes),))
    q_elems = shape.batch * shape.heads * shape.seq_q
    delta_bytes = q_elems * shape.head_dim_v * 2.0 * 2 + q_elems * 4  # read dO and O, write delta
    delta_ns = memory_ns(delta_bytes, gpu) - gpu.kernel_ramp_ns
    return OpCost((Kernel(FLEX_KERNEL_NAMES[1], main_ns + delta_ns, 2.5 * shape.forward_flops(),
                          io_bytes + delta_bytes),))


def flex_template_kernel(name: str, q: TensorMeta, k: TensorMeta, v: TensorMeta, counts: TensorMeta | None,
                         kv_block: int, visited: tuple[int, int] | None, io_bytes: float, backward: bool,
                         ctx: CostContext) -> Kernel:
    """The flex-attention Triton template of compiled code (interpose/compile/compiled_kernels.py): the
    eager model's main loop over the blocks its BlockMask visits. Compiled backward runs the
    rowsum(dO * O) preprocessing as a kernel of its own (reported and timed apart), so it is not
    folded in here."""
    fraction, longest = None, None
    if visited is not None and counts is not None and kv_block > 0:
        grid = counts.numel * ceil_div(k.shape[2], kv_block)
        if grid > 0:
            fraction = min(1.0, visited[0] / grid)
            longest = ceil_div(visited[1] * kv_block, BLOCK_KV)
    shape = AttentionShape(q.shape[0], q.shape[1], q.shape[2], k.shape[2], q.shape[3], v.shape[3], False,
                           block_fraction=1.0 if fraction is None else fraction, longest_row=longest)
    main_ns = max(main_loop_ns(shape, "flex", ctx, q.dtype, backward) + ctx.gpu.kernel_ramp_ns,
                  memory_ns(io_bytes, ctx.gpu))
    flops = shape.forward_flops() * (2.5 if backward else 1.0)
    return Kernel(name, main_ns, flops, io_bytes)
