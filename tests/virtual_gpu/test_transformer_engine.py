"""Transformer Engine's compiled parts on a virtual GPU (interpose/device/transformer_engine).

In-process checks of the stand-in without TE installed: the finder's overlay (a package that
looks for its extension the way TE's common.load_framework_extension does gets phantora's
compiled stand-in, with TE's native loads switched off only while the package imports), the
outputs each modelled extension function allocates (the C++ extension's shapes and dtypes), and
the cost of a cuBLASLt GEMM counted by hand. One traced run of the real TE (pip
`transformer_engine`, its Python layer) is in test_te_layers_traced, on the CUDA build of torch
(tests/conftest.py te_cuda_python).
"""

from __future__ import annotations

import dataclasses
from collections import Counter

import importlib
import sys
import types
from pathlib import Path

import pytest
import torch

from interpose.device.transformer_engine import extension as tex
from interpose.device.transformer_engine import finder
from phantora.cost import transformer_engine as te_cost
from phantora.cost.families import classify
from phantora.cost.gemm import GemmShape, gemm_kernel
from phantora.cost.roofline import CostContext
from phantora.hardware import lookup_gpu
from phantora.ops import OpSignature
from tests.cost.tensors import cuda_tensor
from tests.virtual_gpu.harness import assert_ran, run_traced

# A package that loads its extension as TE 2.x does: the first transformer_engine_torch*.so beside
# the package's folder, by file path; and that records the native-load switch seen at import.
FAKE_TE_INIT = '''
import importlib.util, os, sys
from pathlib import Path
SKIPPED_NATIVE_LOADS = os.environ.get("NVTE_PROJECT_BUILDING")
root = Path(__file__).parent.parent
so = next(p for p in root.iterdir() if p.name.startswith("transformer_engine_torch") and p.suffix == ".so")
spec = importlib.util.spec_from_file_location("transformer_engine_torch", so)
ext = importlib.util.module_from_spec(spec)
sys.modules["transformer_engine_torch"] = ext
spec.loader.exec_module(ext)
'''


def test_finder_loads_the_stand_in_where_te_looks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    site = tmp_path / "site"
    (site / "transformer_engine").mkdir(parents=True)
    (site / "transformer_engine" / "__init__.py").write_text(FAKE_TE_INIT)
    monkeypatch.setenv("PHANTORA_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("NVTE_PROJECT_BUILDING", raising=False)
    monkeypatch.syspath_prepend(str(site))
    te_finder = finder.TransformerEngineFinder()
    sys.meta_path.insert(0, te_finder)
    try:
        te = importlib.import_module("transformer_engine")
        ext = sys.modules["transformer_engine_torch"]
    finally:
        sys.meta_path.remove(te_finder)
        for name in ("transformer_engine", "transformer_engine_torch"):
            sys.modules.pop(name, None)
    assert te.SKIPPED_NATIVE_LOADS == "1"
    assert "NVTE_PROJECT_BUILDING" not in __import__("os").environ  # restored after the import
    assert Path(te.__file__).parent.resolve() == (site / "transformer_engine").resolve()  # TE's own files
    assert Path(te.__file__).parent.parent.parent == tmp_path / "cache" / "transformer_engine"
    assert ext.__phantora_stand_in__ and ext.DType.kFloat8E4M3 == 7 and ext.generic_gemm is tex.generic_gemm


def _module() -> types.ModuleType:
    module = types.ModuleType("transformer_engine_torch")
    tex.populate(module)
    return module


def test_extension_surface() -> None:
    ext = _module()
    # the C enums' values (transformer_engine.h, fused_attn.h)
    assert (ext.DType.kBFloat16, ext.DType.kFloat8E5M2, ext.NVTE_QKV_Layout.NVTE_BSHD_BSHD_BSHD,
            ext.NVTE_Fused_Attn_Backend.NVTE_No_Backend, ext.NVTEScalingMode.NVTE_INVALID_SCALING) == (6, 8, 9, -1, 100)
    with pytest.raises(NotImplementedError, match="transformer_engine_torch.moe_permute_fwd"):
        ext.moe_permute_fwd()
    with pytest.raises(NotImplementedError, match="MPI"):  # userbuffers bootstrapped by torch.distributed only
        ext.CommOverlapHelper()
    with pytest.raises(AttributeError):
        ext.no_such_function  # noqa: B018


def test_gemm_outputs_follow_the_extension() -> None:
    """Linear's three GEMMs on [s, b, in] activations, weight [out, in] (module.linear: fprop TN,
    dgrad NN, wgrad NT), with bias, GELU and dbias epilogues."""
    s, b, n_in, n_out = 8, 2, 16, 24
    x = torch.empty(s, b, n_in, dtype=torch.bfloat16, device="meta")
    w = torch.empty(n_out, n_in, dtype=torch.bfloat16, device="meta")
    bias = torch.empty(n_out, dtype=torch.bfloat16, device="meta")
    dy = torch.empty(s, b, n_out, dtype=torch.bfloat16, device="meta")
    ws = torch.empty(1024, dtype=torch.uint8, device="meta")
    y, no_grad, pre_gelu, _ = tex.generic_gemm(w, True, x, False, None, None, tex.DType.kBFloat16, bias,
                                               tex.DType.kBFloat16, True, None, False, ws, 1024, False, False)
    assert (y.shape, y.dtype, no_grad, pre_gelu.shape) == ((s, b, n_out), torch.bfloat16, None, (s, b, n_out))
    dx, *_ = tex.generic_gemm(w, False, dy, False, None, None, tex.DType.kBFloat16, None, tex.DType.kBFloat16,
                              False, None, True, ws, 1024, False, False)
    assert dx.shape == (s, b, n_in)
    dw, dbias, none, _ = tex.generic_gemm(x.view(-1, n_in), False, dy.view(-1, n_out), True, None, None,
                                          tex.DType.kFloat32, bias, tex.DType.kBFloat16, False, None, True, ws,
                                          1024, False, False)
    assert (dw.shape, dw.dtype, dbias.shape, dbias.dtype, none) == ((n_out, n_in), torch.float32, (n_out,),
                                                                    torch.float32, None)
    with pytest.raises(RuntimeError, match="Invalid matrix dimensions"):
        tex.generic_gemm(w, False, x, False, None, None, None, None, tex.DType.kBFloat16, False, None, False, ws,
                         1024, False, False)


def test_norm_and_activation_outputs() -> None:
    x = torch.empty(8, 2, 16, dtype=torch.bfloat16, device="meta")
    g = torch.empty(16, dtype=torch.bfloat16, device="meta")
    z, mu, rsigma = tex.layernorm_fwd(x, g, g, 1e-5, None, None, tex.DType.kBFloat16, 0, False)
    assert (z.shape, z.dtype, mu.shape, mu.dtype, rsigma.shape) == (x.shape, torch.bfloat16, (16,), torch.float32,
                                                                    (16,))
    z, none, rsigma = tex.rmsnorm_fwd(x, g, 1e-5, None, None, tex.DType.kBFloat16, 0, False)
    assert none is None and rsigma.shape == (16,)
    dx, dgamma, dbeta = tex.layernorm_bwd(z, x, mu, rsigma, g, 0, False)
    assert (dx.shape, dgamma.shape, dbeta.shape) == (x.shape, g.shape, g.shape)
    ext = _module()
    assert ext.swiglu(x, None).shape == (8, 2, 8) and ext.dswiglu(x[..., :8], x, None).shape == x.shape
    dbias, dgelu = ext.dbias_dgelu(x, x, None)
    assert dbias.shape == (16,) and dgelu.shape == x.shape
    with pytest.raises(NotImplementedError, match="activation gelu with a object output"):
        ext.gelu(x, object())
    scores = torch.empty(2, 4, 8, 8, dtype=torch.bfloat16, device="meta")
    probs = ext.scaled_masked_softmax_forward(scores, torch.empty(2, 1, 8, 8, dtype=torch.bool, device="meta"), 0.1)
    assert probs.shape == scores.shape and ext.scaled_masked_softmax_backward(probs, probs, 0.1).shape == scores.shape


def test_rope_and_multi_tensor_outputs() -> None:
    """Fused RoPE keeps the input's shape and dtype; multi_tensor_l2norm returns the norm and the
    per-tensor norms in fp32 (the C++ multi_tensor_l2norm_cuda); the l2norm op is timed as one
    read of every tensor plus the cleanup kernel."""
    ext = _module()
    x = torch.empty(16, 2, 4, 64, dtype=torch.bfloat16, device="meta")
    freqs = torch.empty(16, 1, 1, 64, dtype=torch.float32, device="meta")
    y = ext.fused_rope_forward(x, freqs, None, ext.NVTE_QKV_Format.NVTE_SBHD, False, None, 1, 0)
    assert (y.shape, y.dtype) == (x.shape, x.dtype) and ext.fused_rope_backward(y, freqs, None, 0, False, None, 1,
                                                                                  0).shape == x.shape
    grads = [torch.empty(1000, dtype=torch.float32, device="meta"), torch.empty(70000, dtype=torch.float32,
                                                                                device="meta")]
    noop = torch.empty(1, dtype=torch.int32, device="meta")
    norm, per_tensor = ext.multi_tensor_l2norm(65536, noop, [grads], True)
    assert (norm.shape, norm.dtype, per_tensor.shape) == ((1,), torch.float32, (2,))
    ext.multi_tensor_scale(65536, noop, [grads, grads], 0.5)

    gpu = lookup_gpu("h100-sxm-80gb")
    ts = [cuda_tensor((1000,)), cuda_tensor((70000,))]
    sig = OpSignature("nvte::multi_tensor_l2norm", "default",
                      (cuda_tensor((1,), "int32"), ts, cuda_tensor((320,)), cuda_tensor((1,)), cuda_tensor((0,)),
                       cuda_tensor((0,))), ())
    kernels = te_cost.multi_tensor_l2norm(sig, CostContext(gpu)).kernels
    assert kernels[-1].name == "cleanup" and sum(k.bytes for k in kernels[:-1]) == 4.0 * (71000 + 320)


def test_master_weight_cast_of_current_scaling() -> None:
    """cast_master_weights_to_fp8 (FP8 weights under current scaling: Megatron's
    --fp8-param-gather): each master weight's amax (one read of it), then one multi_tensor_apply
    launch writing every scale and scale_inv from its amax."""
    ext = _module()
    master = torch.empty(4096, 1024, dtype=torch.float32, device="meta")
    amax = torch.empty(1, dtype=torch.float32, device="meta")
    ext.compute_amax(master, amax)
    noop = torch.empty(1, dtype=torch.int32, device="meta")
    ones = [torch.empty(1, dtype=torch.float32, device="meta") for _ in range(3)]
    ext.multi_tensor_compute_scale_and_scale_inv(65536, noop, [ones, ones, ones], 448.0, False, 0.0)

    gpu = lookup_gpu("h100-sxm-80gb")
    amax_sig = OpSignature("nvte::compute_amax", "default", (cuda_tensor((4096, 1024)), cuda_tensor((1,))), ())
    assert [k.bytes for k in te_cost.compute_amax(amax_sig, CostContext(gpu)).kernels] == [4.0 * (4096 * 1024 + 1)]
    scalars = [cuda_tensor((1,)) for _ in range(3)]
    sig = OpSignature("nvte::multi_tensor_compute_scale", "default",
                      (cuda_tensor((1,), "int32"), scalars, scalars, scalars), ())
    kernels = te_cost.multi_tensor_compute_scale(sig, CostContext(gpu)).kernels
    assert len(kernels) == 1 and kernels[0].bytes == 4.0 * 9
    assert classify("nvte::multi_tensor_compute_scale").name == "foreach"


def _attention_params(**overrides: object) -> types.SimpleNamespace:
    """TE's FusedAttentionParams (dot_product_attention/utils.py) for a causal BF16 self-attention."""
    params = dict(is_training=True, deterministic=False, cuda_graph=False, return_max_logit=False,
                  attn_mask_type=tex.NVTE_Mask_Type.NVTE_CAUSAL_MASK, bias_type=tex.NVTE_Bias_Type.NVTE_NO_BIAS,
                  window_size_left=-1, window_size_right=0, bottom_right_diagonal=True,
                  softmax_type=tex.NVTE_Softmax_Type.NVTE_VANILLA_SOFTMAX, dropout=0.0, attn_scale=0.125,
                  qkv_dtype=tex.DType.kBFloat16, qkv_layout=tex.NVTE_QKV_Layout.NVTE_SBHD_SBHD_SBHD,
                  batch_size=2, num_attn_heads=16, num_gqa_groups=4, head_dim_qk=128, head_dim_v=128,
                  max_seqlen_q=4096, max_seqlen_kv=4096)
    params.update(overrides)
    return types.SimpleNamespace(**params)


@pytest.mark.parametrize(("sm", "overrides", "refused"), [
    (90, {}, ""),
    (90, {"head_dim_qk": 256, "head_dim_v": 256}, ""),  # Hopper: up to 256 (cuDNN 9.5+ for training)
    (90, {"head_dim_qk": 264, "head_dim_v": 264}, "head dimensions"),
    (100, {"head_dim_qk": 256, "head_dim_v": 256}, "head dimensions"),  # Blackwell training: 128, or 192/128
    (90, {"head_dim_qk": 192, "head_dim_v": 128}, ""),  # MLA's shape
    (90, {"head_dim_qk": 256, "head_dim_v": 128}, "d_qk=256 != d_v=128"),  # cuDNN 9.11+'s Hopper backward
    (90, {"head_dim_qk": 100, "head_dim_v": 100}, "multiples of 8"),
    (80, {"qkv_layout": tex.NVTE_QKV_Layout.NVTE_THD_THD_THD}, "THD"),
    (90, {"attn_mask_type": tex.NVTE_Mask_Type.NVTE_PADDING_CAUSAL_MASK, "dropout": 0.1}, "padding"),
    (75, {}, "compute capability"),
    (90, {"qkv_dtype": tex.DType.kFloat8E4M3}, "phantora: FP8 fused attention"),
])
def test_fused_attention_backend_as_cudnn_answers(monkeypatch: pytest.MonkeyPatch, sm: int, overrides: dict,
                                                  refused: str) -> None:
    """get_fused_attn_backend: cuDNN's F16 sub-backend where the core library's rules (cuDNN 9.24 as
    phantora reports it) accept the configuration on the virtual GPU's architecture, else
    No_Backend with the reason TE logs before it picks another backend."""
    from interpose.device.transformer_engine import attention
    monkeypatch.setattr(attention, "_arch", lambda: sm)
    backend, reason = attention.get_fused_attn_backend(_attention_params(**overrides))
    if refused:
        assert backend == tex.NVTE_Fused_Attn_Backend.NVTE_No_Backend and refused in reason, reason
    else:
        assert (backend, reason) == (tex.NVTE_Fused_Attn_Backend.NVTE_F16_arbitrary_seqlen, "")


def test_fused_attention_outputs_follow_the_extension() -> None:
    """fused_attn_fwd / _bwd allocate as the C++ extension does (csrc/extensions/attention.cpp): O
    in the output format, the fp32 softmax statistics [b, h, sq, 1] (THD: [t, h, 1]) and the RNG
    state; the gradients of a packed QKV layout as views of one buffer; and the kernels see the
    sequences of a THD batch (from cu_seqlens) and grouped-query K/V."""
    ext = _module()
    L, F, B, M = ext.NVTE_QKV_Layout, ext.NVTE_QKV_Format, ext.NVTE_Bias_Type, ext.NVTE_Mask_Type
    vanilla = ext.NVTE_Softmax_Type.NVTE_VANILLA_SOFTMAX
    s, b, h, g, d = 256, 2, 8, 2, 64

    def meta(*shape: int, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
        return torch.empty(shape, dtype=dtype, device="meta")

    cu = meta(b + 1, dtype=torch.int32)
    q, k, v = meta(s, b, h, d), meta(s, b, g, d), meta(s, b, g, d)
    out = ext.fused_attn_fwd(s, s, True, 0.125, 0.0, False, L.NVTE_SBHD_SBHD_SBHD, F.NVTE_BSHD, F.NVTE_QKV_Format_NOT_SET,
                             B.NVTE_NO_BIAS, M.NVTE_CAUSAL_MASK, vanilla, [-1, 0], True, cu, cu, q, k, v,
                             torch.bfloat16, None, None, None, None, None, None, None, None, None, 0, False, False)
    o, stats, rng = out
    assert (tuple(o.shape), o.dtype) == ((b, s, h, d), torch.bfloat16)  # o_format bshd
    assert (tuple(stats.shape), stats.dtype, tuple(rng.shape), rng.dtype) == ((b, h, s, 1), torch.float32, (2,),
                                                                             torch.int64)
    # packed QKV (sb3hd): dQ, dK, dV are views of one [s, b, 3, h, d] buffer
    qkv = meta(s, b, 3, h, d)
    q3, k3, v3 = qkv.select(2, 0), qkv.select(2, 1), qkv.select(2, 2)
    dq, dk, dv, dbias, doffset = ext.fused_attn_bwd(
        s, s, 0.125, 0.0, False, L.NVTE_SB3HD, F.NVTE_SBHD, F.NVTE_SBHD, L.NVTE_SB3HD, F.NVTE_QKV_Format_NOT_SET,
        F.NVTE_QKV_Format_NOT_SET, B.NVTE_NO_BIAS, M.NVTE_CAUSAL_MASK, vanilla, [-1, 0], True, False, cu, cu,
        q3, k3, v3, meta(s, b, h, d), meta(s, b, h, d), torch.bfloat16, [stats, rng], None, None, None, None, None,
        False)
    assert dq.shape == dk.shape == dv.shape == (s, b, h, d) and dbias is None and doffset is None
    assert dq._base is dk._base is dv._base and tuple(dq._base.shape) == (s, b, 3, h, d)
    # THD: 3 sequences in 600 tokens; the statistics per token
    tq = meta(600, h, d)
    o, stats, _ = ext.fused_attn_fwd(256, 256, True, 0.125, 0.0, False, L.NVTE_THD_THD_THD, F.NVTE_THD,
                                     F.NVTE_QKV_Format_NOT_SET, B.NVTE_NO_BIAS, M.NVTE_PADDING_CAUSAL_MASK, vanilla,
                                     [-1, 0], True, meta(4, dtype=torch.int32), meta(4, dtype=torch.int32), tq,
                                     meta(600, g, d), meta(600, g, d), torch.bfloat16, None, None, None, None, None,
                                     None, None, None, None, 0, False, False)
    assert tuple(o.shape) == (600, h, d) and tuple(stats.shape) == (600, h, 1)

    from interpose.device.transformer_engine.attention import _attention_dims
    assert _attention_dims(q, k, v, L.NVTE_SBHD_SBHD_SBHD, cu, s, s) == (b, h, s, s, d, d)
    assert _attention_dims(tq, meta(600, g, d), meta(600, g, d), L.NVTE_THD_THD_THD, meta(4, dtype=torch.int32),
                           256, 256) == (3, h, 200, 200, d, d)


def test_fused_attention_costs_cudnn_attention_on_the_same_shape() -> None:
    """nvte::fused_attn_fwd / _bwd are timed as torch's cuDNN SDPA ops of the same attention (B x
    H x S x D = 2 x 16 x 4096 x 128, causal): the same kernels and durations."""
    from phantora.cost.attention import attention as sdpa_cost
    gpu = lookup_gpu("h100-sxm-80gb")
    ctx = CostContext(gpu)
    b, h, s, d = 2, 16, 4096, 128
    sbhd, bhsd = cuda_tensor((s, b, h, d), "bfloat16"), cuda_tensor((b, h, s, d), "bfloat16")
    stats = cuda_tensor((b, h, s, 1), "float32")
    fwd = te_cost.fused_attn(OpSignature("nvte::fused_attn_fwd", "default",
                                         (sbhd, sbhd, sbhd, None, sbhd, stats, b, h, s, s, d, d, True, -1, -1), ()), ctx)
    sdpa = sdpa_cost(OpSignature("aten::_scaled_dot_product_cudnn_attention", "default",
                                 (bhsd, bhsd, bhsd, None, True, 0.0, True), ()), ctx)
    assert [k.name for k in fwd.kernels] == [k.name for k in sdpa.kernels]
    assert fwd.kernels[0].duration_ns == pytest.approx(sdpa.kernels[0].duration_ns, rel=0.02)
    assert fwd.kernels[0].flops == 2 * 2 * d * (s * (s + 1) / 2) * b * h
    ws = cuda_tensor((b * h * s * (d + 1) * 4,), "uint8")
    bwd = te_cost.fused_attn(OpSignature("nvte::fused_attn_bwd", "default",
                                         (sbhd, sbhd, sbhd, sbhd, sbhd, stats, sbhd, sbhd, sbhd, None, ws,
                                          b, h, s, s, d, d, True, -1, -1), ()), ctx)
    assert len(bwd.kernels) == 3 and bwd.kernels[1].flops == 2.5 * fwd.kernels[0].flops
    assert classify("nvte::fused_attn_fwd").name == classify("nvte::fused_attn_bwd").name == "attention"


def test_grouped_gemm_follows_the_groups() -> None:
    """GroupedLinear's forward on 4 experts (m_splits 300, 0, 700, 24 tokens): one output of
    [1024, n] whose row blocks are the groups' outputs; the empty group launches nothing; the GEMMs
    are timed as one grouped kernel over the groups' own tiles (FLOPs 2 m_g n k summed)."""
    ext = _module()
    k, n, splits = 64, 128, [300, 0, 700, 24]
    xs = [torch.empty(m, k, dtype=torch.bfloat16, device="meta") for m in splits]
    ws = [torch.empty(n, k, dtype=torch.bfloat16, device="meta") for _ in splits]
    out = torch.empty(sum(splits), n, dtype=torch.bfloat16, device="meta")
    empty = torch.empty(0, dtype=torch.bfloat16, device="meta")
    workspace = [torch.empty(1024, dtype=torch.uint8, device="meta")]
    calls = []
    from torch.utils._python_dispatch import TorchDispatchMode

    class Record(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            calls.append((func, args))
            return func(*args, **(kwargs or {}))

    with Record():
        ext.te_general_grouped_gemm(ws, True, xs, False, [out], ext.DType.kBFloat16, splits, [empty] * 4,
                                    ext.DType.kBFloat16, True, [empty] * 4, False, workspace, 1024, False, False, 0)
    grouped = [args for func, args in calls if func is torch.ops.nvte.grouped_gemm.default]
    assert len(grouped) == 1 and len(grouped[0][0]) == 3  # the empty group is left out
    assert [d.shape for d in grouped[0][4]] == [(300, n), (700, n), (24, n)]

    gpu = lookup_gpu("h100-sxm-80gb")
    sig = OpSignature("nvte::grouped_gemm", "default",
                      ([cuda_tensor((n, k), "bfloat16")] * 3, True,
                       [cuda_tensor((m, k), "bfloat16") for m in (300, 700, 24)], False,
                       [cuda_tensor((m, n), "bfloat16") for m in (300, 700, 24)], [cuda_tensor((0,), "bfloat16")] * 3,
                       False, False), ())
    kernel, = te_cost.grouped_gemm(sig, CostContext(gpu)).kernels
    assert kernel.flops == 2.0 * 1024 * n * k
    assert kernel.bytes == 2.0 * (3 * n * k + 1024 * k + 1024 * n)


def test_cublas_gemm_hand_count() -> None:
    """fprop of a [4096 -> 1024] Linear on 2048 tokens: FLOPs 2 M N K; bytes: A, B and D once,
    the bias once; D read back when accumulating (wgrad into main_grad); FP8 operands at the FP8
    rate (the same kernel model as aten's GEMMs, phantora/cost/gemm.py)."""
    gpu = lookup_gpu("h100-sxm-80gb")
    ctx = CostContext(gpu)
    m, n, k = 2048, 1024, 4096

    def sig(dtype: str, accumulate: bool, dtype_b: str | None = None) -> OpSignature:
        a, b = cuda_tensor((n, k), dtype), cuda_tensor((m, k), dtype_b or dtype)
        d, bias, ws = cuda_tensor((m, n), "bfloat16"), cuda_tensor((n,), "bfloat16"), cuda_tensor((33555456,), "uint8")
        return OpSignature("nvte::cublas_gemm", "default",
                           (a, True, b, False, d, bias, None, None, None, ws, accumulate, False, False), (None,))

    assert classify("nvte::cublas_gemm").name == "gemm"
    kernel, = te_cost.cublas_gemm(sig("bfloat16", False), ctx).kernels
    assert kernel.flops == 2.0 * m * n * k
    assert kernel.bytes == 2.0 * (n * k + m * k + m * n + n)
    assert kernel == gemm_kernel(GemmShape(m, n, k), "bfloat16", "bfloat16", kernel.bytes, ctx)
    accumulating, = te_cost.cublas_gemm(sig("bfloat16", True), ctx).kernels
    assert accumulating.bytes == kernel.bytes + 2.0 * m * n
    fp8, = te_cost.cublas_gemm(sig("float8_e4m3fn", False), ctx).kernels
    assert fp8.bytes == n * k + m * k + 2.0 * (m * n + n)
    assert fp8.name == "sm90_xmma_gemm_e4m3e4m3_bf16f32"
    assert fp8.duration_ns < 0.6 * kernel.duration_ns  # twice the tensor-core rate, compute-bound
    # HYBRID's backward: an E4M3 operand (weight or input) and the E5M2 gradient, at the same rate
    hybrid, = te_cost.cublas_gemm(sig("float8_e4m3fn", False, "float8_e5m2"), ctx).kernels
    assert hybrid.name == "sm90_xmma_gemm_e4m3e5m2_bf16f32"
    assert (hybrid.duration_ns, hybrid.bytes) == (fp8.duration_ns, fp8.bytes)


def test_cublas_gemm_beside_userbuffers_runs_on_the_sms_they_leave() -> None:
    """userbuffers' pipelined and bulk overlaps give their GEMMs cuBLASLt's math_sm_count = the
    SMs less num_comm_sm (16): the GEMM model on an H100 of 116 SMs, the same bytes and FLOPs."""
    gpu = lookup_gpu("h100-sxm-80gb")
    ctx = CostContext(gpu)
    m, n, k = 4096, 4096, 8192
    a, b = cuda_tensor((n, k), "bfloat16"), cuda_tensor((m, k), "bfloat16")
    d, ws = cuda_tensor((m, n), "bfloat16"), cuda_tensor((33555456,), "uint8")
    args = (a, True, b, False, d, None, None, None, None, ws, False, False, False)
    full, = te_cost.cublas_gemm(OpSignature("nvte::cublas_gemm", "default", args, (None,)), ctx).kernels
    margin, = te_cost.cublas_gemm(OpSignature("nvte::cublas_gemm", "default", (*args, 16), (None,)), ctx).kernels
    fewer = CostContext(dataclasses.replace(gpu, sm_count=gpu.sm_count - 16))
    assert margin == gemm_kernel(GemmShape(m, n, k), "bfloat16", "bfloat16", full.bytes, fewer)
    assert (margin.flops, margin.bytes) == (full.flops, full.bytes)
    assert 1.05 < margin.duration_ns / full.duration_ns < 132 / 116 + 0.05  # compute-bound: about the SMs' ratio


TE_SCRIPT = Path(__file__).resolve().parent / "scripts" / "transformer_engine_layers.py"


def test_te_layers_traced(tmp_path: Path, te_cuda_python: str) -> None:
    """TE's own LayerNormMLP and DotProductAttention in BF16, and a LayerNormLinear of FC1's shape
    under FP8 delayed scaling (phantora's `te` extra, installed by tests/conftest.py
    te_cuda_python), forward and backward on the virtual H100; and the memory of FP8 weights
    (the script checks it against a hand count)."""
    from phantora.trace.check import load_chrome_trace

    proc, trace = run_traced(tmp_path, te_cuda_python, TE_SCRIPT)
    assert_ran(proc, "stand_in", "layernorm_mlp", "dot_product_attention", "fp8_layernorm_linear", "fp8_weights")
    kernels = [e for e in load_chrome_trace(trace)["traceEvents"] if e.get("ph") == "X" and e.get("cat") == "kernel"]
    gemms = [k for k in kernels if k["args"].get("op") == "nvte::cublas_gemm.default"]
    bf16 = [k for k in gemms if k["name"] == "sm90_xmma_gemm_bf16bf16_bf16f32"]
    fp8 = [k for k in gemms if k["name"].startswith("sm90_xmma_gemm_e")]
    # LayerNormMLP: FC1 and FC2, each fprop, dgrad and wgrad; the FP8 LayerNormLinear: its three,
    # under HYBRID the forward's of two E4M3 operands, dgrad's and wgrad's with the E5M2 gradient
    assert len(bf16) == 6, [k["name"] for k in gemms]
    assert sorted(k["name"] for k in fp8) == ["sm90_xmma_gemm_e4m3e4m3_bf16f32"] + ["sm90_xmma_gemm_e4m3e5m2_bf16f32"] * 2
    s, b, h, f = 512, 2, 1024, 4096  # the script's sizes
    t = s * b
    assert [k["args"]["flops"] for k in bf16 + fp8] == [2.0 * t * h * f] * 9
    # the same three products at the FP8 rate (wgrad included: both operands read as transposes)
    assert sum(k["dur"] for k in fp8) < 0.75 * sum(k["dur"] for k in bf16) / 2
    # The casts FP8 adds to a LayerNormLinear, counted by hand (bytes moved; scale, amax and
    # scale_inv are 4 bytes each): forward, the norm writes its output in FP8 (1 byte per element)
    # and a transpose kernel makes the copy wgrad reads; the weight is cast with its transpose (for
    # dgrad); backward, the output gradient is cast with its transpose and the bias gradient.
    casts = sorted((k["name"], k["args"]["bytes"]) for k in kernels
                   if k["args"].get("op") in ("nvte::cast_transpose.default", "nvte::fp8_transpose.default"))
    assert casts == sorted([
        ("transformer_engine::transpose_kernel", 2.0 * t * h),
        ("transformer_engine::cast_transpose_kernel", 2.0 * f * h + 2 * f * h + 12),
        ("transformer_engine::cast_transpose_dbias_kernel", 2.0 * t * f + 2 * t * f + 2 * f + 12),
        # quantized_model_init's [2048, 2048] weight, cast once with its transpose after initialization
        ("transformer_engine::cast_transpose_kernel", 4.0 * 2048 * 2048 + 12),
    ])
    fp8_norm = [k for k in kernels if k["args"].get("op") == "nvte::layernorm_fwd.default"][-1]
    assert fp8_norm["args"]["bytes"] == 2 * 2.0 * t * h + 2 * 2 * h + t * h + 2 * 4 * t  # x twice, gamma, beta, z, mu, rsigma
    names = {k["name"] for k in kernels}
    assert {"transformer_engine::normalization::ln_fwd_tuned_kernel", "scaled_masked_softmax_warp_forward",
            "scaled_masked_softmax_warp_backward", "transformer_engine::delayed_scaling::kernel"} <= names, names
    # cuDNN's fused attention for the 16 x 64 causal attention: one forward kernel, and backward's
    # dO.O row sums, main kernel and dQ conversion. Counted by hand: the forward's FLOPs, QK^T and
    # PV (2 x 2 x 64 per visible score) over the 512 x 513 / 2 visible scores of each of 2 x 16
    # heads; its bytes, q, k, v read and o written (bf16) and the fp32 softmax statistics
    fwd, bwd = [k for k in kernels if k["args"].get("op", "").startswith("nvte::fused_attn")]
    assert (fwd["name"], fwd["args"]["kernels"]) == ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob", 1)
    assert (bwd["name"], bwd["args"]["kernels"]) == (
        "cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_f16_knob (+2 kernels)", 3)
    assert fwd["args"]["flops"] == 2 * 2 * 64 * (512 * 513 / 2) * 2 * 16
    assert fwd["args"]["bytes"] == 4 * s * b * 16 * 64 * 2 + b * 16 * s * 4
    assert bwd["args"]["flops"] == 2.5 * fwd["args"]["flops"]


def test_te_fused_router_holds_the_routing_models_decision(tmp_path: Path, te_cuda_python: str) -> None:
    """TE's fused top-k router (`--moe-router-fusion`) over scores without data: the routing map
    as bytes, as bits and as dense indices each hold the routing model's balanced decision when
    read on the host (the script counts them); the router's and the auxiliary loss's kernels,
    forward and backward, are each one `nvte::` op reading and writing their tensors once."""
    from phantora.trace.check import load_chrome_trace

    proc, trace = run_traced(tmp_path, te_cuda_python, "transformer_engine_router.py")
    assert_ran(proc, "bytemap", "bitmap", "dense_indices", "router_backward", "aux_loss")
    assert "8 experts, top-2, 4,096 tokens" in proc.stderr and "max/mean 1.00" in proc.stderr, proc.stderr[-3000:]
    kernels = [e for e in load_chrome_trace(trace)["traceEvents"] if e.get("ph") == "X" and e.get("cat") == "kernel"]
    router = Counter(k["name"] for k in kernels if k["args"].get("op", "").startswith(("nvte::router", "nvte::aux_loss")))
    assert router == {"transformer_engine::fused_topk_with_score_function_forward_kernel": 3,
                      "transformer_engine::fused_topk_with_score_function_backward_kernel": 1,
                      "transformer_engine::fused_score_for_moe_aux_loss_forward_kernel": 1,
                      "transformer_engine::fused_score_for_moe_aux_loss_backward_kernel": 1,
                      "transformer_engine::fused_moe_aux_loss_forward_kernel": 1,
                      "transformer_engine::fused_moe_aux_loss_backward_kernel": 1}, router
    t, e = 4096, 8
    first = next(k for k in kernels if k["name"] == "transformer_engine::fused_topk_with_score_function_forward_kernel")
    # bf16 logits read, bf16 probabilities, the bool routing map and the fp32 intermediate written
    assert first["args"]["bytes"] == t * e * (2 + 2 + 1 + 4)
