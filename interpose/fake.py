"""FakeTensorMode set up for whole-program use on virtual CUDA devices, with the fixes stock
FakeTensor needs for that (each one is a trap documented in notes/torch-interposition.md).
"""

from __future__ import annotations

from typing import Any

import torch
from torch._subclasses import fake_tensor as _ft
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

from interpose import values


class VirtualCudaFakeMode(FakeTensorMode):
    """FakeTensorMode that never initialises a real device.

    Once torch.cuda.is_available() says True, FakeTensorMode would run real CUDA kernels for
    constant propagation (avoid_device_init flips to False); there is no CUDA here."""

    @property
    def avoid_device_init(self) -> bool:  # type: ignore[override]
        return True


def _from_meta_and_device(self: Any, fake_mode: Any, t: torch.Tensor, device: torch.device,
                          pytype: Any = None, dispatch_keys: Any = None) -> FakeTensor:
    # Stock code memoizes these outputs in a WeakValueDictionary; the weakref it leaves on the
    # tensor makes Module.cuda()/.to() fail intermittently ("Couldn't swap ... has weakref").
    return FakeTensor(fake_mode, t, device, pytype=pytype, dispatch_keys=dispatch_keys)


_tensor_data = torch._C.TensorBase.data


def _get_data(self: torch.Tensor) -> torch.Tensor:
    return _tensor_data.__get__(self)


def _set_data(self: torch.Tensor, new: torch.Tensor) -> None:
    # `param.data = fake_cuda_tensor` (FSDP2's _move_states_to_device) swaps the TensorImpl but
    # would leave the FakeTensor's Python-side fake_device at its old value.
    _tensor_data.__set__(self, new)
    if isinstance(self, FakeTensor) and isinstance(new, FakeTensor):
        self.fake_device = new.fake_device


def _fake_tolist(self: torch.Tensor) -> Any:
    if values.is_virtual(self):  # a FakeTensor, or a DTensor around one
        self.item() if self.numel() == 1 else torch.ops.aten._local_scalar_dense.default(self.reshape(-1)[0])
        return values.tolist_value(self)
    return _orig_tolist(self)


def _fake_format(self: torch.Tensor, spec: str) -> str:
    if values.is_virtual(self) and self.dim() == 0:
        return format(self.item(), spec)
    return _orig_format(self, spec)


def _fake_repr(self: torch.Tensor, *, tensor_contents: Any = None) -> str:
    """print(t) on a virtual GPU tensor: torch's layout, and a plain statement that no data exists."""
    parts = [f"size={tuple(self.shape)}", f"dtype={self.dtype}"]
    if self.device.type != "cpu":
        parts.append(f"device='{self.device}'")
    if self.grad_fn is not None:
        parts.append(f"grad_fn=<{type(self.grad_fn).__name__}>")
    elif self.requires_grad:
        parts.append("requires_grad=True")
    return f"tensor(<no data: virtual>, {', '.join(parts)})"


def _fake_numpy(self: torch.Tensor, *, force: bool = False) -> Any:
    if isinstance(self, FakeTensor):
        import numpy as np

        if self.device.type != "cpu" and not force:
            raise TypeError(
                f"can't convert {self.device} device type tensor to numpy. Use Tensor.cpu() to copy "
                "the tensor to host memory first."
            )
        shadow = values.shadow_of(self)
        if shadow is not None:  # real data (copied from the CPU, or a counter computed from it)
            with _ft.unset_fake_temporarily():
                return _orig_numpy(shadow.detach(), force=True).copy()
        return np.full(tuple(self.shape), values.value_of(self), dtype=_np_dtype(self.dtype))
    return _orig_numpy(self, force=force)


def _np_dtype(dtype: torch.dtype) -> Any:
    import numpy as np

    table = {torch.float32: np.float32, torch.float64: np.float64, torch.float16: np.float16,
             torch.int64: np.int64, torch.int32: np.int32, torch.int16: np.int16, torch.int8: np.int8,
             torch.uint8: np.uint8, torch.bool: np.bool_, torch.complex64: np.complex64,
             torch.complex128: np.complex128}
    if dtype not in table:
        raise TypeError(f"Got unsupported ScalarType {str(dtype).removeprefix('torch.')}")
    return table[dtype]


_orig_conv_memory_format = torch._C._conv_determine_backend_memory_format


def _cudnn_conv_memory_format(input: torch.Tensor, weight: torch.Tensor, backend: Any) -> torch.memory_format:
    """The layout of a convolution's output (and of convolution_backward's grad_input and
    grad_weight) on a virtual GPU: what cuDNN picks on a real one.

    FakeTensor's conv asks torch._C._select_conv_backend for the backend; without cuDNN compiled
    in (CPU build; the shim's CUDA hooks on a CUDA build) it answers the slow im2col path, whose
    outputs are NCHW. A real GPU runs the conv on cuDNN, which keeps channels-last tensors
    channels-last (ATen's cudnn_conv_suggest_memory_format). Without this a channels_last
    ResNet turned NCHW after its first conv, and every later conv was costed with two layout
    transposes that the real H100 profile of examples/cnn_train.py does not have.
    """
    fake_device = getattr(input, "fake_device", input.device)
    if fake_device.type != "cuda" or not torch.backends.cudnn.enabled:
        return _orig_conv_memory_format(input, weight, backend)
    # cuDNN keeps NCHW for float64 (ATen: "disable NHWC for float64 input").
    if input.dtype == torch.float64 or weight.dtype == torch.float64:
        return torch.contiguous_format
    from torch._prims_common import suggest_memory_format

    formats = (suggest_memory_format(input), suggest_memory_format(weight))
    if weight.dim() == 4 and torch.channels_last in formats:
        return torch.channels_last
    if weight.dim() == 5 and torch.channels_last_3d in formats:
        return torch.channels_last_3d
    return torch.contiguous_format


_orig_tolist = torch.Tensor.tolist
_orig_format = torch.Tensor.__format__
_orig_numpy = torch.Tensor.numpy
_orig_save = torch.save


def _to_meta_for_save(obj: Any) -> Any:
    """torch.save cannot pickle FakeTensors; a virtual GPU has no data to save anyway. Saving
    writes the same structure with tensors on the meta device (shapes, dtypes, no data), so
    checkpointing code runs and the file loads back."""
    from torch.utils._pytree import tree_map

    def conv(x: Any) -> Any:
        if isinstance(x, FakeTensor):
            with _ft.unset_fake_temporarily():
                m = torch.empty_strided(tuple(x.shape), tuple(x.stride()), dtype=x.dtype, device="meta")
            if isinstance(x, torch.nn.Parameter):
                return torch.nn.Parameter(m, requires_grad=x.requires_grad)
            return m
        return x

    return tree_map(conv, obj)


def _save(obj: Any, f: Any, *args: Any, **kwargs: Any) -> None:
    obj = _to_meta_for_save(obj)
    with _ft.unset_fake_temporarily():
        _orig_save(obj, f, *args, **kwargs)


def _count_fake_tensors_as_foreach_capable() -> None:
    """Let optimizers and clip_grad_norm_ take their foreach paths on virtual GPU tensors.

    torch picks the foreach (multi-tensor) implementation only when `type(t)` is exactly
    torch.Tensor / nn.Parameter (torch/utils/_foreach_utils.py, torch/optim/optimizer.py);
    a FakeTensor fails that test, so clip_grad_norm_ ran one linalg_vector_norm and one mul_
    per parameter and `foreach=None` optimizers ran their per-parameter loops. The real H100
    profile of examples/gpt_train.py has one _foreach_norm and one _foreach_mul_ per step
    (tests/data/groundtruth/examples/profile_*.json), so on a virtual GPU the plain tensors
    a FakeTensor stands for must pass too. DTensor registers itself the same way."""
    from torch.optim import optimizer
    from torch.utils import _foreach_utils

    for supported in (_foreach_utils._foreach_supported_types, optimizer._foreach_supported_types):
        if FakeTensor not in supported:
            supported.append(FakeTensor)


def install_fake_fixes() -> None:
    _count_fake_tensors_as_foreach_capable()
    _ft.FakeTensorConverter.from_meta_and_device = _from_meta_and_device
    FakeTensor.data = property(_get_data, _set_data)  # type: ignore[assignment]
    FakeTensor.__repr__ = _fake_repr  # type: ignore[method-assign]
    FakeTensor.__str__ = _fake_repr  # type: ignore[method-assign]
    torch.Tensor.tolist = _fake_tolist  # type: ignore[method-assign]
    torch.Tensor.__format__ = _fake_format  # type: ignore[method-assign]
    torch.Tensor.numpy = _fake_numpy  # type: ignore[method-assign]
    torch.save = _save
    torch._C._conv_determine_backend_memory_format = _cudnn_conv_memory_format


def make_fake_mode() -> VirtualCudaFakeMode:
    return VirtualCudaFakeMode(allow_non_fake_inputs=True)
