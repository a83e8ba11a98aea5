"""Checks, from inside a traced script, that torch.cuda answers as a real H100 would."""
import torch

assert torch.cuda.is_available()
assert torch.cuda.device_count() == 8
assert torch.cuda.get_device_name() == "NVIDIA H100 80GB HBM3"
assert torch.cuda.get_device_capability() == (9, 0)
props = torch.cuda.get_device_properties(0)
assert props.total_memory == 85_017_493_504 and props.multi_processor_count == 132, props
assert torch.cuda.is_bf16_supported()
assert torch.version.cuda is not None

# devices
torch.cuda.set_device(3)
assert torch.cuda.current_device() == 3
x = torch.empty(10, device="cuda")
assert x.device == torch.device("cuda", 3), x.device
with torch.cuda.device(5):
    assert torch.cuda.current_device() == 5
    assert torch.zeros(1, device="cuda").device.index == 5
assert torch.cuda.current_device() == 3
torch.cuda.set_device(0)
try:
    torch.empty(1, device="cuda:8")
    raise SystemExit("cuda:8 should not exist on an 8-GPU node")
except (RuntimeError, torch.AcceleratorError) as e:
    assert "invalid device ordinal" in str(e), e

# memory accounting follows the caching allocator's rounding (512-byte blocks)
torch.cuda.empty_cache()
base = torch.cuda.memory_allocated()
a = torch.empty(1000, device="cuda")  # 4000 bytes -> 4096
assert torch.cuda.memory_allocated() - base == 4096, torch.cuda.memory_allocated() - base
b = torch.empty(256, 1024, device="cuda")  # 1 MiB -> small pool, exact
assert torch.cuda.memory_allocated() - base == 4096 + (1 << 20)
c = b[10:20]  # a view allocates nothing
assert torch.cuda.memory_allocated() - base == 4096 + (1 << 20)
del b
assert torch.cuda.memory_allocated() - base == 4096 + (1 << 20), "the view keeps the storage alive"
del c
assert torch.cuda.memory_allocated() - base == 4096
peak = torch.cuda.max_memory_allocated()
assert peak >= base + 4096 + (1 << 20)
torch.cuda.reset_peak_memory_stats()
assert torch.cuda.max_memory_allocated() == torch.cuda.memory_allocated()
assert torch.cuda.memory_stats()["allocated_bytes.all.current"] == torch.cuda.memory_allocated()
free, total = torch.cuda.mem_get_info()
assert total == props.total_memory and 0 < free < total
del a
torch.cuda.empty_cache()
assert torch.cuda.memory_reserved() == 0
assert "Memory summary" in torch.cuda.memory_summary() or "PyTorch CUDA memory summary" in torch.cuda.memory_summary()

# streams and events: elapsed_time is simulated GPU time in milliseconds
s = torch.cuda.Stream()
assert s != torch.cuda.current_stream() and torch.cuda.current_stream() == torch.cuda.default_stream()
m = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
m @ m  # warm-up: the first GEMM also creates cuBLAS's handle (~0.1 s of host time, as on a real GPU)
start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
start.record()
for _ in range(10):
    m @ m
end.record()
end.synchronize()
ms = start.elapsed_time(end)
assert 0.05 < ms < 50, ms  # 10 x 137 GFLOP on a ~1 PFLOP/s GPU: about 1.5-3 ms
print(f"ELAPSED_MS {ms:.6f}")
with torch.cuda.stream(s):
    assert torch.cuda.current_stream() == s
    y = m @ m
assert torch.cuda.current_stream() == torch.cuda.default_stream()
torch.cuda.current_stream().wait_stream(s)
y.record_stream(torch.cuda.current_stream())
torch.cuda.synchronize()
assert s.query() and end.query()

# reading values: placeholders, never errors
loss = (m.float() ** 2).mean()
assert loss.item() == 1.0 and float(loss) == 1.0
assert bool(torch.isfinite(loss)) is True and bool(torch.isnan(loss)) is False
assert f"{loss:.3f}" == "1.000"
assert torch.ones(2, 3, device="cuda").tolist() == [[1.0] * 3] * 2
print("TENSOR", torch.zeros(2, device="cuda"))
cpu = torch.zeros(3, device="cuda").cpu()
assert cpu.device.type == "cpu" and cpu.numpy().shape == (3,)

# nvtx and autocast
torch.cuda.nvtx.range_push("my-range")
with torch.autocast("cuda", dtype=torch.bfloat16):
    z = torch.nn.functional.linear(torch.randn(8, 16, device="cuda"), torch.randn(4, 16, device="cuda"))
assert z.dtype == torch.bfloat16, z.dtype
torch.cuda.nvtx.range_pop()
with torch.cuda.nvtx.range("ctx-range"):
    torch.randn(3, device="cuda").sum()

# pinned memory
p = torch.randn(1024).pin_memory()
assert p.is_pinned()
g = p.to("cuda", non_blocking=True)
assert g.device.type == "cuda"
print("CUDA_API_OK")
