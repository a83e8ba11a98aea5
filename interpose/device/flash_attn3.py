"""FlashAttention 3 on a virtual GPU: a stand-in for the `flash_attn_interface` module.

FlashAttention 3 (Dao-AILab/flash-attention, hopper/) is a package of Hopper CUDA kernels that a
GPU user builds from source. torch's `activate_flash_attention_impl("FA3")`
(torch/nn/attention/_fa3.py) imports `flash_attn_interface`, requires the ops
`torch.ops.flash_attn_3.fwd` and `.bwd` it registers, and then implements aten's flash attention
ops for CUDA with them (`_flash_attention_forward` / `_backward`, varlen included,
`_scaled_dot_product_flash_attention` (+ `_backward`), `_flash_attention_forward_no_dropout_inplace`).
TorchTitan's VarlenAttention does this on every SM 9.0 GPU, so on the default virtual H100.

Under phantora, `import flash_attn_interface` (and `flash_attn_3._C`, the extension it loads)
always gives this stand-in, whether FA3 is installed or not: its CUDA kernels cannot run on
tensors that hold no data, and its ops have no fake kernels, so the real package could not run
here either way (as a CUDA extension is never compiled, interpose/device/cuda_extensions.py).
The stand-in

  * defines `flash_attn_3::fwd` and `flash_attn_3::bwd` with FA3's own schemas
    (hopper/flash_api.cpp) and fake kernels that return what FA3 returns and allocates (out,
    softmax_lse, split accumulators; backward's softmax_d, softmax_lse_log2 and fp32 dq / dk / dv
    accumulators, so the memory model sees FA3's workspaces). The observer reports them like any
    op, and phantora/cost/attention.py (`flash_attn_3`, QUALIFIED_FAMILIES) times them exactly as
    aten's flash attention forward / backward on the same shapes;
  * offers FA3's Python API for programs that call it directly: `flash_attn_func` and
    `flash_attn_varlen_func` (autograd functions over the two ops, as FA3's own are); the rest of
    its API (`flash_attn_with_kvcache`, `flash_attn_qkvpacked_func`, `flash_attn_combine`,
    `get_scheduler_metadata`) raises NotImplementedError when called;
  * once FA3 is activated, makes the observer run torch's FA3 implementations of the aten flash
    ops (the Python kernels _fa3.py registers for the CUDA key, which the dispatch modes would
    otherwise answer with aten's meta kernels), with the observer active inside, as a GPU runs
    them: each aten flash op becomes FA3's `fwd` / `bwd` plus the small ops torch's wrapper runs.
"""

from __future__ import annotations

import types
from typing import Any, Callable

import torch

from interpose.device.stand_in import install_stand_ins
NAMESPACE = "flash_attn_3"
MODULES = ("flash_attn_interface", "flash_attn_3._C")

# FA3's schemas, as hopper/flash_api.cpp registers them (TORCH_LIBRARY(flash_attn_3, m)).
FWD_SCHEMA = (
    "fwd(Tensor q, Tensor k, Tensor v, Tensor(k_new!)? k_new=None, Tensor(v_new!)? v_new=None, "
    "Tensor? q_v=None, Tensor(out!)? out=None, Tensor? cu_seqlens_q=None, Tensor? cu_seqlens_k=None, "
    "Tensor? cu_seqlens_k_new=None, Tensor? seqused_q=None, Tensor? seqused_k=None, int? max_seqlen_q=None, "
    "int? max_seqlen_k=None, Tensor? page_table=None, Tensor? kv_batch_idx=None, Tensor? leftpad_k=None, "
    "Tensor? rotary_cos=None, Tensor? rotary_sin=None, Tensor? seqlens_rotary=None, Tensor? q_descale=None, "
    "Tensor? k_descale=None, Tensor? v_descale=None, float? softmax_scale=None, bool is_causal=False, "
    "int window_size_left=-1, int window_size_right=-1, int attention_chunk=0, float softcap=0.0, "
    "bool is_rotary_interleaved=False, Tensor? scheduler_metadata=None, int num_splits=0, bool? pack_gqa=None, "
    "int sm_margin=0) -> (Tensor(out!), Tensor, Tensor, Tensor)")
BWD_SCHEMA = (
    "bwd(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor softmax_lse, Tensor(dq!)? dq=None, "
    "Tensor(dk!)? dk=None, Tensor(dv!)? dv=None, Tensor? cu_seqlens_q=None, Tensor? cu_seqlens_k=None, "
    "Tensor? seqused_q=None, Tensor? seqused_k=None, int? max_seqlen_q=None, int? max_seqlen_k=None, "
    "float? softmax_scale=None, bool is_causal=False, int window_size_left=-1, int window_size_right=-1, "
    "float softcap=0.0, bool deterministic=False, int sm_margin=0) "
    "-> (Tensor(dq!), Tensor(dk!), Tensor(dv!), Tensor, Tensor, Tensor, Tensor, Tensor)")

_lib: Any = None  # the torch.library.Library defining the ops, made at first import


def _round_up(x: int, m: int) -> int:
    return (x + m - 1) // m * m


def _head_dim_rounded(d: int) -> int:
    """FA3's round_up_headdim: the head dimensions it instantiates kernels for."""
    for size in (64, 96, 128, 192, 256):
        if d <= size:
            return size
    return 256


def _bwd_blocks(head_dim_rounded: int, causal_or_local: bool) -> tuple[int, int]:
    """(kBlockM, kBlockN) of FA3's SM90 backward kernel (mha_bwd), which size its workspaces."""
    if head_dim_rounded <= 64:
        block_m = 128
    elif head_dim_rounded <= 96:
        block_m = 64
    elif head_dim_rounded <= 128:
        block_m = 64 if causal_or_local else 80
    else:
        block_m = 64
    block_n = 128 if head_dim_rounded <= 128 else (96 if head_dim_rounded <= 192 else 80)
    return block_m, block_n


def _fwd_fake(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_new: Any = None, v_new: Any = None,
              q_v: Any = None, out: torch.Tensor | None = None, cu_seqlens_q: torch.Tensor | None = None,
              cu_seqlens_k: Any = None, cu_seqlens_k_new: Any = None, seqused_q: Any = None, seqused_k: Any = None,
              max_seqlen_q: int | None = None, max_seqlen_k: int | None = None, page_table: Any = None,
              kv_batch_idx: Any = None, leftpad_k: Any = None, rotary_cos: Any = None, rotary_sin: Any = None,
              seqlens_rotary: Any = None, q_descale: Any = None, k_descale: Any = None, v_descale: Any = None,
              softmax_scale: float | None = None, is_causal: bool = False, window_size_left: int = -1,
              window_size_right: int = -1, attention_chunk: int = 0, softcap: float = 0.0,
              is_rotary_interleaved: bool = False, scheduler_metadata: Any = None, num_splits: int = 0,
              pack_gqa: Any = None, sm_margin: int = 0) -> tuple[torch.Tensor, ...]:
    """What mha_fwd returns: out (written in place when given), softmax_lse (fp32; [H, total_q]
    varlen, [B, H, S] dense) and the split-KV accumulators (empty: one split, which FA3's
    heuristic picks for training-sized problems)."""
    varlen = cu_seqlens_q is not None
    head_dim_v = v.shape[-1]
    out_dtype = torch.bfloat16 if q.dtype == torch.float8_e4m3fn else q.dtype
    if out is None:
        out = q.new_empty((*q.shape[:-1], head_dim_v), dtype=out_dtype)
    if varlen:
        total_q, heads = q.shape[0], q.shape[1]
        lse = q.new_empty((heads, total_q), dtype=torch.float32)
    else:
        batch, seq_q, heads = q.shape[0], q.shape[1], q.shape[2]
        lse = q.new_empty((batch, heads, seq_q), dtype=torch.float32)
    if num_splits > 1:
        rows = lse.shape
        out_accum = q.new_empty((num_splits, *rows, head_dim_v), dtype=torch.float32)
        lse_accum = q.new_empty((num_splits, *rows), dtype=torch.float32)
    else:
        out_accum = q.new_empty((0,), dtype=torch.float32)
        lse_accum = q.new_empty((0,), dtype=torch.float32)
    return out, lse, out_accum, lse_accum


def _bwd_fake(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
              softmax_lse: torch.Tensor, dq: torch.Tensor | None = None, dk: torch.Tensor | None = None,
              dv: torch.Tensor | None = None, cu_seqlens_q: torch.Tensor | None = None,
              cu_seqlens_k: torch.Tensor | None = None, seqused_q: Any = None, seqused_k: Any = None,
              max_seqlen_q: int | None = None, max_seqlen_k: int | None = None,
              softmax_scale: float | None = None, is_causal: bool = False, window_size_left: int = -1,
              window_size_right: int = -1, softcap: float = 0.0, deterministic: bool = False,
              sm_margin: int = 0) -> tuple[torch.Tensor, ...]:
    """What mha_bwd returns: dq, dk, dv (written in place when given), softmax_d,
    softmax_lse_log2, and the fp32 accumulators dq_accum (always) and dk_accum / dv_accum (GQA
    only; empty otherwise), with mha_bwd's padded shapes."""
    dq = torch.empty_like(q) if dq is None else dq
    dk = torch.empty_like(k) if dk is None else dk
    dv = torch.empty_like(v) if dv is None else dv
    varlen_q, varlen_k = cu_seqlens_q is not None, cu_seqlens_k is not None
    varlen = varlen_q or varlen_k or seqused_q is not None or seqused_k is not None
    heads, heads_k = q.shape[-2], k.shape[-2]
    batch = cu_seqlens_q.shape[0] - 1 if varlen_q else q.shape[0]
    seq_q = int(max_seqlen_q) if varlen_q else q.shape[1]
    seq_k = int(max_seqlen_k) if varlen_k else k.shape[1]
    total_q = q.shape[0] if varlen_q else batch * q.shape[1]
    total_k = k.shape[0] if varlen_k else batch * k.shape[1]
    left = -1 if window_size_left >= seq_k - 1 else window_size_left
    right = 0 if is_causal else (-1 if window_size_right >= seq_q - 1 else window_size_right)
    causal = left < 0 and right == 0
    local = (left >= 0 or right >= 0) and not causal
    d_rounded = _head_dim_rounded(q.shape[-1])
    block_m, block_n = _bwd_blocks(d_rounded, causal or local or softcap > 0.0)
    f32 = torch.float32
    if varlen:
        rows_q = _round_up(total_q + batch * block_m, block_m)
        softmax_d = q.new_empty((heads, rows_q), dtype=f32)
        lse_log2 = q.new_empty((heads, rows_q), dtype=f32)
        dq_accum = q.new_empty((heads, rows_q * d_rounded), dtype=f32)
    else:
        rows_q = _round_up(seq_q, block_m)
        softmax_d = q.new_empty((batch, heads, rows_q), dtype=f32)
        lse_log2 = q.new_empty((batch, heads, rows_q), dtype=f32)
        dq_accum = q.new_empty((batch, heads, rows_q * d_rounded), dtype=f32)
    if heads_k != heads:  # MQA / GQA: dK and dV are summed over the heads that share them
        if varlen:
            shape: tuple[int, ...] = (heads_k, _round_up(total_k + batch * block_n, block_n), d_rounded)
        else:
            shape = (batch, heads_k, _round_up(seq_k, block_n) * d_rounded)
        dk_accum, dv_accum = q.new_empty(shape, dtype=f32), q.new_empty(shape, dtype=f32)
    else:
        dk_accum, dv_accum = q.new_empty((0,), dtype=f32), q.new_empty((0,), dtype=f32)
    return dq, dk, dv, softmax_d, lse_log2, dq_accum, dk_accum, dv_accum


def define_ops() -> None:
    """flash_attn_3::fwd and ::bwd, with fake kernels only: they never run anywhere but in
    FakeTensorMode (the observer reports them; the cost model times them)."""
    global _lib
    if _lib is not None:
        return
    if hasattr(torch.ops, NAMESPACE) and hasattr(getattr(torch.ops, NAMESPACE), "fwd"):
        raise ImportError(
            f"phantora: torch.ops.{NAMESPACE} was registered before phantora's FlashAttention 3 stand-in "
            f"(the real FA3 extension was loaded some other way); phantora cannot run FA3's CUDA kernels. "
            f"Import flash_attn_interface (or use torch's SDPA) instead of loading the extension directly.")
    _lib = torch.library.Library(NAMESPACE, "DEF")
    _lib.define(FWD_SCHEMA)
    _lib.define(BWD_SCHEMA)
    torch.library.register_fake(f"{NAMESPACE}::fwd", _fwd_fake, lib=_lib)
    torch.library.register_fake(f"{NAMESPACE}::bwd", _bwd_fake, lib=_lib)


# --- FA3's Python API (hopper/flash_attn_interface.py) ------------------------------------------

class _FlashAttnFunc(torch.autograd.Function):
    """FA3's FlashAttnFunc / FlashAttnVarlenFunc: forward is one `fwd`, backward one `bwd`."""

    @staticmethod
    def forward(ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: Any,
                cu_seqlens_k: Any, seqused_q: Any, seqused_k: Any, max_seqlen_q: Any, max_seqlen_k: Any,
                softmax_scale: float | None, causal: bool, qv: Any, q_descale: Any, k_descale: Any,
                v_descale: Any, window_size: tuple[int, int], attention_chunk: int, softcap: float,
                num_splits: int, pack_gqa: Any, deterministic: bool, sm_margin: int) -> Any:
        if softmax_scale is None:
            softmax_scale = (q.shape[-1] + (qv.shape[-1] if qv is not None else 0)) ** (-0.5)
        out, lse, _, _ = torch.ops.flash_attn_3.fwd(
            q, k, v, None, None, qv, None, cu_seqlens_q, cu_seqlens_k, None, seqused_q, seqused_k,
            max_seqlen_q, max_seqlen_k, None, None, None, None, None, None, q_descale, k_descale, v_descale,
            softmax_scale, causal, window_size[0], window_size[1], attention_chunk, softcap, True, None,
            num_splits, pack_gqa, sm_margin)
        ctx.save_for_backward(q, k, v, out, lse, *(t for t in (cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k)
                                                   if t is not None))
        ctx.optional = tuple(t is not None for t in (cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k))
        ctx.args = (max_seqlen_q, max_seqlen_k, softmax_scale, causal, window_size, softcap, deterministic,
                    sm_margin)
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx: Any, dout: torch.Tensor, *unused: Any) -> Any:
        q, k, v, out, lse, *rest = ctx.saved_tensors
        cu_q, cu_k, used_q, used_k = (rest.pop(0) if present else None for present in ctx.optional)
        max_q, max_k, scale, causal, window, softcap, deterministic, sm_margin = ctx.args
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        torch.ops.flash_attn_3.bwd(dout, q, k, v, out, lse, dq, dk, dv, cu_q, cu_k, used_q, used_k, max_q, max_k,
                                   scale, causal, window[0], window[1], softcap, deterministic, sm_margin)
        return (dq, dk, dv) + (None,) * 19


def flash_attn_func(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, softmax_scale: float | None = None,
                    causal: bool = False, qv: Any = None, q_descale: Any = None, k_descale: Any = None,
                    v_descale: Any = None, window_size: tuple[int, int] = (-1, -1), attention_chunk: int = 0,
                    softcap: float = 0.0, num_splits: int = 1, pack_gqa: Any = None, deterministic: bool = False,
                    sm_margin: int = 0, return_attn_probs: bool = False) -> Any:
    """FA3's flash_attn_func: q [B, S, H, D], k and v [B, S_k, H_k, D]; out, (out, softmax_lse)
    with return_attn_probs."""
    out, lse = _FlashAttnFunc.apply(q, k, v, None, None, None, None, None, None, softmax_scale, causal, qv,
                                    q_descale, k_descale, v_descale, tuple(window_size), attention_chunk, softcap,
                                    num_splits, pack_gqa, deterministic, sm_margin)
    return (out, lse) if return_attn_probs else out


def flash_attn_varlen_func(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
                           cu_seqlens_k: torch.Tensor, max_seqlen_q: int, max_seqlen_k: int, seqused_q: Any = None,
                           seqused_k: Any = None, softmax_scale: float | None = None, causal: bool = False,
                           qv: Any = None, q_descale: Any = None, k_descale: Any = None, v_descale: Any = None,
                           window_size: tuple[int, int] = (-1, -1), attention_chunk: int = 0, softcap: float = 0.0,
                           num_splits: int = 1, pack_gqa: Any = None, deterministic: bool = False, sm_margin: int = 0,
                           return_attn_probs: bool = False) -> Any:
    """FA3's flash_attn_varlen_func: packed q [total_q, H, D], k and v [total_k, H_k, D]."""
    out, lse = _FlashAttnFunc.apply(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, max_seqlen_q,
                                    max_seqlen_k, softmax_scale, causal, qv, q_descale, k_descale, v_descale,
                                    tuple(window_size), attention_chunk, softcap, num_splits, pack_gqa,
                                    deterministic, sm_margin)
    return (out, lse) if return_attn_probs else out


_UNMODELLED = ("flash_attn_qkvpacked_func", "flash_attn_with_kvcache", "flash_attn_combine", "get_scheduler_metadata")


def _unmodelled(name: str) -> Callable[..., Any]:
    def call(*args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(
            f"phantora: flash_attn_interface.{name} is not modelled: phantora's FlashAttention 3 stand-in "
            f"(interpose/device/flash_attn3.py) times flash_attn_func, flash_attn_varlen_func and torch's FA3 "
            f"attention (torch.nn.attention.activate_flash_attention_impl('FA3')); use one of them, or "
            f"torch's scaled_dot_product_attention / varlen_attn.")
    call.__name__ = name
    return call


def stand_in_module(name: str) -> types.ModuleType:
    define_ops()
    module = types.ModuleType(name, "phantora stand-in for FlashAttention 3 (interpose/device/flash_attn3.py): "
                                    "its kernels are timed as aten's flash attention")
    module.__phantora_stand_in__ = True  # type: ignore[attr-defined]
    if name == "flash_attn_interface":
        module.flash_attn_func = flash_attn_func  # type: ignore[attr-defined]
        module.flash_attn_varlen_func = flash_attn_varlen_func  # type: ignore[attr-defined]
        module.flash_attn_3_gpu = torch.ops.flash_attn_3  # type: ignore[attr-defined]
        for fn in _UNMODELLED:
            setattr(module, fn, _unmodelled(fn))
    return module


# --- running torch's FA3 kernels for the aten flash ops -----------------------------------------

_fa3_kernels: dict[Any, Callable[..., Any]] = {}  # aten overload -> torch's FA3 Python kernel for it


def _resolve(op_name: str) -> Any:
    """The aten overload a Library.impl name designates ("_flash_attention_forward.quantized")."""
    packet_name, _, overload = op_name.partition(".")
    packet = getattr(torch.ops.aten, packet_name, None)
    return getattr(packet, overload or "default", None) if packet is not None else None


def _record_fa3_registrations(fa3: types.ModuleType) -> None:
    """Wrap _fa3._fa3_register_kernels so that the Python kernels it registers for the CUDA key
    are also remembered here, by aten overload (whatever ops this torch version covers)."""
    original = getattr(fa3, "_fa3_register_kernels", None)
    library_cls = getattr(fa3, "Library", None)
    if original is None or library_cls is None or getattr(original, "_phantora", False):
        return

    class RecordingLibrary(library_cls):  # type: ignore[misc, valid-type]
        def impl(self, op_name: Any, fn: Any, dispatch_key: str = "", *args: Any, **kwargs: Any) -> Any:
            op = _resolve(op_name) if isinstance(op_name, str) else None
            if op is not None and callable(fn):
                _fa3_kernels[op] = fn
            return super().impl(op_name, fn, dispatch_key, *args, **kwargs)

    def register_kernels() -> Any:
        fa3.Library = RecordingLibrary
        try:
            return original()
        finally:
            fa3.Library = library_cls

    register_kernels._phantora = True  # type: ignore[attr-defined]
    fa3._fa3_register_kernels = register_kernels


def _fa3_active() -> bool:
    enabled = getattr(torch._C, "_get_fa3_sdp_enabled", None)
    return bool(_fa3_kernels) and (enabled is None or bool(enabled()))


def _aten_flash_op(obs: Any, func: Any, args: tuple, kwargs: dict) -> Any:
    """The observer's handler for the aten ops FA3 can implement: torch's FA3 kernel, observed,
    while FA3 is active; the op itself otherwise."""
    kernel = _fa3_kernels.get(func) if _fa3_active() else None
    if kernel is None or not obs.active():
        return obs.run_op(func, args, kwargs)
    with obs:  # pushed again for the kernel's own ops, as for a custom op (interpose/ops/custom_ops.py)
        return kernel(*args, **kwargs)


_FA3_ATEN_OPS = ("_flash_attention_forward", "_flash_attention_backward", "_flash_attention_forward_no_dropout_inplace",
                 "_scaled_dot_product_flash_attention", "_scaled_dot_product_flash_attention_backward")


def install_flash_attn3(observer_specials: dict[Any, Callable[..., Any]]) -> None:
    """The import finder, the recording of torch's FA3 registrations, and the observer's handlers
    (`observer_specials`: interpose/ops/observer.py's _SPECIAL) for the aten ops FA3 covers."""
    install_stand_ins(MODULES, stand_in_module)
    try:
        import torch.nn.attention._fa3 as fa3
    except ImportError:  # a torch without FA3 support: nothing activates it
        return
    _record_fa3_registrations(fa3)
    for name in _FA3_ATEN_OPS:
        packet = getattr(torch.ops.aten, name, None)
        for overload in (packet.overloads() if packet is not None else ()):
            op = getattr(packet, overload)
            if op not in observer_specials:
                observer_specials[op] = _aten_flash_op
