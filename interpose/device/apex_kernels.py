"""Apex's and Megatron's fused CUDA kernels on a virtual GPU: stand-ins for their extension modules.

NVIDIA's PyTorch containers carry Apex built with its CUDA extensions (`--cpp_ext --cuda_ext`).
Each extension is a top-level module that programs import by name:

  * `scaled_upper_triang_masked_softmax_cuda`, `scaled_masked_softmax_cuda`, `scaled_softmax_cuda`
    (Apex csrc/megatron): Megatron-Core's FusedScaleMaskSoftmax imports them itself
    (megatron/core/fusions/fused_softmax.py; `masked_softmax_fusion`, on by default in
    Megatron-LM);
  * `fused_weight_gradient_mlp_cuda` (csrc/megatron/fused_weight_gradient_dense.cpp):
    Megatron-Core's linear layers accumulate weight gradients into `main_grad` with it
    (tensor_parallel/layers.py; `gradient_accumulation_fusion`, on by default in Megatron-LM);
  * `fused_layer_norm_cuda` (csrc/layer_norm_cuda.cpp) and `fast_layer_norm` (the persistent
    LayerNorm, apex/contrib/csrc/layer_norm/ln_api.cpp): Apex's FusedLayerNorm / FastLayerNormFN,
    Megatron-Core's FusedLayerNorm (`persist_layer_norm`);
  * `amp_C` (csrc/amp_C_frontend.cpp): multi-tensor ops, used through
    apex.multi_tensor_apply by Megatron-Core's gradient clipping and fp32 copies
    (multi_tensor_l2norm, multi_tensor_scale) and by Apex's FusedAdam (multi_tensor_adam).

Under phantora these imports always give the stand-ins below, whether Apex's extensions are
installed or not, as `flash_attn_interface` does (flash_attn3.py): their CUDA code cannot run on
tensors that hold no data, so the real modules could not run here either way; and NVIDIA's images,
which phantora predicts, have them. So a program that would stop at `No module named
'scaled_masked_softmax_cuda'` on a machine without Apex (Megatron-LM's defaults) runs as it does in
those images, and one that checks for the modules (`try: import amp_C`) takes the path the images
take. What decides the rest is Apex's Python layer (`import apex`: Megatron-Core picks
FusedLayerNorm over torch's LayerNorm on it, and apex.multi_tensor_apply, FusedAdam): phantora does
not stand in for it; when it is installed (its Python-only install on a machine without CUDA
works), its calls reach these kernels; when not, the program takes its torch fallbacks as it
would on such a GPU machine.

Each kernel is one op of the `apex` namespace with a fake kernel that returns (or, for in-place
kernels, writes) what the real one does, with its real shapes, dtypes and workspaces; the observer
reports it like any aten op and phantora/cost/apex.py times it as the kernel it is (QUALIFIED_FAMILIES).
amp_C.multi_tensor_adam is cuda_extensions.py's op (DeepSpeed's csrc/adam is Apex's kernel).
Functions of these modules without a cost model raise NotImplementedError when called.
"""

from __future__ import annotations

import types
from typing import Any, Callable, Sequence

import torch

from interpose.device.stand_in import install_stand_ins
from interpose.device import cuda_extensions
from interpose.runtime import rank_label

NAMESPACE = "apex"
_lib: Any = None  # the torch.library.Library defining the ops, made at first import

_SCHEMAS = (
    "scaled_upper_triang_masked_softmax_forward(Tensor input, float scale) -> Tensor",
    "scaled_upper_triang_masked_softmax_backward_(Tensor(a!) output_grads, Tensor softmax_results, float scale) -> ()",
    "scaled_masked_softmax_forward(Tensor input, Tensor mask, float scale) -> Tensor",
    "scaled_masked_softmax_backward(Tensor output_grads, Tensor softmax_results, float scale) -> Tensor",
    "scaled_softmax_forward(Tensor input, float scale) -> Tensor",
    "scaled_softmax_backward_(Tensor(a!) output_grads, Tensor softmax_results, float scale) -> ()",
    "wgrad_gemm_accum(Tensor input, Tensor d_output, Tensor(a!) d_weight) -> ()",
    # fused_layer_norm_cuda's forward / forward_affine / rms_* / *_mixed_dtypes: one op, the
    # variant in its arguments (no gamma: not affine; rms: no mean, no beta); absent results empty
    "fused_layer_norm(Tensor input, int[] normalized_shape, Tensor? gamma, Tensor? beta, float eps, bool rms, "
    "bool mixed_dtypes) -> (Tensor output, Tensor mean, Tensor invvar)",
    "fused_layer_norm_backward(Tensor dout, Tensor? mean, Tensor invvar, Tensor input_or_output, "
    "int[] normalized_shape, Tensor? gamma, Tensor? beta, float eps, bool memory_efficient, bool rms) "
    "-> (Tensor grad_input, Tensor grad_gamma, Tensor grad_beta)",
    "fast_layer_norm_fwd(Tensor x, Tensor gamma, Tensor beta, float eps) -> (Tensor z, Tensor mu, Tensor rsigma)",
    "fast_layer_norm_bwd(Tensor dz, Tensor x_or_z, Tensor? mu, Tensor rsigma, Tensor gamma, Tensor? beta, "
    "bool memory_efficient) -> (Tensor dx, Tensor dgamma, Tensor dbeta, Tensor dgamma_part, Tensor dbeta_part)",
    "multi_tensor_scale(int chunk_size, Tensor noop_flag, Tensor[] src, Tensor(a!)[] dst, float scale) -> ()",
    "multi_tensor_axpby(int chunk_size, Tensor noop_flag, Tensor[] x, Tensor[] y, Tensor(a!)[] out, float a, "
    "float b, int arg_to_check) -> ()",
    "multi_tensor_l2norm(int chunk_size, Tensor noop_flag, Tensor[] tensors, bool per_tensor) "
    "-> (Tensor norm, Tensor per_tensor_norms)",
)

# The persistent LayerNorm's backward (ln_bwd) sums dgamma / dbeta per CTA column first:
# ctas_per_col = SMs x CTAs per SM / CTAS_PER_ROW (ln_bwd_semi_cuda_kernel.cu), one CTA per SM
# and one per row for the hidden sizes Megatron-Core sends it (1024-65536). The H100's SMs when
# the device's are unknown (meta tensors).
_DEFAULT_SMS = 132
_FLOAT16 = (torch.float16, torch.bfloat16)


def _stats_dtype(x: torch.Tensor) -> torch.dtype:
    return torch.float32 if x.dtype in _FLOAT16 else x.dtype


def _rows(x: torch.Tensor, normalized_shape: Sequence[int]) -> int:
    n2 = 1
    for s in normalized_shape:
        n2 *= int(s)
    return x.numel() // max(n2, 1)


def _sm_count(device: torch.device) -> int:
    if device.type != "cuda":
        return _DEFAULT_SMS
    try:
        return int(torch.cuda.get_device_properties(device).multi_processor_count)
    except Exception:  # no device properties (a bare process): the default GPU's
        return _DEFAULT_SMS


def _softmax_fake(input: torch.Tensor, *rest: Any) -> torch.Tensor:
    return torch.empty_like(input, memory_format=torch.contiguous_format)


def _nothing(*args: Any) -> None:
    return None


def _layer_norm_fake(input: torch.Tensor, normalized_shape: Sequence[int], gamma: torch.Tensor | None,
                     beta: torch.Tensor | None, eps: float, rms: bool,
                     mixed_dtypes: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """output (gamma's dtype for the mixed-dtypes variants), mean (empty for RMS) and invvar, fp32
    statistics for fp16/bf16 input (layer_norm_cuda.cpp)."""
    out_dtype = gamma.dtype if mixed_dtypes and gamma is not None else input.dtype
    output = torch.empty_like(input, dtype=out_dtype, memory_format=torch.contiguous_format)
    n1 = _rows(input, normalized_shape)
    invvar = input.new_empty((n1,), dtype=_stats_dtype(input))
    mean = input.new_empty((0,) if rms else (n1,), dtype=_stats_dtype(input))
    return output, mean, invvar


def _layer_norm_backward_fake(dout: torch.Tensor, mean: torch.Tensor | None, invvar: torch.Tensor,
                              input_or_output: torch.Tensor, normalized_shape: Sequence[int],
                              gamma: torch.Tensor | None, beta: torch.Tensor | None, eps: float,
                              memory_efficient: bool, rms: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """grad_input like input_or_output; grad_gamma / grad_beta like gamma / beta (empty when absent)."""
    grad_input = torch.empty_like(input_or_output, memory_format=torch.contiguous_format)
    grad_gamma = torch.empty_like(gamma) if gamma is not None else input_or_output.new_empty((0,))
    grad_beta = torch.empty_like(beta) if beta is not None and not rms else input_or_output.new_empty((0,))
    return grad_input, grad_gamma, grad_beta


def _fast_ln_fwd_fake(x: torch.Tensor, gamma: torch.Tensor, beta: torch.Tensor,
                      eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """ln_fwd: z in gamma's dtype, fp32 mu and rsigma per row (x is [rows, hidden])."""
    rows = x.shape[0]
    z = x.new_empty(x.shape, dtype=gamma.dtype)
    return z, x.new_empty((rows,), dtype=torch.float32), x.new_empty((rows,), dtype=torch.float32)


def _fast_ln_bwd_fake(dz: torch.Tensor, x_or_z: torch.Tensor, mu: torch.Tensor | None, rsigma: torch.Tensor,
                      gamma: torch.Tensor, beta: torch.Tensor | None,
                      memory_efficient: bool) -> tuple[torch.Tensor, ...]:
    """ln_bwd: dx, dgamma, dbeta and the fp32 per-CTA-column partial sums [ctas_per_col, hidden]."""
    hidden = gamma.numel()
    ctas_per_col = _sm_count(x_or_z.device)
    part = (ctas_per_col, hidden)
    return (torch.empty_like(x_or_z), torch.empty_like(gamma), torch.empty_like(gamma),
            x_or_z.new_empty(part, dtype=torch.float32), x_or_z.new_empty(part, dtype=torch.float32))


def _l2norm_fake(chunk_size: int, noop_flag: torch.Tensor, tensors: Sequence[torch.Tensor],
                 per_tensor: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """multi_tensor_l2norm_cuda: the fp32 norm [1] and, with per_tensor, one norm per tensor."""
    ref = tensors[0] if tensors else noop_flag
    return (ref.new_empty((1,), dtype=torch.float32),
            ref.new_empty((len(tensors) if per_tensor else 0,), dtype=torch.float32))


_FAKES: dict[str, Callable[..., Any]] = {
    "scaled_upper_triang_masked_softmax_forward": _softmax_fake,
    "scaled_upper_triang_masked_softmax_backward_": _nothing,
    "scaled_masked_softmax_forward": _softmax_fake,
    "scaled_masked_softmax_backward": _softmax_fake,
    "scaled_softmax_forward": _softmax_fake,
    "scaled_softmax_backward_": _nothing,
    "wgrad_gemm_accum": _nothing,
    "fused_layer_norm": _layer_norm_fake,
    "fused_layer_norm_backward": _layer_norm_backward_fake,
    "fast_layer_norm_fwd": _fast_ln_fwd_fake,
    "fast_layer_norm_bwd": _fast_ln_bwd_fake,
    "multi_tensor_scale": _nothing,
    "multi_tensor_axpby": _nothing,
    "multi_tensor_l2norm": _l2norm_fake,
}


def define_ops() -> None:
    """The apex:: ops, with fake kernels only: they never run anywhere but in FakeTensorMode (the
    observer reports them; the cost model times them)."""
    global _lib
    if _lib is not None:
        return
    _lib = torch.library.Library(NAMESPACE, "DEF")
    for schema in _SCHEMAS:
        _lib.define(schema)
        name = schema.split("(", 1)[0]
        torch.library.register_fake(f"{NAMESPACE}::{name}", _FAKES[name], lib=_lib)


def _float(x: Any) -> float:
    """Megatron passes the softmax scale as a 0-d CPU tensor (scale_t[0]); pybind11 reads its float."""
    try:
        return float(x)
    except Exception:  # a value phantora does not hold: the scale changes no shape and no time
        return 1.0


def _check(ok: bool, module: str, fn: str, what: str) -> None:
    if not ok:
        raise RuntimeError(f"phantora: rank {rank_label()}: {module}.{fn}: {what} (Apex's check, in phantora's "
                           f"stand-in interpose/device/apex_kernels.py); pass what the kernel accepts")


def _half(t: torch.Tensor) -> bool:
    return t.dtype in _FLOAT16


# --- the softmax kernels (csrc/megatron/scaled_*softmax*.cpp) ------------------------------------

def _upper_triang_forward(input: torch.Tensor, scale: Any) -> torch.Tensor:
    m = "scaled_upper_triang_masked_softmax_cuda"
    _check(input.dim() == 3, m, "forward", "expected 3D tensor")
    _check(_half(input), m, "forward", "Only fp16 and bf16 are supported")
    _check(input.shape[-1] <= 16384, m, "forward", "seq_len <= 16384")
    return torch.ops.apex.scaled_upper_triang_masked_softmax_forward(input, _float(scale))


def _upper_triang_backward(output_grads: torch.Tensor, softmax_results: torch.Tensor, scale: Any) -> torch.Tensor:
    m = "scaled_upper_triang_masked_softmax_cuda"
    _check(output_grads.dim() == 3 and softmax_results.dim() == 3, m, "backward", "expected 3D tensor")
    grads = output_grads.contiguous()  # bwd_cuda's .contiguous(), then in place
    with torch.no_grad():
        torch.ops.apex.scaled_upper_triang_masked_softmax_backward_(grads, softmax_results.contiguous(), _float(scale))
    return grads


def _masked_forward(input: torch.Tensor, mask: torch.Tensor, scale: Any) -> torch.Tensor:
    m = "scaled_masked_softmax_cuda"
    _check(input.dim() == 4 and mask.dim() == 4, m, "forward", "expected 4D tensor")
    _check(_half(input), m, "forward", "Only fp16 and bf16 are supported")
    b, _, sq, sk = input.shape
    _check(sk <= 16384 and sq > 1 and mask.shape[0] in (1, b) and mask.shape[1] == 1
           and tuple(mask.shape[2:]) == (sq, sk), m, "forward",
           f"mask {tuple(mask.shape)} for input {tuple(input.shape)}: [1 or b, 1, sq, sk] with sk <= 16384")
    return torch.ops.apex.scaled_masked_softmax_forward(input.contiguous(), mask.contiguous(), _float(scale))


def _masked_backward(output_grads: torch.Tensor, softmax_results: torch.Tensor, scale: Any) -> torch.Tensor:
    m = "scaled_masked_softmax_cuda"
    _check(output_grads.dim() == 4 and softmax_results.dim() == 4, m, "backward", "expected 4D tensor")
    return torch.ops.apex.scaled_masked_softmax_backward(output_grads.contiguous(), softmax_results.contiguous(),
                                                         _float(scale))


def get_batch_per_block(query_seq_len: int, key_seq_len: int, batches: int, attn_heads: int) -> int:
    """scaled_masked_softmax.h's get_batch_per_block: rows per 128-thread block of the warp
    softmax (one warp of up to 32 lanes per row, two rows per warp up to 128 columns)."""
    next_pow2 = 1 << max(int(key_seq_len) - 1, 0).bit_length()
    warp_size = min(next_pow2, 32)
    batches_per_warp = 2 if next_pow2 <= 128 else 1
    return (128 // warp_size) * batches_per_warp


def _scaled_forward(input: torch.Tensor, scale: Any) -> torch.Tensor:
    m = "scaled_softmax_cuda"
    _check(input.dim() == 4, m, "forward", "expected 4D tensor")
    _check(_half(input), m, "forward", "Only fp16 and bf16 are supported")
    return torch.ops.apex.scaled_softmax_forward(input.contiguous(), _float(scale))


def _scaled_backward(output_grads: torch.Tensor, softmax_results: torch.Tensor, scale: Any) -> torch.Tensor:
    m = "scaled_softmax_cuda"
    _check(output_grads.dim() == 4 and softmax_results.dim() == 4, m, "backward", "expected 4D tensor")
    grads = output_grads.contiguous()
    with torch.no_grad():
        torch.ops.apex.scaled_softmax_backward_(grads, softmax_results.contiguous(), _float(scale))
    return grads


# --- weight-gradient GEMM accumulating into main_grad (fused_weight_gradient_dense.cpp) ----------

def _wgrad(module_fn: str, wanted: tuple[torch.dtype, ...]) -> Callable[..., None]:
    def wgrad_gemm_accum(input: torch.Tensor, d_output: torch.Tensor, d_weight: torch.Tensor) -> None:
        """d_weight += d_output^T @ input, inputs collapsed to 2-D (the cuBLAS GEMM with beta 1)."""
        _check(d_weight.dtype in wanted, "fused_weight_gradient_mlp_cuda", module_fn,
               f"d_weight of dtype {d_weight.dtype}, expected {' or '.join(map(str, wanted))}")
        _check(input.shape[-1] == d_weight.shape[1] and d_output.shape[-1] == d_weight.shape[0]
               and input.numel() // input.shape[-1] == d_output.numel() // d_output.shape[-1],
               "fused_weight_gradient_mlp_cuda", module_fn,
               f"input {tuple(input.shape)}, d_output {tuple(d_output.shape)}, d_weight {tuple(d_weight.shape)}")
        with torch.no_grad():
            torch.ops.apex.wgrad_gemm_accum(input, d_output, d_weight)
    wgrad_gemm_accum.__name__ = module_fn
    return wgrad_gemm_accum


# --- fused_layer_norm_cuda (csrc/layer_norm_cuda.cpp) -------------------------------------------

def _ln_forward(rms: bool, affine: bool, mixed: bool) -> Callable[..., Any]:
    def forward(input: torch.Tensor, normalized_shape: Sequence[int], *rest: Any) -> Any:
        if affine:
            gamma, beta, eps = (rest[0], None, rest[1]) if rms else rest[:3]
        else:
            gamma, beta, eps = None, None, rest[0]
        output, mean, invvar = torch.ops.apex.fused_layer_norm(
            input.contiguous(), [int(s) for s in normalized_shape], gamma, beta, float(eps), rms, mixed)
        return [output, invvar] if rms else [output, mean, invvar]
    return forward


def _ln_backward(rms: bool, affine: bool) -> Callable[..., Any]:
    def backward(dout: torch.Tensor, *rest: Any) -> Any:
        mean = None
        if not rms:
            mean, rest = rest[0], rest[1:]
        invvar, input_or_output, normalized_shape, *rest = rest
        gamma = beta = None
        if affine:
            gamma, rest = rest[0], rest[1:]
            if not rms:
                beta, rest = rest[0], rest[1:]
        eps, memory_efficient = rest[0], (rest[1] if len(rest) > 1 else False)
        grad_input, grad_gamma, grad_beta = torch.ops.apex.fused_layer_norm_backward(
            dout.contiguous(), mean, invvar, input_or_output, [int(s) for s in normalized_shape], gamma, beta,
            float(eps), bool(memory_efficient), rms)
        if not affine:
            return grad_input
        return [grad_input, grad_gamma] if rms else [grad_input, grad_gamma, grad_beta]
    return backward


# --- fast_layer_norm: the persistent LayerNorm (apex/contrib/csrc/layer_norm/ln_api.cpp) ----------

def _fast_ln_fwd(x: torch.Tensor, gamma: torch.Tensor, beta: torch.Tensor, epsilon: float) -> list[torch.Tensor]:
    _check(x.dim() == 2 and x.shape[1] == gamma.numel() == beta.numel(), "fast_layer_norm", "ln_fwd",
           f"x {tuple(x.shape)} must be [rows, hidden] with gamma and beta of hidden elements")
    return list(torch.ops.apex.fast_layer_norm_fwd(x, gamma, beta, float(epsilon)))


def _fast_ln_bwd(dz: torch.Tensor, x_or_z: torch.Tensor, mu: torch.Tensor | None, rsigma: torch.Tensor,
                 gamma: torch.Tensor, beta: torch.Tensor | None, memory_efficient: bool) -> list[torch.Tensor]:
    return list(torch.ops.apex.fast_layer_norm_bwd(dz, x_or_z, mu, rsigma, gamma, beta, bool(memory_efficient)))


# --- amp_C (csrc/amp_C_frontend.cpp) ------------------------------------------------------------

def multi_tensor_scale(chunk_size: int, noop_flag: torch.Tensor, tensor_lists: Sequence[Sequence[torch.Tensor]],
                       scale: float) -> None:
    """dst = src * scale over [src, dst] (also flags a non-finite value in noop_flag)."""
    src, dst = (list(lst) for lst in tensor_lists)
    with torch.no_grad():
        torch.ops.apex.multi_tensor_scale(int(chunk_size), noop_flag, src, dst, float(scale))


def multi_tensor_axpby(chunk_size: int, noop_flag: torch.Tensor, tensor_lists: Sequence[Sequence[torch.Tensor]],
                       a: float, b: float, arg_to_check: int) -> None:
    """out = a * x + b * y over [x, y, out]."""
    x, y, out = (list(lst) for lst in tensor_lists)
    with torch.no_grad():
        torch.ops.apex.multi_tensor_axpby(int(chunk_size), noop_flag, x, y, out, float(a), float(b), int(arg_to_check))


def multi_tensor_l2norm(chunk_size: int, noop_flag: torch.Tensor, tensor_lists: Sequence[Sequence[torch.Tensor]],
                        per_tensor_python: bool | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(the L2 norm of all tensors of tensor_lists[0], per-tensor norms if per_tensor_python)."""
    return torch.ops.apex.multi_tensor_l2norm(int(chunk_size), noop_flag, list(tensor_lists[0]),
                                              bool(per_tensor_python))


# Module name -> {function: implementation}; the other functions each module exports (from the
# sources' pybind11 `m.def`s) raise NotImplementedError when called.
MODULES: dict[str, dict[str, Callable[..., Any]]] = {
    "scaled_upper_triang_masked_softmax_cuda": {"forward": _upper_triang_forward, "backward": _upper_triang_backward},
    "scaled_masked_softmax_cuda": {"forward": _masked_forward, "backward": _masked_backward,
                                   "get_batch_per_block": get_batch_per_block},
    "scaled_softmax_cuda": {"forward": _scaled_forward, "backward": _scaled_backward},
    "fused_weight_gradient_mlp_cuda": {
        "wgrad_gemm_accum_fp32": _wgrad("wgrad_gemm_accum_fp32", (torch.float32,)),
        "wgrad_gemm_accum_fp16": _wgrad("wgrad_gemm_accum_fp16", _FLOAT16)},
    "fused_layer_norm_cuda": {
        "forward": _ln_forward(rms=False, affine=False, mixed=False),
        "forward_affine": _ln_forward(rms=False, affine=True, mixed=False),
        "forward_affine_mixed_dtypes": _ln_forward(rms=False, affine=True, mixed=True),
        "backward": _ln_backward(rms=False, affine=False),
        "backward_affine": _ln_backward(rms=False, affine=True),
        "rms_forward": _ln_forward(rms=True, affine=False, mixed=False),
        "rms_forward_affine": _ln_forward(rms=True, affine=True, mixed=False),
        "rms_forward_affine_mixed_dtypes": _ln_forward(rms=True, affine=True, mixed=True),
        "rms_backward": _ln_backward(rms=True, affine=False),
        "rms_backward_affine": _ln_backward(rms=True, affine=True)},
    "fast_layer_norm": {"ln_fwd": _fast_ln_fwd, "ln_bwd": _fast_ln_bwd},
    "amp_C": {"multi_tensor_scale": multi_tensor_scale, "multi_tensor_axpby": multi_tensor_axpby,
              "multi_tensor_l2norm": multi_tensor_l2norm, "multi_tensor_adam": cuda_extensions.multi_tensor_adam},
}
_UNMODELLED: dict[str, tuple[str, ...]] = {
    "amp_C": ("multi_tensor_sgd", "multi_tensor_l2norm_mp", "multi_tensor_l2norm_scale", "multi_tensor_unscale_l2norm",
              "multi_tensor_lamb_stage1_cuda", "multi_tensor_lamb_stage2_cuda", "multi_tensor_adam_capturable",
              "multi_tensor_adam_capturable_master", "multi_tensor_adagrad", "multi_tensor_novograd",
              "multi_tensor_lamb", "multi_tensor_lamb_mp", "update_scale_hysteresis"),
}


def _unmodelled(module: str, fn: str) -> Callable[..., Any]:
    def call(*args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(
            f"phantora: rank {rank_label()}: {module}.{fn} (an Apex CUDA kernel) has no cost model; phantora's "
            f"stand-in for {module} (interpose/device/apex_kernels.py) times "
            f"{', '.join(sorted(MODULES[module]))}. Use one of those or the PyTorch implementation "
            f"(for Apex's optimizers: torch.optim with foreach or fused=True), or add a cost model for "
            f"{fn} (interpose/device/apex_kernels.py, phantora/cost/apex.py).")
    call.__name__ = fn
    return call


def stand_in_module(name: str) -> types.ModuleType:
    define_ops()
    module = types.ModuleType(name, f"phantora stand-in for Apex's CUDA extension {name} "
                                    "(interpose/device/apex_kernels.py): its kernels are timed by phantora/cost/apex.py")
    module.__phantora_stand_in__ = True  # type: ignore[attr-defined]
    for fn, impl in MODULES[name].items():
        setattr(module, fn, impl)
    for fn in _UNMODELLED.get(name, ()):
        setattr(module, fn, _unmodelled(name, fn))
    return module


def install_apex_kernels() -> None:
    """The import finder, ahead of any installed Apex extension (whose CUDA code cannot run here)."""
    install_stand_ins(MODULES, stand_in_module)
