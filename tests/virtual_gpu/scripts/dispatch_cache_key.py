"""FakeTensorMode's dispatch-cache key for the program's tensors (interpose/device/fake.py
VirtualCudaFakeMode._prep_args_for_hash): tests/virtual_gpu/test_dispatch_cache_key.py."""
import itertools

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch._subclasses._fake_tensor_utils import _CacheKeyState

base = torch.randn(8, 16, device="cuda")
mode = base.fake_mode


def keys(*args):
    """(phantora's key entries, stock FakeTensorMode's) for these arguments."""
    fast, stock = [], []
    mode._prep_args_for_hash(fast, args, _CacheKeyState(mode.shape_env), [])
    FakeTensorMode._prep_args_for_hash(mode, stock, args, _CacheKeyState(mode.shape_env), [])
    return tuple(fast), tuple(stock)


with torch.inference_mode():
    inference = torch.randn(8, 16, device="cuda")
grown = torch.randn(8, 16, device="cuda")
grown.untyped_storage().resize_(8 * 16 * 4 * 2)  # same tensor metadata, a larger storage
complex_ = torch.randn(8, 16, device="cuda", dtype=torch.complex64)
# tensors that differ from `base` in one fact each of stock's TensorMetadata, and some that differ in none
tensors = {
    "base": base,
    "same_metadata": torch.randn(8, 16, device="cuda"),
    "shape": torch.randn(16, 8, device="cuda"),
    "stride": torch.randn(16, 8, device="cuda").t(),
    "offset": torch.randn(9, 16, device="cuda")[1:],
    "storage_bytes": grown,
    "dtype": torch.randn(8, 16, device="cuda", dtype=torch.bfloat16),
    "device": torch.randn(8, 16, device="cuda:1"),
    "cpu": torch.randn(8, 16),
    "requires_grad": torch.randn(8, 16, device="cuda", requires_grad=True),
    "inference": inference,
    "complex": complex_,
    "conj": complex_.conj(),
    "neg": complex_.conj().imag,  # a negative view (is_neg) of the same storage and offset
    "channels_last": torch.randn(2, 4, 3, 3, device="cuda").to(memory_format=torch.channels_last),
    "contiguous_4d": torch.randn(2, 4, 3, 3, device="cuda"),
}
assert tensors["neg"].is_neg() and tensors["conj"].is_conj()
print("ok made")

# the program's plain tensors take phantora's form of the key ...
for name, t in tensors.items():
    fast, stock = keys(t)
    assert any(type(v).__name__ == "_StridedTensorKey" for v in fast), name
    assert fast != stock
# ... which tells two argument lists apart exactly when stock's does
names = list(tensors)
for a, b in itertools.product(names, names):
    fa, sa = keys(tensors[a], 2, 1.0)
    fb, sb = keys(tensors[b], 2, 1.0)
    assert (fa == fb) == (sa == sb), (a, b)
    assert (fa == fb) == (a == b or {a, b} == {"base", "same_metadata"}), (a, b)
print("ok same_distinctions")
# scalars are keyed by type and value, as stock keys them (1 and 1.0 give different dtypes)
assert keys(base, 1)[0] != keys(base, 1.0)[0] and keys(base, 1)[0] != keys(base, True)[0]
assert keys(base, None, "x", torch.float16)[0] == keys(base, None, "x", torch.float16)[0]
assert keys(base, [2, 3])[0] != keys(base, (2, 3))[0] != keys(base, [2, 3, 4])[0]
print("ok scalars")
# what phantora's form does not cover goes the stock way: a torch.Size, a dict
assert keys(torch.Size([2, 3]))[0] == keys(torch.Size([2, 3]))[1]
print("ok stock_path")

# a repeated op is answered from the dispatch cache
x, w = torch.randn(64, 32, device="cuda"), torch.randn(32, 16, device="cuda")
(x @ w).relu()
before = FakeTensorMode.cache_info()
for _ in range(3):
    (x @ w).relu()
after = FakeTensorMode.cache_info()
assert after.hits - before.hits >= 6 and after.misses == before.misses, (before, after)
print("ok cache_hits")

# aten::linear of a 3-d input ends in _unsafe_view, which phantora serves as view's cache entry
# (interpose/ops/observer.py _CACHED_EQUIVALENT): what autograd and the storage show is a GPU's
x, w = torch.randn(4, 8, 32, device="cuda"), torch.randn(16, 32, device="cuda", requires_grad=True)
before = FakeTensorMode.cache_info().bypasses.get("unsafe view", 0)
for _ in range(3):
    y = torch.nn.functional.linear(x, w)
    m = torch.randn(32, 16, device="cuda")
    u = torch.ops.aten._unsafe_view(m, [4, 8, 16])
assert FakeTensorMode.cache_info().bypasses.get("unsafe view", 0) == before
assert type(y.grad_fn).__name__ == "UnsafeViewBackward0" and not y._is_view() and y.shape == (4, 8, 16)
assert not u._is_view() and u._base is None and u.untyped_storage()._cdata == m.untyped_storage()._cdata
assert u.shape == (4, 8, 16) and u.stride() == (128, 16, 1)
y.sum().backward()
assert w.grad.shape == (16, 32)
print("ok unsafe_view")
