"""The virtual `transformer_engine_torch`: TE's PyTorch extension for a GPU that holds no data.

native/extension.c's exec slot calls `populate(module)`, which gives the extension module what
TE's pybind11 module defines (transformer_engine_torch 2.x, csrc/extensions/pybind.cpp and
common/util/pybind_helper.h): its enums with their C values, its classes, and its functions.
A modelled function does what the C++ one does around its kernels, in Python: it takes TE's
Python tensors and quantizers, allocates the outputs the C++ allocates (same shapes, dtypes and
buffers), and issues one `nvte::` op per kernel of the core library (ops.py) with the tensors that
kernel reads and writes. A function phantora does not model yet raises NotImplementedError naming
the rank, the function and what to change, when called; names the real extension does not have
raise AttributeError as there.

Modelled: GEMMs through cuBLASLt (generic_gemm: BF16/FP16 and per-tensor FP8 operands, FP8 read
in the TN form Hopper needs, with bias, GELU and dbias/dGELU epilogues, accumulation into the
output; te_general_grouped_gemm for GroupedLinear), LayerNorm and RMSNorm forward and backward, the activations with their backward and fused
bias gradient, the scaled (masked) softmax kernels of TE's unfused attention, its fused attention (cuDNN's
BF16/FP16 sub-backend, attention.py), MXFP8 (the tensors
from the quantizer's own buffer description, one cast kernel per quantization, GEMMs on the block
scales), and per-tensor FP8
scaling (Float8Quantizer for delayed scaling, Float8CurrentScalingQuantizer): the FP8 tensors the
C++ quantizer allocates (uint8 data, its transpose on Hopper, scale_inv), the casts (fused with
the norm, the activation or the bias gradient as the C++ chooses), the amax and scale kernels of
current scaling (with its amax all-reduce), and the delayed-scaling recipe's amax/scale update.
FP8 block scaling (Float8BlockScaling: the same cast op with 1x128 / 128x128 blocks, the
columnwise copy transposed, activations cast unfused as the C++ does). Not modelled (raising
NotImplementedError): NVFP4, the scale swizzles of MXFP8
GEMM inputs not quantized for a GEMM, FP8 fused attention, the comm+GEMM overlap variants
userbuffers.py lists, the router variants router.py leaves out, the FP8 and master-weight variants of
multi_tensor_adam, multi_tensor_unscale_l2norm and SGD.
"""

from __future__ import annotations

import enum
import types
from typing import Any, Callable

import torch

from interpose.device.transformer_engine import attention
from interpose.device.transformer_engine import ops as nvte_ops
from interpose.device.transformer_engine import router
from interpose.device.transformer_engine import userbuffers
from interpose.device.transformer_engine.attention import CUDNN_VERSION, NVTE_Fused_Attn_Backend
from interpose.device.transformer_engine.errors import not_modelled, plain

# --- enums (values from the core library's headers) --------------------------------------------


class DType(enum.IntEnum):
    kByte = 0
    kInt32 = 2
    kFloat32 = 4
    kFloat16 = 5
    kBFloat16 = 6
    kFloat8E4M3 = 7
    kFloat8E5M2 = 8
    kFloat4E2M1 = 10


class NVTE_Bias_Type(enum.IntEnum):
    NVTE_NO_BIAS = 0
    NVTE_PRE_SCALE_BIAS = 1
    NVTE_POST_SCALE_BIAS = 2
    NVTE_ALIBI = 3


class NVTE_Mask_Type(enum.IntEnum):
    NVTE_NO_MASK = 0
    NVTE_PADDING_MASK = 1
    NVTE_CAUSAL_MASK = 2
    NVTE_PADDING_CAUSAL_MASK = 3
    NVTE_CAUSAL_BOTTOM_RIGHT_MASK = 4
    NVTE_PADDING_CAUSAL_BOTTOM_RIGHT_MASK = 5


class NVTE_Softmax_Type(enum.IntEnum):
    NVTE_VANILLA_SOFTMAX = 0
    NVTE_OFF_BY_ONE_SOFTMAX = 1
    NVTE_LEARNABLE_SOFTMAX = 2


class NVTE_QKV_Format(enum.IntEnum):
    NVTE_SBHD = 0
    NVTE_BSHD = 1
    NVTE_THD = 2
    NVTE_BSHD_2SBHD = 3
    NVTE_SBHD_2BSHD = 4
    NVTE_THD_2BSHD = 5
    NVTE_THD_2SBHD = 6
    NVTE_BHSD = 7
    NVTE_QKV_Format_NOT_SET = 8


NVTE_QKV_Layout = enum.IntEnum("NVTE_QKV_Layout", [(name, i) for i, name in enumerate((
    "NVTE_SB3HD", "NVTE_SBH3D", "NVTE_SBHD_SB2HD", "NVTE_SBHD_SBH2D", "NVTE_SBHD_SBHD_SBHD", "NVTE_BS3HD",
    "NVTE_BSH3D", "NVTE_BSHD_BS2HD", "NVTE_BSHD_BSH2D", "NVTE_BSHD_BSHD_BSHD", "NVTE_T3HD", "NVTE_TH3D",
    "NVTE_THD_T2HD", "NVTE_THD_TH2D", "NVTE_THD_THD_THD", "NVTE_SBHD_BSHD_BSHD", "NVTE_BSHD_SBHD_SBHD",
    "NVTE_THD_BSHD_BSHD", "NVTE_THD_SBHD_SBHD", "NVTE_Paged_KV_BSHD_BSHD_BSHD", "NVTE_Paged_KV_BSHD_SBHD_SBHD",
    "NVTE_Paged_KV_SBHD_BSHD_BSHD", "NVTE_Paged_KV_SBHD_SBHD_SBHD", "NVTE_Paged_KV_THD_BSHD_BSHD",
    "NVTE_Paged_KV_THD_SBHD_SBHD", "NVTE_BHSD_BHSD_BHSD", "NVTE_QKV_Layout_NOT_SET"))])


class NVTEScalingMode(enum.IntEnum):
    NVTE_DELAYED_TENSOR_SCALING = 0
    NVTE_MXFP8_1D_SCALING = 1
    NVTE_BLOCK_SCALING_1D = 2
    NVTE_BLOCK_SCALING_2D = 3
    NVTE_NVFP4_1D_SCALING = 4
    NVTE_INVALID_SCALING = 100


class Float8BlockScaleTensorFormat(enum.IntEnum):
    GEMM_READY = 0
    COMPACT = 1
    INVALID = 2


class CommOverlapType(enum.IntEnum):
    RS = 0
    AG = 1


CommOverlapAlgo = enum.IntEnum("CommOverlapAlgo", [(name, i) for i, name in enumerate((
    "BULK_OVERLAP_AG", "BULK_OVERLAP_RS", "SPLIT_PIPELINED_AG_P2P", "SPLIT_PIPELINED_RS", "SPLIT_PIPELINED_RS_P2P",
    "ATOMIC_GEMM_RS", "ATOMIC_GEMM_AG_P2P", "ATOMIC_GEMM_RS_P2P", "EXTERNAL_BULK_OVERLAP_AG"))])

FP8FwdTensors = enum.IntEnum("FP8FwdTensors", [(name, i) for i, name in enumerate((
    "GEMM1_INPUT", "GEMM1_WEIGHT", "GEMM1_OUTPUT", "GEMM2_INPUT", "GEMM2_WEIGHT", "GEMM2_OUTPUT",
    "GEMM3_INPUT", "GEMM3_WEIGHT", "GEMM3_OUTPUT"))])
FP8BwdTensors = enum.IntEnum("FP8BwdTensors", [(name, i) for i, name in enumerate((
    "GRAD_OUTPUT1", "GRAD_INPUT1", "GRAD_OUTPUT2", "GRAD_INPUT2", "GRAD_OUTPUT3", "GRAD_INPUT3"))])


class NVTERoutingMapFormat(enum.IntEnum):
    BYTEMAP = 0
    BITMAP_U8 = 1


class NVTEQBHistogramMode(enum.IntEnum):
    TWO_KERNEL = 0
    FUSED_ATOMIC = 1


ENUMS = (DType, NVTE_Bias_Type, NVTE_Mask_Type, NVTE_Softmax_Type, NVTE_QKV_Format, NVTE_QKV_Layout,
         NVTE_Fused_Attn_Backend, NVTEScalingMode, Float8BlockScaleTensorFormat, CommOverlapType, CommOverlapAlgo,
         FP8FwdTensors, FP8BwdTensors, NVTERoutingMapFormat, NVTEQBHistogramMode)

TORCH_DTYPES = {
    DType.kByte: torch.uint8, DType.kInt32: torch.int32, DType.kFloat32: torch.float32,
    DType.kFloat16: torch.float16, DType.kBFloat16: torch.bfloat16, DType.kFloat8E4M3: torch.float8_e4m3fn,
    DType.kFloat8E5M2: torch.float8_e5m2,
}

# What the virtual machine reports: cuBLASLt 13.1.1 (cublasLtGetVersion; cuDNN's version is in
# attention.py); the core library's compute streams for grouped GEMMs (nvte_get_num_compute_streams).
CUBLASLT_VERSION = 130101
NUM_COMPUTE_STREAMS = 4


def _unmodelled_function(name: str) -> Callable[..., Any]:
    def call(*args: Any, **kwargs: Any) -> Any:
        raise not_modelled(f"extension function transformer_engine_torch.{name}")
    call.__name__ = name
    return call


class FP8TensorMeta:
    def __init__(self) -> None:
        self.scale: torch.Tensor | None = None
        self.scale_inv: torch.Tensor | None = None
        self.amax_history: torch.Tensor | None = None


CLASSES = (*userbuffers.CLASSES, FP8TensorMeta)


# --- tensors ---------------------------------------------------------------------------------

def _torch_dtype(dtype: Any) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    return TORCH_DTYPES[DType(int(dtype))]


def _empty(shape: Any, dtype: torch.dtype, device: torch.device, quantizer: Any, what: str) -> torch.Tensor:
    if quantizer is not None:
        raise not_modelled(f"{what} with a quantized output ({type(quantizer).__name__})")
    return torch.empty(tuple(int(s) for s in shape), dtype=dtype, device=device)


def _flat2d(shape: Any) -> tuple[int, int]:
    """get_2d_dims: every dimension but the last, flattened, and the last."""
    if len(shape) == 0:
        return 1, 1
    rows = 1
    for s in shape[:-1]:
        rows *= int(s)
    return rows, int(shape[-1])


# --- FP8 tensors (per-tensor scaling: delayed and current) ------------------------------------------

def _te_classes() -> types.SimpleNamespace:
    """TE's Python classes the extension builds and recognizes (the C++ extension imports them at
    init: Float8Tensor, Float8TensorStorage, the quantizers)."""
    from transformer_engine.pytorch.tensor.float8_tensor import (
        Float8CurrentScalingQuantizer, Float8Quantizer, Float8Tensor)
    from transformer_engine.pytorch.tensor.float8_blockwise_tensor import Float8BlockQuantizer
    from transformer_engine.pytorch.tensor.mxfp8_tensor import MXFP8Quantizer
    from transformer_engine.pytorch.tensor.storage.float8_blockwise_tensor_storage import (
        Float8BlockwiseQTensorStorage)
    from transformer_engine.pytorch.tensor.storage.float8_tensor_storage import Float8TensorStorage
    from transformer_engine.pytorch.tensor.storage.mxfp8_tensor_storage import MXFP8TensorStorage
    return types.SimpleNamespace(Float8Quantizer=Float8Quantizer, Float8CurrentScalingQuantizer=Float8CurrentScalingQuantizer,
                                 Float8Tensor=Float8Tensor, Float8TensorStorage=Float8TensorStorage,
                                 MXFP8Quantizer=MXFP8Quantizer, MXFP8TensorStorage=MXFP8TensorStorage,
                                 Float8BlockQuantizer=Float8BlockQuantizer,
                                 Float8BlockwiseQTensorStorage=Float8BlockwiseQTensorStorage)


def _non_tn_fp8_gemm() -> bool:
    """nvte_is_non_tn_fp8_gemm_supported: Blackwell (SM 10.x, 11.x) and SM 13+ take FP8 GEMM operands
    in any layout; Hopper needs both in TN form, so FP8 tensors keep a transpose for that."""
    major, minor = torch.cuda.get_device_capability()
    return (10, 0) <= (major, minor) < (12, 0) or (major, minor) >= (13, 0)


def _scaling_kind(quantizer: Any) -> str | None:
    """"delayed" / "current" for TE's per-tensor FP8 quantizers, "mxfp8" for its MXFP8 one,
    "block1d" / "block2d" for FP8 block scaling, None for any other."""
    if quantizer is None or not type(quantizer).__module__.startswith("transformer_engine."):
        return None
    te = _te_classes()
    if isinstance(quantizer, te.Float8Quantizer):
        return "delayed"
    if isinstance(quantizer, te.Float8CurrentScalingQuantizer):
        return "current"
    if isinstance(quantizer, te.MXFP8Quantizer):
        return "mxfp8"
    if isinstance(quantizer, te.Float8BlockQuantizer):
        return f"block{quantizer.block_scaling_dim}d"
    return None


def _contiguous_strides(shape: list[int] | tuple[int, ...]) -> list[int]:
    stride = [1] * len(shape)
    for i in range(len(shape) - 2, -1, -1):
        stride[i] = stride[i + 1] * shape[i + 1]
    return stride


def _make_from_spec(quantizer: Any, shape: Any, fake_dtype: torch.dtype, device: Any) -> Any:
    """A quantized tensor from the quantizer's own description of the buffers the C++ allocates
    (Quantizer.inner_tensor_specs / storage_metadata, which TE keeps slot-for-slot equal to
    csrc/quantizer.cpp for torch.compile's fake tensors)."""
    shape = tuple(int(s) for s in shape)
    inner = quantizer.alloc_tensors(shape, device=device)
    ctx = quantizer.create_metadata(shape, dtype=fake_dtype)
    return ctx["cls"].__tensor_unflatten__(inner, ctx, shape, tuple(_contiguous_strides(shape)))


def _make_float8(quantizer: Any, shape: Any, fake_dtype: torch.dtype, device: Any) -> Any:
    """Float8Quantizer::create_tensor: uint8 data (rowwise usage, or any usage where non-TN GEMMs
    exist), its transpose [last, rest..] (columnwise usage on Hopper), a [1] fp32 scale_inv; a
    Float8TensorStorage for an internal quantizer, else a Float8Tensor."""
    te = _te_classes()
    shape = [int(s) for s in shape]
    non_tn = _non_tn_fp8_gemm()
    data = torch.empty(shape, dtype=torch.uint8, device=device) if quantizer.rowwise_usage or non_tn else None
    transpose = None
    if quantizer.columnwise_usage and not non_tn:
        transpose = torch.empty([shape[-1], *shape[:-1]], dtype=torch.uint8, device=device)
    scale_inv = torch.empty(1, dtype=torch.float32, device=device)
    if quantizer.internal:
        return te.Float8TensorStorage(data=data, fp8_scale_inv=scale_inv, fp8_dtype=quantizer.dtype,
                                      data_transpose=transpose, quantizer=quantizer, fake_dtype=fake_dtype)
    return te.Float8Tensor(shape=shape, stride=_contiguous_strides(shape), dtype=fake_dtype, data=data, fp8_scale_inv=scale_inv,
                           fp8_dtype=quantizer.dtype, data_transpose=transpose, quantizer=quantizer, device=device)


def _quantized_empty(quantizer: Any, shape: Any, fake_dtype: torch.dtype, device: Any, what: str) -> Any:
    kind = _scaling_kind(quantizer)
    if kind is None:
        raise not_modelled(f"{what} with a {type(quantizer).__name__} output (FP8 with per-tensor scaling, "
                           f"Float8Quantizer and Float8CurrentScalingQuantizer, MXFP8 and FP8 block scaling are "
                           f"modelled)")
    if kind in ("delayed", "current"):
        return _make_float8(quantizer, shape, fake_dtype, device)
    return _make_from_spec(quantizer, shape, fake_dtype, device)


def _fp8_view(data: torch.Tensor | None, fp8_dtype: Any) -> torch.Tensor | None:
    return None if data is None else data.view(_torch_dtype(fp8_dtype))


def _quantize_into(x: torch.Tensor, quantizer: Any, out: Any, *, dy: torch.Tensor | None = None,
                   dbias: torch.Tensor | None = None, act: str = "", amax_computed: bool = False) -> None:
    """Float8Quantizer::quantize (delayed: one cast(+transpose) kernel reading the quantizer's scale
    and updating its amax) / Float8CurrentScalingQuantizer::quantize (the amax first, all-reduced
    over the quantizer's group when asked, the scale from it, then the cast). `amax_computed`: the
    kernel that produced x computed its amax as well (TE's FUSED_NORM_AMAX_FP8 and
    FUSED_ACTIVATION_AMAX_FP8), so no amax kernel reads x again."""
    kind = _scaling_kind(quantizer)
    nvte_ops.define_ops()
    if kind in ("mxfp8", "block1d", "block2d"):  # one kernel: block amaxes and scales computed as it casts
        if act and kind != "mxfp8":  # the C++ fuses activations only into MXFP8's cast (UNFUSED otherwise)
            hp = torch.empty(x.shape if dy is None else dy.shape, dtype=x.dtype, device=x.device)
            torch.ops.nvte.activation(x, hp, act) if dy is None else torch.ops.nvte.activation_bwd(dy, x, hp, dbias, act)
            x, dy, dbias, act = hp, None, None, ""
        torch.ops.nvte.quantize_blocks(x, dy, _fp8_view(out._rowwise_data, out._fp8_dtype), out._rowwise_scale_inv,
                                       _fp8_view(out._columnwise_data, out._fp8_dtype), out._columnwise_scale_inv,
                                       dbias, act, kind)
        return
    data, transpose = _fp8_view(out._data, out._fp8_dtype), _fp8_view(out._transpose, out._fp8_dtype)
    if kind == "delayed":
        torch.ops.nvte.cast_transpose(x, dy, quantizer.scale, quantizer.amax, out._scale_inv, data, transpose,
                                      dbias, act)
        return
    if kind != "current":
        raise not_modelled(f"quantization with {type(quantizer).__name__}")
    amax = torch.empty(1, dtype=torch.float32, device=x.device)
    scale = torch.empty(1, dtype=torch.float32, device=x.device)
    if act:  # the activation is computed in high precision, with its amax, then cast
        hp = torch.empty(x.shape if dy is None else dy.shape, dtype=x.dtype, device=x.device)
        torch.ops.nvte.activation(x, hp, act) if dy is None else torch.ops.nvte.activation_bwd(dy, x, hp, dbias, act)
        x, dy, dbias, act, amax_computed = hp, None, None, "", True
    if not amax_computed:
        torch.ops.nvte.compute_amax(x, amax)
    if quantizer.with_amax_reduction:
        import torch.distributed as dist
        dist.all_reduce(amax, op=dist.ReduceOp.MAX, group=quantizer.amax_reduction_group)
    torch.ops.nvte.compute_scale(amax, scale, out._scale_inv)
    torch.ops.nvte.cast_transpose(x, None, scale, None, out._scale_inv, data, transpose, dbias, "")


def quantize(tensor: torch.Tensor, quantizer: Any, output: Any = None, noop: Any = None) -> Any:
    x = plain(tensor, "quantize").contiguous()
    out = output if output is not None else _quantized_empty(quantizer, x.shape, x.dtype, x.device, "quantize")
    if x.numel() != 0:  # the kernel launches whatever `noop` holds (it skips its work on the GPU)
        _quantize_into(x, quantizer, out)
    return out


def multi_tensor_quantize(tensor_list: list, quantizer_list: list) -> list:
    """Each tensor quantized with its quantizer (the C++ fuses the per-tensor casts into one
    multi-tensor cast+transpose launch; here each is its own cast kernel)."""
    return [quantize(t, q) for t, q in zip(tensor_list, quantizer_list)]


def split_quantize(tensor: torch.Tensor, split_sections: Any, quantizer_list: list,
                   disable_bulk_allocation: bool = False) -> list:
    """The input split along dim 0 into `split_sections` rows (GroupedLinear's per-expert
    tokens), each part quantized with its quantizer."""
    x = plain(tensor, "split_quantize").contiguous()
    if len(quantizer_list) != len(split_sections):
        raise RuntimeError(f"Expected {len(split_sections)} quantizers, but got {len(quantizer_list)}")
    parts = torch.split(x, [int(n) for n in split_sections], dim=0)
    return [quantize(part, q) for part, q in zip(parts, quantizer_list)]


def create_empty_quantized_tensor(quantizer: Any, shape: Any, dtype: torch.dtype, device: Any,
                                  pin_memory: bool = False) -> Any:
    return _quantized_empty(quantizer, shape, dtype, device, "create_empty_quantized_tensor")


def bgrad_quantize(input: torch.Tensor, quantizer: Any) -> list[Any]:
    """The bias gradient (column sums) and the quantized input, in one cast+transpose+dbias kernel."""
    x = plain(input, "bgrad_quantize").contiguous()
    dbias = torch.empty(int(x.shape[-1]), dtype=x.dtype, device=x.device)
    if quantizer is None:
        raise not_modelled("bgrad_quantize without a quantizer")
    out = _quantized_empty(quantizer, x.shape, x.dtype, x.device, "bgrad_quantize")
    _quantize_into(x, quantizer, out, dbias=dbias)
    return [dbias, out]


def dequantize(input: Any, otype: Any) -> torch.Tensor:
    """A per-tensor FP8 tensor back in high precision, from its rowwise data."""
    if not hasattr(input, "_transpose"):
        raise not_modelled(f"dequantize of a {type(input).__name__}")
    data = input._data
    if data is None:
        raise not_modelled("dequantize of an FP8 tensor that holds only its transpose")
    out = torch.empty(data.shape, dtype=_torch_dtype(otype), device=data.device)
    nvte_ops.define_ops()
    torch.ops.nvte.dequantize(_fp8_view(data, input._fp8_dtype), input._scale_inv, out)
    return out


def fp8_transpose(input: torch.Tensor, dtype: Any, *, out: torch.Tensor | None = None) -> torch.Tensor:
    if out is None:
        out = torch.empty([int(input.shape[-1]), *[int(s) for s in input.shape[:-1]]], dtype=input.dtype,
                          device=input.device)
    nvte_ops.define_ops()
    torch.ops.nvte.fp8_transpose(_fp8_view(input, dtype), _fp8_view(out, dtype))
    return out


def fused_amax_and_scale_update_after_reduction(amax_reduction_buffer: torch.Tensor, amax_histories: list,
                                                scales: list, amax_compute_algo: str, fp8_dtype: Any,
                                                margin: float) -> None:
    nvte_ops.define_ops()
    torch.ops.nvte.amax_and_scale_update(amax_reduction_buffer, list(amax_histories), list(scales))


def _gemm_operand(t: Any, trans: bool, is_a: bool) -> tuple[torch.Tensor, torch.Tensor | None, bool]:
    """The buffer a GEMM operand is read from, its scale_inv, and the layout flag it is read with.
    FP8 operands on Hopper are read in TN form (A transposed, B not): the rowwise data when the
    GEMM reads the operand that way, else its transpose, with the flag flipped (cuBLASLt's operand
    canonicalization in TE's core library)."""
    if not hasattr(t, "_fp8_dtype"):
        return plain(t, "generic_gemm"), None, trans
    if isinstance(t, _te_classes().MXFP8TensorStorage):
        # MXFP8 keeps both usages in the logical layout, each with its own block scales: a GEMM
        # reads the rowwise copy where it reads the operand along K by rows, else the columnwise one
        rowwise = trans if is_a else not trans
        data, scale = (t._rowwise_data, t._rowwise_scale_inv) if rowwise else (t._columnwise_data,
                                                                             t._columnwise_scale_inv)
        if data is None:
            raise RuntimeError(f"GEMM needs the {'rowwise' if rowwise else 'columnwise'} MXFP8 data of a "
                               f"{type(t).__name__}, which it does not hold")
        return _fp8_view(data, t._fp8_dtype), scale, trans
    if isinstance(t, _te_classes().Float8BlockwiseQTensorStorage):
        # FP8 block scaling keeps its columnwise copy transposed, as per-tensor FP8 on Hopper: read in
        # TN form (on Blackwell the core library converts the scales to MXFP8's first; not modelled)
        rowwise = trans if is_a else not trans
        if rowwise and t._rowwise_data is not None:
            return _fp8_view(t._rowwise_data, t._fp8_dtype), t._rowwise_scale_inv, trans
        if t._columnwise_data is None:
            raise RuntimeError(f"GEMM needs the columnwise FP8 data of a {type(t).__name__}, which it does not hold")
        data = t._columnwise_data
        return _fp8_view(data.reshape(data.shape[0], -1), t._fp8_dtype), t._columnwise_scale_inv, not trans
    if not hasattr(t, "_transpose"):
        raise not_modelled(f"GEMM with a {type(t).__name__} operand (only per-tensor FP8, MXFP8 and FP8 block "
                           f"scaling are modelled)")
    wanted_rowwise = trans if is_a else not trans
    if _non_tn_fp8_gemm() or (wanted_rowwise and t._data is not None):
        if t._data is None:
            raise RuntimeError(f"GEMM operand {type(t).__name__} has no rowwise data")
        return _fp8_view(t._data, t._fp8_dtype), t._scale_inv, trans
    source = t._transpose if not wanted_rowwise else None
    if source is None:
        raise RuntimeError(f"GEMM needs the {'rowwise' if wanted_rowwise else 'columnwise'} FP8 data of a "
                           f"{type(t).__name__}, which it does not hold (Hopper FP8 GEMMs are TN only)")
    # the transpose of the operand's 2D form [rows, cols] is [cols, rows], whatever its N-D shape
    return _fp8_view(source.reshape(source.shape[0], -1), t._fp8_dtype), t._scale_inv, not trans


def _logical_shape(t: Any) -> list[int]:
    if not hasattr(t, "_fp8_dtype"):
        return list(t.shape)
    if hasattr(t, "_rowwise_data"):  # MXFP8: both copies in the logical layout; block scaling: columnwise transposed
        if t._rowwise_data is not None:
            return list(t._rowwise_data.shape)
        shape = list(t._columnwise_data.shape)
        return shape if isinstance(t, _te_classes().MXFP8TensorStorage) else [*shape[1:], shape[0]]
    if t._data is not None:
        return list(t._data.shape)
    shape = list(t._transpose.shape)
    return [*shape[1:], shape[0]]


# --- GEMM --------------------------------------------------------------------------------------

def gemm_output_shape(a_shape: Any, transa: bool, b_shape: Any, transb: bool) -> list[int]:
    """The C++ extension's getGemmOutputShape (no comm+GEMM overlap)."""
    a0, a1 = _flat2d(a_shape)
    b0, b1 = _flat2d(b_shape)
    if (a1 if transa else a0) != (b0 if transb else b1):
        raise RuntimeError(f"Invalid matrix dimensions for GEMM (A=({a0},{a1}), transa={transa}, "
                           f"B=({b0},{b1}), transb={transb})")
    out = [b1] if transb else [int(s) for s in b_shape[:-1]]
    out.append(a0 if transa else a1)
    return out


def generic_gemm(A: Any, transA: bool, B: Any, transB: bool, D: Any, quantizer: Any, output_dtype: Any,
                 bias: torch.Tensor | None, bias_type: Any, gelu: bool, gelu_in: torch.Tensor | None, grad: bool,
                 workspace: torch.Tensor, workspace_size: int, accumulate: bool, use_split_accumulator: bool,
                 comm_overlap: Any = None, comm_type: Any = None, extra_output: Any = None,
                 bulk_overlap: bool = False, alpha: float = 1.0, beta: float | None = None) -> list[Any]:
    """The extension's gemm(): one cuBLASLt GEMM (nvte_cublas_gemm_v2) with its epilogue; with
    `comm_overlap`, the GEMM in chunks around the userbuffers' communication (userbuffers.py)."""
    if not accumulate and beta not in (None, 0.0):
        raise RuntimeError("Trying to use non-zero beta while not accumulating into D tensor.")
    a_shape, b_shape = _logical_shape(A), _logical_shape(B)
    d_shape = gemm_output_shape(a_shape, transA, b_shape, transB)
    a, a_scale_inv, transa = _gemm_operand(A, bool(transA), is_a=True)
    b, b_scale_inv, transb = _gemm_operand(B, bool(transB), is_a=False)
    low_precision = a_scale_inv is not None or b_scale_inv is not None
    device = workspace.device
    out_dtype = _torch_dtype(output_dtype) if output_dtype is not None else a.dtype
    if D is None:
        D = torch.empty(d_shape, dtype=out_dtype, device=device) if quantizer is None else \
            _quantized_empty(quantizer, d_shape, out_dtype, device, "GEMM")
    # a quantized output is written by the GEMM itself only for per-tensor FP8 inputs and a delayed
    # scaling quantizer; otherwise the GEMM writes high precision and the extension quantizes it
    fused_quantize = quantizer is not None and low_precision and _scaling_kind(quantizer) == "delayed"
    if quantizer is None:
        d_buffer = plain(D, "generic_gemm output")
    elif fused_quantize:
        d_buffer = _fp8_view(D._data, D._fp8_dtype)
    else:
        d_buffer = torch.empty(d_shape, dtype=out_dtype, device=device)
    bias_arg = None
    bias_grad = None
    if bias is not None:
        if grad:
            bias_grad = torch.empty(int(b_shape[-1]), dtype=d_buffer.dtype if quantizer is None else out_dtype,
                                    device=device)
            bias_arg = bias_grad
        else:
            bias_arg = bias.contiguous()
    pre_gelu_out = None
    if gelu:
        gelu_dtype = _torch_dtype(bias_type) if low_precision else out_dtype
        pre_gelu_out = gelu_in if grad else torch.empty(d_shape, dtype=gelu_dtype, device=device)
    if a.numel() == 0 or b.numel() == 0:
        if d_buffer.numel() != 0 and not accumulate:
            d_buffer.zero_()
        if bias_grad is not None and grad:
            bias_grad.zero_()
    else:
        nvte_ops.define_ops()

        def gemm(a: torch.Tensor, b: torch.Tensor, d: torch.Tensor, aux: torch.Tensor | None,
                 bias: torch.Tensor | None, sm_margin: int) -> None:
            torch.ops.nvte.cublas_gemm(a, transa, b, transb, d, bias, aux, a_scale_inv, b_scale_inv, workspace,
                                       bool(accumulate), bool(grad), bool(gelu), sm_margin)

        if comm_overlap is None:
            gemm(a, b, d_buffer, pre_gelu_out, bias_arg, 0)
        else:  # the userbuffers' all-gather or reduce-scatter inside the call, overlapped with the GEMM
            userbuffers.overlapped_gemm(comm_overlap, comm_type, bool(bulk_overlap), gemm, a, transa, b, d_buffer,
                                        pre_gelu_out, bias_arg, extra_output)
    if quantizer is not None and not fused_quantize:
        _quantize_into(d_buffer, quantizer, D)
    return [D, bias_grad, pre_gelu_out if gelu and not grad else None, extra_output]


def te_general_grouped_gemm(A: list, transa: bool, B: list, transb: bool, D: Any, D_type: Any, m_splits: Any,
                            bias: list, bias_type: Any, single_output: bool, pre_gelu_out: list, grad: bool,
                            workspace: list, workspaceSize: int, accumulate: bool, use_split_accumulator: bool,
                            math_sm_count: int = 0) -> list:
    """The extension's te_general_grouped_gemm: each group's GEMM (output shapes by
    getGemmOutputShape; with single_output, consecutive row blocks of D[0]), empty groups
    zeroed, the rest in one nvte_multi_stream_cublas_gemm call."""
    if single_output and D is None:
        raise RuntimeError("not implemented, D should be allocated for single output case.")
    dtype = _torch_dtype(D_type)
    device = workspace[0].device
    a_used, b_used, d_used, bias_used = [], [], [], []
    flags: tuple[bool, bool] | None = None
    row = 0
    for i in range(len(A)):
        shape = gemm_output_shape(_logical_shape(A[i]), transa, _logical_shape(B[i]), transb)
        if single_output:
            out = D[0][row:row + shape[0]]
            row += shape[0]
        elif D is None:
            out = torch.empty(shape, dtype=dtype, device=device)
        else:
            out = D[i]
        a, _, ta = _gemm_operand(A[i], bool(transa), is_a=True)
        b, _, tb = _gemm_operand(B[i], bool(transb), is_a=False)
        if a.numel() == 0 or b.numel() == 0:
            if out.numel() != 0 and not accumulate:
                out.zero_()
            if bias[i].numel() != 0 and grad:
                bias[i].zero_()
            continue
        if pre_gelu_out[i].numel() != 0:
            raise not_modelled("grouped GEMM with a GELU epilogue")
        flags = (ta, tb)
        a_used.append(a)
        b_used.append(b)
        d_used.append(out)
        bias_used.append(bias[i])
    if flags is not None:
        nvte_ops.define_ops()
        torch.ops.nvte.grouped_gemm(a_used, flags[0], b_used, flags[1], d_used, bias_used, bool(accumulate),
                                    bool(grad))
    return bias


# --- normalization -----------------------------------------------------------------------------

def _norm_output(x: torch.Tensor, ln_out: Any, quantizer: Any, otype: Any, what: str) -> tuple[Any, torch.Tensor, bool]:
    """(the output TE returns, the buffer the norm kernel writes, whether a cast follows). A
    delayed-scaling FP8 output is written by the norm kernel itself (FULLY_FUSED), its transpose by
    a transpose kernel after it; any other quantized output is normalized in high precision, then
    quantized (current scaling: the amax, the scale and the cast)."""
    out_dtype = _torch_dtype(otype)
    if quantizer is None:
        out = ln_out if ln_out is not None else torch.empty(x.shape, dtype=out_dtype, device=x.device)
        return out, plain(out, f"{what} output"), False
    out = ln_out if ln_out is not None else _quantized_empty(quantizer, x.shape, out_dtype, x.device, what)
    if _scaling_kind(quantizer) == "delayed" and out._data is not None:
        return out, _fp8_view(out._data, out._fp8_dtype), False
    return out, torch.empty(x.shape, dtype=out_dtype, device=x.device), True


def _finish_norm_output(out: Any, written: torch.Tensor, quantizer: Any, cast: bool) -> None:
    if cast:  # current scaling: the norm kernel computed the amax too (FUSED_NORM_AMAX_FP8)
        _quantize_into(written, quantizer, out, amax_computed=_scaling_kind(quantizer) == "current")
    elif quantizer is not None and out._transpose is not None:
        torch.ops.nvte.fp8_transpose(written, _fp8_view(out._transpose, out._fp8_dtype))


def layernorm_fwd(input: Any, weight: Any, bias: Any, eps: float, ln_out: Any, quantizer: Any, otype: Any,
                  sm_margin: int, zero_centered_gamma: bool) -> list[Any]:
    x = plain(input, "layernorm_fwd")
    rows, _ = _flat2d(x.shape)
    mu = torch.empty(rows, dtype=torch.float32, device=x.device)
    rsigma = torch.empty(rows, dtype=torch.float32, device=x.device)
    out, written, cast = _norm_output(x, ln_out, quantizer, otype, "LayerNorm")
    nvte_ops.define_ops()
    torch.ops.nvte.layernorm_fwd(x, plain(weight, "layernorm_fwd"), bias, written, mu, rsigma, float(eps),
                                 bool(zero_centered_gamma))
    _finish_norm_output(out, written, quantizer, cast)
    return [out, mu, rsigma]


def rmsnorm_fwd(input: Any, weight: Any, eps: float, ln_out: Any, quantizer: Any, otype: Any, sm_margin: int,
                zero_centered_gamma: bool) -> list[Any]:
    x = plain(input, "rmsnorm_fwd")
    rows, _ = _flat2d(x.shape)
    rsigma = torch.empty(rows, dtype=torch.float32, device=x.device)
    out, written, cast = _norm_output(x, ln_out, quantizer, otype, "RMSNorm")
    nvte_ops.define_ops()
    torch.ops.nvte.rmsnorm_fwd(x, plain(weight, "rmsnorm_fwd"), written, rsigma, float(eps),
                               bool(zero_centered_gamma))
    _finish_norm_output(out, written, quantizer, cast)
    return [out, None, rsigma]


def layernorm_bwd(dz: torch.Tensor, x: torch.Tensor, mu: torch.Tensor, rsigma: torch.Tensor, gamma: torch.Tensor,
                  sm_margin: int = 0, zero_centered_gamma: bool = False) -> list[Any]:
    dz, x, mu, rsigma, gamma = (t.contiguous() for t in (dz, x, mu, rsigma, gamma))
    dx, dgamma, dbeta = torch.empty_like(x), torch.empty_like(gamma), torch.empty_like(gamma)
    nvte_ops.define_ops()
    torch.ops.nvte.layernorm_bwd(dz, x, mu, rsigma, gamma, dx, dgamma, dbeta, bool(zero_centered_gamma))
    return [dx, dgamma, dbeta]


def rmsnorm_bwd(dz: torch.Tensor, x: torch.Tensor, rsigma: torch.Tensor, gamma: torch.Tensor, sm_margin: int = 0,
                zero_centered_gamma: bool = False) -> list[Any]:
    dz, x, rsigma, gamma = (t.contiguous() for t in (dz, x, rsigma, gamma))
    dx, dgamma = torch.empty_like(x), torch.empty_like(gamma)
    nvte_ops.define_ops()
    torch.ops.nvte.rmsnorm_bwd(dz, x, rsigma, gamma, dx, dgamma, bool(zero_centered_gamma))
    return [dx, dgamma]


# --- activations -------------------------------------------------------------------------------

# The extension's activations: name -> (kind, gated). Gated ones (GLU family) take [.., 2n] and
# give [.., n].
ACTIVATIONS = {
    "gelu": False, "relu": False, "srelu": False, "qgelu": False, "silu": False,
    "glu": True, "geglu": True, "reglu": True, "sreglu": True, "qgeglu": True, "swiglu": True,
}


def _activation(kind: str, gated: bool) -> Callable[..., Any]:
    def forward(input: torch.Tensor, quantizer: Any) -> Any:
        x = plain(input, kind).contiguous()
        shape = list(x.shape)
        if gated:
            shape[-1] //= 2
        nvte_ops.define_ops()
        if quantizer is None:
            y = torch.empty(shape, dtype=x.dtype, device=x.device)
            torch.ops.nvte.activation(x, y, kind)
            return y
        y = _quantized_empty(quantizer, shape, x.dtype, x.device, f"activation {kind}")
        _quantize_into(x, quantizer, y, act=kind)  # activation, cast (and transpose) in one kernel
        return y
    forward.__name__ = kind
    return forward


def _dactivation(kind: str, with_dbias: bool) -> Callable[..., Any]:
    name = f"dbias_d{kind}" if with_dbias else f"d{kind}"

    def backward(grad: torch.Tensor, fwd_input: torch.Tensor, quantizer: Any) -> Any:
        dy, x = plain(grad, name).contiguous(), plain(fwd_input, name).contiguous()
        dbias = torch.empty(int(x.shape[-1]), dtype=dy.dtype, device=x.device) if with_dbias else None
        nvte_ops.define_ops()
        if quantizer is None:
            dx = torch.empty(x.shape, dtype=dy.dtype, device=x.device)
            torch.ops.nvte.activation_bwd(dy, x, dx, dbias, kind)
        else:
            dx = _quantized_empty(quantizer, x.shape, dy.dtype, x.device, f"activation backward {name}")
            _quantize_into(x, quantizer, dx, dy=dy, dbias=dbias, act=kind)
        return [dbias, dx] if with_dbias else dx
    backward.__name__ = name
    return backward


# --- the softmax kernels of unfused attention ---------------------------------------------------

SOFTMAX_KINDS = ("scaled", "scaled_masked", "scaled_upper_triang_masked", "scaled_aligned_causal_masked")


def _softmax_forward(kind: str) -> Callable[..., Any]:
    masked = kind == "scaled_masked"

    def forward(input: torch.Tensor, *rest: Any) -> torch.Tensor:
        mask, scale = (rest[0], rest[1]) if masked else (None, rest[0])
        x = input.contiguous()
        y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
        nvte_ops.define_ops()
        torch.ops.nvte.softmax_fwd(x, None if mask is None else mask.contiguous(), y, float(scale), kind)
        return y
    forward.__name__ = f"{kind}_softmax_forward"
    return forward


def _softmax_backward(kind: str) -> Callable[..., Any]:
    def backward(output_grads: torch.Tensor, softmax_results: torch.Tensor, scale: float) -> torch.Tensor:
        dy, y = output_grads.contiguous(), softmax_results.contiguous()
        dx = torch.empty(dy.shape, dtype=dy.dtype, device=dy.device)
        nvte_ops.define_ops()
        torch.ops.nvte.softmax_bwd(dy, y, dx, float(scale), kind)
        return dx
    backward.__name__ = f"{kind}_softmax_backward"
    return backward


# --- rotary position embedding and the optimizer ---------------------------------------------------

def _rope(backward: bool) -> Callable[..., Any]:
    def apply(t: torch.Tensor, freqs: torch.Tensor, start_positions: Any, qkv_format: Any, interleaved: bool,
              cu_seqlens: Any, cp_size: int, cp_rank: int) -> torch.Tensor:
        if freqs.dim() != 4 or freqs.dtype != torch.float32:
            raise RuntimeError("expected a 4D float32 freqs tensor")
        y = torch.empty(t.shape, dtype=t.dtype, device=t.device)
        nvte_ops.define_ops()
        torch.ops.nvte.rope(t, freqs, y, backward)
        return y
    apply.__name__ = "fused_rope_backward" if backward else "fused_rope_forward"
    return apply


def multi_tensor_adam(chunk_size: int, noop_flag: torch.Tensor, tensor_lists: Any, *args: Any) -> None:
    """multi_tensor_adam over [grads, params, exp_avgs, exp_avg_sqs]: the multi-tensor Adam kernel that
    DeepSpeed's and Apex's extensions share (interpose/device/cuda_extensions.py, its cost model)."""
    from interpose.device.cuda_extensions import multi_tensor_adam as shared_kernel
    if len(tensor_lists) != 4:
        raise not_modelled(f"multi_tensor_adam with {len(tensor_lists)} tensor lists (FusedAdam with "
                           f"master_weights)")
    shared_kernel(chunk_size, noop_flag, tensor_lists, *args)


def multi_tensor_scale(chunk_size: int, noop_flag: torch.Tensor, tensor_lists: Any, scale: Any) -> None:
    """multi_tensor_scale / multi_tensor_scale_tensor: [src, dst], dst = src * scale."""
    src, dst = (list(lst) for lst in tensor_lists)
    nvte_ops.define_ops()
    torch.ops.nvte.multi_tensor_scale(noop_flag, src, dst, scale if isinstance(scale, torch.Tensor) else None)


def compute_amax(x: torch.Tensor, amax: torch.Tensor) -> None:
    """The amax kernel on its own: cast_master_weights_to_fp8 (FP8 weights under current scaling,
    --fp8-param-gather) takes each master weight's amax before all-reducing them."""
    nvte_ops.define_ops()
    torch.ops.nvte.compute_amax(plain(x, "compute_amax input"), amax)


def multi_tensor_compute_scale_and_scale_inv(chunk_size: int, noop_flag: torch.Tensor, tensor_lists: Any,
                                             max_fp8: float, force_pow_2_scales: bool = False,
                                             epsilon: float = 0.0) -> None:
    """[amaxes, scales, scale_invs]: one multi_tensor_apply launch writing each scale and
    scale_inv from its amax."""
    amaxes, scales, scale_invs = (list(lst) for lst in tensor_lists)
    nvte_ops.define_ops()
    torch.ops.nvte.multi_tensor_compute_scale(noop_flag, amaxes, scales, scale_invs)


def multi_tensor_l2norm(chunk_size: int, noop_flag: torch.Tensor, tensor_lists: Any,
                        per_tensor: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """The C++ multi_tensor_l2norm_cuda: zeroed partial sums (320 blocks), the norm, and per tensor
    (when asked) one partial per chunk and one norm per tensor."""
    tensors = list(tensor_lists[0])
    device = tensors[0].device if tensors else noop_flag.device
    f32 = torch.float32
    partials = torch.zeros(320, dtype=f32, device=device)
    norm = torch.empty(1, dtype=f32, device=device)
    if per_tensor:
        max_chunks = max((-(-t.numel() // int(chunk_size)) for t in tensors), default=0)
        partials_per_tensor = torch.zeros(len(tensors) * max_chunks, dtype=f32, device=device)
        norm_per_tensor = torch.empty(len(tensors), dtype=f32, device=device)
    else:
        partials_per_tensor = torch.empty(0, dtype=f32, device=device)
        norm_per_tensor = torch.empty(0, dtype=f32, device=device)
    nvte_ops.define_ops()
    torch.ops.nvte.multi_tensor_l2norm(noop_flag, tensors, partials, norm, partials_per_tensor, norm_per_tensor)
    return norm, norm_per_tensor


# --- the module --------------------------------------------------------------------------------

def _modelled_functions() -> dict[str, Callable[..., Any]]:
    fns: dict[str, Callable[..., Any]] = {
        "get_fused_attn_backend": attention.get_fused_attn_backend,
        "fused_attn_fwd": attention.fused_attn_fwd, "fused_attn_bwd": attention.fused_attn_bwd,
        "generic_gemm": generic_gemm,
        "layernorm_fwd": layernorm_fwd, "layernorm_bwd": layernorm_bwd,
        "rmsnorm_fwd": rmsnorm_fwd, "rmsnorm_bwd": rmsnorm_bwd,
        "fused_rope_forward": _rope(False), "fused_rope_backward": _rope(True),
        "te_general_grouped_gemm": te_general_grouped_gemm,
        "multi_tensor_adam": multi_tensor_adam, "multi_tensor_scale": multi_tensor_scale,
        "multi_tensor_scale_tensor": multi_tensor_scale, "multi_tensor_l2norm": multi_tensor_l2norm,
        "compute_amax": compute_amax,
        "multi_tensor_compute_scale_and_scale_inv": multi_tensor_compute_scale_and_scale_inv,
        "quantize": quantize, "create_empty_quantized_tensor": create_empty_quantized_tensor,
        "split_quantize": split_quantize, "multi_tensor_quantize": multi_tensor_quantize,
        "bgrad_quantize": bgrad_quantize, "dequantize": dequantize, "fp8_transpose": fp8_transpose,
        "fused_amax_and_scale_update_after_reduction": fused_amax_and_scale_update_after_reduction,
        "get_cudnn_version": lambda: CUDNN_VERSION,
        "get_cublasLt_version": lambda: CUBLASLT_VERSION,
        "get_num_cublas_streams": lambda: NUM_COMPUTE_STREAMS,
        "ubuf_built_with_mpi": lambda: False,
        "nvte_built_with_cublasmp": lambda: False,
        "device_supports_multicast": userbuffers.device_supports_multicast,
        "get_stream_priority_range": lambda device_id=-1: (0, -5),
        **router.FUNCTIONS,
    }
    for kind, gated in ACTIVATIONS.items():
        fns[kind] = _activation(kind, gated)
        fns[f"d{kind}"] = _dactivation(kind, with_dbias=False)
    for kind in ("gelu", "silu", "relu", "qgelu", "srelu"):
        fns[f"dbias_d{kind}"] = _dactivation(kind, with_dbias=True)
    for kind in SOFTMAX_KINDS:
        fns[f"{kind}_softmax_forward"] = _softmax_forward(kind)
        fns[f"{kind}_softmax_backward"] = _softmax_backward(kind)
    return fns


# Every function the real extension defines (pybind.cpp's m.def and pybind_helper.h), so that a
# program that calls one phantora does not model gets NotImplementedError, not AttributeError.
EXTENSION_FUNCTIONS = """
bgrad_group_quantize bgrad_quantize bulk_allocate bulk_overlap_ag_with_external_gemm clamped_dswiglu clamped_swiglu
compute_amax convert_bshd_to_thd convert_thd_to_bshd copy_data_ptrs_to_device copy_to_kv_cache
create_empty_quantized_tensor create_nvshmem_tensor cusolvermp_ctx_create cusolvermp_ctx_destroy dbias_dgelu
dbias_dqgelu dbias_drelu dbias_dsilu dbias_dsrelu dequantize dgeglu dgelu dglu dqgeglu dqgelu dreglu drelu dropout_bwd
dropout_fwd dsilu dsituglu dsreglu dsrelu dswiglu fa_prepare_bwd fa_prepare_fwd fp8_block_scaling_compute_partial_amax
fp8_block_scaling_partial_cast fp8_transpose fused_amax_and_scale_update_after_reduction fused_attn_bwd fused_attn_fwd
fused_moe_aux_loss_bwd fused_moe_aux_loss_fwd fused_moe_aux_loss_fwd_graph_safe fused_multi_row_padding
fused_multi_row_unpadding fused_qkv_rope_backward fused_qkv_rope_forward fused_rope_backward fused_rope_forward
fused_score_for_moe_aux_loss_bwd fused_score_for_moe_aux_loss_fwd fused_topk_with_score_function_bwd
fused_topk_with_score_function_fwd fused_topk_with_score_function_qb_fwd geglu gelu generic_gemm
get_cublasLt_version get_cudnn_version get_fused_attn_backend get_grouped_gemm_setup_workspace_size
get_num_cublas_streams glu group_dequantize group_quantize group_requantize_inplace group_scaled_clamped_swiglu
group_scaled_swiglu grouped_swizzle_for_gemm init_nvshmem_backend layernorm_bwd layernorm_fwd moe_permute_bwd
moe_permute_fwd moe_unpermute_bwd moe_unpermute_fwd multi_tensor_adam multi_tensor_adam_capturable
multi_tensor_adam_capturable_master multi_tensor_adam_fp8 multi_tensor_adam_param_remainder
multi_tensor_compute_scale_and_scale_inv multi_tensor_compute_scale_inv_e8m0 multi_tensor_l2norm
multi_tensor_pad_last_dim multi_tensor_quantize multi_tensor_scale multi_tensor_scale_tensor multi_tensor_sgd
multi_tensor_swizzle_scales_for_gemm_ multi_tensor_transpose_to_bhsd multi_tensor_unscale_l2norm
mxfp8_scaling_compute_partial_amax mxfp8_scaling_partial_cast newton_schulz nvfp4_2d_compute_partial_amax
nvfp4_2d_multi_tensor_transpose nvfp4_2d_partial_cast nvfp4_compute_global_scale nvfp4_compute_per_block_scale
nvfp4_data_transpose nvfp4_expand_scale_to_fp8 nvfp4_fused_scale nvfp4_group_quantize_with_amax
nvfp4_multi_tensor_2d_partial_cast nvfp4_multi_tensor_compute_partial_amax nvfp4_multi_tensor_fused_scale
nvfp4_quantize_with_amax nvshmem_finalize nvshmem_send_on_current_stream nvshmem_wait_on_current_stream qgeglu qgelu
quantize reglu relu rmsnorm_bwd rmsnorm_bwd_add rmsnorm_fwd scaled_aligned_causal_masked_softmax_backward
scaled_aligned_causal_masked_softmax_forward scaled_clamped_dswiglu scaled_clamped_swiglu scaled_dsituglu
scaled_dsrelu scaled_dswiglu scaled_masked_softmax_backward scaled_masked_softmax_forward scaled_situglu
scaled_softmax_backward scaled_softmax_forward scaled_srelu scaled_swiglu scaled_upper_triang_masked_softmax_backward
scaled_upper_triang_masked_softmax_forward silu situglu split_quantize splits_to_offsets splits_to_offsets_multi
sreglu srelu swap_first_dims swiglu swizzle_scales_for_gemm_ te_general_grouped_gemm
te_general_grouped_gemm_for_discrete_in te_general_grouped_gemm_for_discrete_out
te_general_grouped_gemm_for_grouped_tensor thd_copy_valid_tokens_from_per_split_to_rank_local
thd_cp_rank_order_to_sequence_order thd_get_partitioned_indices thd_grad_correction thd_out_correction
thd_read_half_tensor thd_read_second_half_lse thd_second_half_lse_correction thd_sequence_order_to_cp_rank_order
device_supports_multicast get_stream_priority_range ubuf_built_with_mpi nvte_built_with_cublasmp
""".split()


def populate(module: Any) -> None:
    """Fill the extension module (native/extension.c's exec slot)."""
    for e in ENUMS:
        setattr(module, e.__name__, e)
        # pybind11 enums export their values into the module scope too (tex.kFloat32 is not used by
        # TE, but the class attributes are: tex.DType.kFloat32)
    for cls in CLASSES:
        setattr(module, cls.__name__, cls)
    modelled = _modelled_functions()
    for name in EXTENSION_FUNCTIONS:
        setattr(module, name, modelled.get(name) or _unmodelled_function(name))
    for name, fn in modelled.items():
        setattr(module, name, fn)
    experimental = types.ModuleType(f"{module.__name__}.grouped_mlp_experimental")
    experimental.swizzle_scales_and_pack_ptrs_for_discrete_weights = _unmodelled_function(  # type: ignore[attr-defined]
        "grouped_mlp_experimental.swizzle_scales_and_pack_ptrs_for_discrete_weights")
    module.grouped_mlp_experimental = experimental
    module.__phantora_stand_in__ = True
