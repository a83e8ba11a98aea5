"""Outputs FakeTensorMode's dispatch cache rebuilds for the program's tensors (interpose/device/
fake.py VirtualCudaFakeMode._get_output_tensor_from_cache_entry): tests/virtual_gpu/
test_dispatch_cache_key.py."""
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

base = torch.randn(8, 16, device="cuda")
mode = type(base.fake_mode)
fake_mode = base.fake_mode
stock_builds = 0
stock_build = FakeTensorMode._get_output_tensor_from_cache_entry


def counted_stock_build(*args, **kwargs):
    global stock_builds
    stock_builds += 1
    return stock_build(*args, **kwargs)


FakeTensorMode._get_output_tensor_from_cache_entry = counted_stock_build


def facts(out, inputs):
    """What a rebuilt output is: its class, Python attributes (less the values phantora tracks,
    which an in-place op run once more changes), metadata, dispatch keys, autograd
    state, and which input's storage it shares (if any)."""
    if isinstance(out, (tuple, list)):
        return tuple(facts(o, inputs) for o in out)
    shares = [i for i, t in enumerate(inputs) if out.untyped_storage()._cdata == t.untyped_storage()._cdata]
    own = sorted((k, v) for k, v in out.__dict__.items() if not k.startswith("_phantora"))  # not values
    return (type(out), own, tuple(out.shape), out.stride(),
            out.storage_offset(), out.dtype, out.device, out.requires_grad, out.is_leaf, out._is_view(),
            out.untyped_storage().nbytes(), str(torch._C._dispatch_keys(out)), out.is_inference(),
            type(out.grad_fn).__name__, shares)


def in_inference(a):
    with torch.inference_mode():
        return (a + 1).view(-1)


x16 = torch.randn(4, 6, 8, device="cuda:1", dtype=torch.bfloat16)
w = torch.randn(16, 16, device="cuda", requires_grad=True)
cpu = torch.randn(5, 7)
cases = {
    "add": (lambda a: a + 1, (base,)),
    "matmul_requires_grad": (lambda a, b: a @ b, (base, w)),
    "view": (lambda a: a.view(16, 8), (base,)),
    "transpose": (lambda a: a.t(), (base,)),
    "narrow_offset": (lambda a: a.narrow(0, 3, 2), (base,)),
    "expand": (lambda a: a[:, :1].expand(8, 5), (base,)),
    "select": (lambda a: a[2], (base,)),
    "split_views": (lambda a: torch.split(a, 3, dim=1), (base,)),
    "max_dim_tuple": (lambda a: torch.max(a, dim=1), (base,)),
    "var_mean_tuple": (lambda a: torch.var_mean(a, dim=0), (base,)),
    "bf16_other_device": (lambda a: a.permute(2, 0, 1).contiguous() * 2, (x16,)),
    "cpu": (lambda a: a.exp(), (cpu,)),
    "inference": (in_inference, (base,)),
    "inplace": (lambda a: a.add_(1), (base.clone(),)),
}
for name, (fn, inputs) in cases.items():
    fn(*inputs)  # the first call fills the cache
    before, hits = stock_builds, FakeTensorMode.cache_info().hits
    fast = facts(fn(*inputs), inputs)
    assert FakeTensorMode.cache_info().hits > hits, name  # answered from the cache
    fast_used = stock_builds == before
    fake_mode._get_output_tensor_from_cache_entry = stock_build.__get__(fake_mode)  # on this mode only
    try:
        stock = facts(fn(*inputs), inputs)
    finally:
        del fake_mode._get_output_tensor_from_cache_entry
    assert fast == stock, (name, fast, stock)
    if name != "inplace":  # an in-place op returns its argument: stock's path, which is that
        assert fast_used, name
print("ok same_outputs")

