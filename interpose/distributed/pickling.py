"""Pickling virtual tensors: what torch.multiprocessing.spawn (Lightning's `ddp_spawn`), a
multiprocessing queue or a plain pickle.dumps does with a tensor the script holds.

On a GPU machine a CPU tensor pickles with its data (torch.multiprocessing moves it to shared
memory first) and a CUDA tensor with an IPC handle. Under phantora the script's float CPU tensors
and every GPU tensor are virtual (FakeTensors of phantora's FakeTensorMode, interpose/device/fake.py):
they hold no data, and torch's default reduction pickles the FakeTensor's Python state, its
FakeTensorMode included, which cannot be pickled ("Can't pickle local object
'WeakValueDictionary.__init__.<locals>.remove'"). A virtual tensor pickles instead as what
it is: its shape, strides, dtype, device, requires_grad and parameter flag, and what it reads as
(its value or small shadow, interpose/values/policy.py). Unpickled in a process phantora runs, it is
rebuilt there as a fresh tensor of the same kind, in that process's FakeTensorMode.

Not kept: storage shared between two separately pickled tensors (views of one base arrive as
separate tensors; the same tensor object pickled twice is still one, by pickle's memo), and a
CUDA tensor's memory: the receiving process allocates its own copy on its virtual GPU where CUDA
IPC would map the sender's. Tensors of other FakeTensorModes (torch.compile's) pickle as torch
pickles them.

torch is imported inside the functions: unpickling may import this module before the receiving
process has imported torch, and phantora installs itself at that import (interpose/launch/hook.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# FakeTensor's own Python state (its mode, fake device, memo caches) and phantora's bookkeeping:
# rebuilt in the receiving process, never pickled
_FAKE_STATE = frozenset({"fake_mode", "_fake_device", "constant", "real_tensor", "pytype", "dispatch_keys",
                         "_is_param"})
_FAKE_STATE_SUFFIXES = ("_memo", "_memo_epoch", "_memo_vc")


@dataclass
class VirtualTensor:
    """What a pickled virtual tensor carries."""

    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: Any  # torch.dtype
    device: str
    requires_grad: bool
    parameter: bool
    value: Any  # what it reads as (values.value_of), where it has no shadow
    shadow: Any = None  # (nested list, dtype) of its real shadow, if it has one
    state: dict[str, Any] = field(default_factory=dict)  # the script's own attributes on it


def _reduce_virtual(self: Any, proto: int) -> Any:
    from interpose.values import policy as values
    from interpose.device.fake import VirtualCudaFakeMode

    if not isinstance(getattr(self, "fake_mode", None), VirtualCudaFakeMode):
        return _torch_reduce_ex(self, proto)
    import torch

    shadow = values.shadow_of(self)
    with values.real_cpu():
        held = None if shadow is None else (shadow.tolist(), shadow.dtype)
    state = {k: v for k, v in self.__dict__.items()
             if k not in _FAKE_STATE and not k.startswith("_phantora") and not k.endswith(_FAKE_STATE_SUFFIXES)}
    return (rebuild_virtual_tensor, (VirtualTensor(
        tuple(self.shape), tuple(self.stride()), self.dtype, str(self.device), bool(self.requires_grad),
        isinstance(self, torch.nn.Parameter), values.value_of(self), held, state),))


def rebuild_virtual_tensor(v: VirtualTensor) -> Any:
    """The pickled tensor, rebuilt as a tensor created here would be (virtual, unless phantora's
    policy makes a tensor of this kind real, interpose/ops/observer.py), reading as it did."""
    import torch

    from interpose.values import policy as values

    t = torch.empty_strided(v.shape, v.stride, dtype=v.dtype, device=v.device)
    if values.is_virtual(t):
        with values.real_cpu():
            shadow = None if v.shadow is None else torch.tensor(v.shadow[0], dtype=v.shadow[1]).reshape(v.shape)
        values.set_shadow(t, shadow)  # a small new tensor may have been given one
        values.set_value(t, None if shadow is not None else v.value)
    else:
        with values.real_cpu():
            if v.shadow is not None:
                t.copy_(torch.tensor(v.shadow[0], dtype=v.shadow[1]).reshape(v.shape))
            else:
                t.fill_(v.value)
    if v.parameter:
        t = torch.nn.Parameter(t, requires_grad=v.requires_grad)
    elif v.requires_grad:
        t.requires_grad_(True)
    for k, value in v.state.items():
        setattr(t, k, value)
    return t


_torch_reduce_ex: Any = None


def install_pickling() -> None:
    global _torch_reduce_ex
    from torch._subclasses.fake_tensor import FakeTensor

    if _torch_reduce_ex is None:
        _torch_reduce_ex = FakeTensor.__reduce_ex__
        FakeTensor.__reduce_ex__ = _reduce_virtual  # type: ignore[method-assign]
