"""Allocations beyond the GPU's memory raise torch.OutOfMemoryError at the failing op.

Run with --vram 4GiB: 684 MiB go to the CUDA context, as on a real H100, leaving ~3.3 GiB."""
import torch

keep = [torch.empty(1 << 30, dtype=torch.uint8, device="cuda") for _ in range(3)]  # 3 GiB
try:
    torch.empty(512 << 20, dtype=torch.uint8, device="cuda")
    raise SystemExit("expected an OOM")
except torch.OutOfMemoryError as e:
    assert isinstance(e, RuntimeError)
    msg = str(e)
    assert msg.startswith("CUDA out of memory. Tried to allocate 512.00 MiB. GPU 0 has a total capacity of 4.00 GiB"), msg
    print("CAUGHT", msg)
del keep
torch.cuda.empty_cache()
ok = torch.empty(512 << 20, dtype=torch.uint8, device="cuda")  # fits once memory is freed
print("OOM_RECOVERED")
x = torch.empty(8 << 30, dtype=torch.uint8, device="cuda")  # uncaught: the script dies here
