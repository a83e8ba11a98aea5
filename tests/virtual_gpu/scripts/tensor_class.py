"""What a script sees of its tensors' class on a virtual GPU: tests/virtual_gpu/test_tensor_class.py."""
import copy

import torch
from torch._subclasses.fake_tensor import FakeTensor

x = torch.randn(64, 64, device="cuda", dtype=torch.bfloat16)
y = (x @ x).relu()
# as on a GPU: a plain tensor's class is torch.Tensor for == and `in` a list or tuple (Transformer
# Engine's attention backends test `type(q) in (torch.Tensor, Float8Tensor, ...)`)
assert type(y) == torch.Tensor and type(y) in [torch.Tensor] and type(y) in (torch.Tensor, int)
assert not type(y) != torch.Tensor and isinstance(y, torch.Tensor)
print("ok compares_as_tensor")
# what still tells it apart: identity, and dicts keyed by class find FakeTensor's entry
assert type(y) is not torch.Tensor and type(y).__name__ == "FakeTensor"
assert {FakeTensor: "fake"}.get(type(y)) == "fake" and {torch.Tensor: "plain"}.get(type(y)) is None
print("ok lookups_by_class")
w = torch.nn.Linear(64, 64, device="cuda").weight
assert isinstance(w, torch.nn.Parameter) and type(w) == torch.Tensor
assert type(copy.deepcopy(y)) == torch.Tensor and type(y.detach().clone()) == torch.Tensor
print("ok parameters_and_copies")


class Wrapper(torch.Tensor):
    """A wrapper subclass that slices its inner data by calling the data's own __torch_dispatch__,
    passing its own types, as Transformer Engine's Float8Tensor does: a plain tensor runs the op."""

    @staticmethod
    def __new__(cls, data):
        return torch.Tensor._make_wrapper_subclass(cls, data.shape, dtype=data.dtype, device=data.device)

    def __init__(self, data):
        self.data_ = data

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        inner = args[0].data_
        return Wrapper(inner.__torch_dispatch__(func, types, [inner, *args[1:]], kwargs))


piece = Wrapper(y)[2:5]
assert type(piece) is Wrapper and piece.shape == (3, 64) and piece.data_.shape == (3, 64)
print("ok inner_dispatch_called_directly")


@torch.compile(backend="eager")
def f(t):
    return t.sin() * 2 if type(t) in (torch.Tensor,) else t.cos()


out = f(y.float())
assert type(out) == torch.Tensor and out.shape == (64, 64)
print("ok compiled")
