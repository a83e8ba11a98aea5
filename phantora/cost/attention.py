"""Fused attention: the SDPA ops of every backend, forward and backward.

Ops: _scaled_dot_product_{flash,efficient,cudnn}_attention(+_backward),
_scaled_dot_product_fused_attention_overrideable(+_backward), _flash_attention_forward/backward,
_efficient_attention_forward/backward, _cudnn_attention_forward/backward.

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
Not modelled: dropout inside the kernel (the signature carries dropout_p only as "<float>"),
attention bias reads beyond their bytes, sliding windows.
"""

from __future__ import annotations

from dataclasses import dataclass

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
# Prologue + epilogue of one query block (load Q, rescale, write O and the log-sum-exp) and the
# tail of unequal causal blocks, in units of (query block, key block) pairs.
BLOCK_OVERHEAD_PAIRS = 4.0
# Backward main loop sustains this fraction of the forward's matrix-product rate (more
# operands in flight, atomics on dQ).
BACKWARD_RATE_FACTOR = 0.7
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

    def block_pairs(self) -> int:
        """(query block, key block) pairs one (batch, head) computes."""
        n_q, n_kv = ceil_div(self.seq_q, BLOCK_Q), ceil_div(self.seq_kv, BLOCK_KV)
        return int(_causal_visible(n_q, n_kv)) if self.causal else n_q * n_kv

    def useful_pairs_fraction(self) -> float:
        """Fraction of the full S_q x S_kv score matrix that is computed (~0.5 when causal)."""
        if not self.causal:
            return 1.0
        return _causal_visible(self.seq_q, self.seq_kv) / (self.seq_q * self.seq_kv)

    def forward_flops(self) -> float:
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
    efficiency = gpu.attention_efficiency.get(backend, gpu.gemm_efficiency * 0.6)
    rate_per_sm = peak_flops(gpu, matmul_compute_type(dtype, True)) * efficiency / gpu.sm_count
    if backward:
        rate_per_sm *= BACKWARD_RATE_FACTOR
    matmuls = 2.5 if backward else 1.0  # backward: 5 products per pair vs 2
    exp_flops = BLOCK_Q * BLOCK_KV * gpu.exp_cost_flops * EXP_EXPOSED_FRACTION
    pair_ns = (_pair_flops(shape) * matmuls + exp_flops) / rate_per_sm * 1e9
    heads = shape.batch * shape.heads
    n_q = ceil_div(shape.seq_q, BLOCK_Q)
    blocks = heads * n_q
    total_pairs = heads * shape.block_pairs() + blocks * BLOCK_OVERHEAD_PAIRS
    # Work spread evenly over the SMs, but never faster than the longest block's own work.
    n_kv = ceil_div(shape.seq_kv, BLOCK_KV)
    longest_block = min(n_q, n_kv) if shape.causal else n_kv
    pairs_per_sm = max(total_pairs / gpu.sm_count, longest_block + BLOCK_OVERHEAD_PAIRS)
    return pairs_per_sm * pair_ns


# --- reading shapes from the different op schemas -------------------------------------------

def _bhsd(q: TensorMeta, k: TensorMeta, v: TensorMeta, causal: bool) -> AttentionShape:
    """q [B, H, S, D] (the _scaled_dot_product_* ops)."""
    return AttentionShape(q.shape[0], q.shape[1], q.shape[2], k.shape[2], q.shape[3], v.shape[3], causal)


def _bshd(q: TensorMeta, k: TensorMeta, v: TensorMeta, causal: bool, cum_seq_q, max_q, max_k) -> AttentionShape:
    """q [B, S, H, D] (the _flash_/_efficient_attention_* ops), or varlen q [total, H, D].

    Varlen (cumulative sequence offsets given): the lengths are data, so every sequence is
    taken to have the average length total / batch (bounded by max_q / max_k).
    """
    if isinstance(cum_seq_q, TensorMeta) and len(q.shape) == 3:
        batch = max(cum_seq_q.shape[0] - 1, 1)
        s_q = max(q.shape[0] // batch, 1)
        s_kv = max(k.shape[0] // batch, 1)
        if isinstance(max_q, int) and max_q > 0:
            s_q = min(s_q, max_q)
        if isinstance(max_k, int) and max_k > 0:
            s_kv = min(s_kv, max_k)
        return AttentionShape(batch, q.shape[1], s_q, s_kv, q.shape[2], v.shape[2], causal)
    return AttentionShape(q.shape[0], q.shape[2], q.shape[1], k.shape[1], q.shape[3], v.shape[3], causal)


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
    if n == "_flash_attention_forward":
        shape = _bshd(a[0], a[1], a[2], bool(_arg(sig, 8)), a[3], _arg(sig, 5), _arg(sig, 6))
        return AttentionCall("flash", shape, a[0].dtype, io, False)
    if n == "_flash_attention_forward_no_dropout_inplace":  # (out, q, k, v, ...): writes `out`
        shape = _bshd(a[1], a[2], a[3], bool(_arg(sig, 9)), a[4], _arg(sig, 6), _arg(sig, 7))
        return AttentionCall("flash", shape, a[1].dtype, io, False)
    if n == "_flash_attention_backward":
        shape = _bshd(a[1], a[2], a[3], bool(_arg(sig, 11)), a[6], _arg(sig, 8), _arg(sig, 9))
        return AttentionCall("flash", shape, a[1].dtype, io, True)
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
    call = parse_attention(sig)
    gpu = ctx.gpu
    shape = call.shape
    io_bytes = float(sum(footprint_bytes(t) for t in call.io_tensors))
    fwd_name, bwd_name = KERNEL_NAMES.get(call.backend, KERNEL_NAMES["flash"])
    # short sequences: reading q, k, v and writing o (and their gradients) bounds the kernel
    main_ns = max(main_loop_ns(shape, call.backend, ctx, call.dtype, call.backward) + gpu.kernel_ramp_ns,
                  memory_ns(io_bytes, gpu))
    if not call.backward:
        flops = shape.forward_flops()
        return OpCost((Kernel(fwd_name, main_ns, flops, io_bytes),))
    # Backward: rowsum(dO * O) first, then the main kernel, then dQ fp32 -> input dtype.
    q_elems = shape.batch * shape.heads * shape.seq_q
    o_bytes = q_elems * shape.head_dim_v * 2.0
    preprocess = streaming_kernel(f"{bwd_name.split('_')[0]}_bwd_dot_do_o_kernel", gpu, 2 * o_bytes + q_elems * 4)
    main = Kernel(bwd_name, main_ns, 2.5 * shape.forward_flops(), io_bytes)
    dq_elems = q_elems * shape.head_dim
    convert = streaming_kernel(f"{bwd_name.split('_')[0]}_bwd_convert_dq_kernel", gpu, dq_elems * 6.0)
    return OpCost((preprocess, main, convert))
