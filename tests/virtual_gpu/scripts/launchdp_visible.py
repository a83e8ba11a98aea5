"""CUDA_VISIBLE_DEVICES as the CUDA driver applies it. Usage: launchdp_visible.py EXPECTED_PHYSICAL
where EXPECTED_PHYSICAL is the comma list of node GPUs the process should see ("" for none)."""

import sys

import torch

expected = [int(x) for x in sys.argv[1].split(",") if x]
n = torch.cuda.device_count()
assert n == len(expected), (n, expected)
assert torch.cuda.is_available() == bool(expected)
print("ok device_count")
if not expected:
    try:
        torch.zeros(4, device="cuda")
    except RuntimeError as e:
        assert "No CUDA GPUs are available" in str(e), str(e)
        print("ok no gpu error")
    else:
        raise AssertionError("a CUDA tensor was created with every GPU hidden")
    x = torch.randn(8, 8) @ torch.randn(8, 8)  # the CPU still works
    assert x.device.type == "cpu"
    print("ok cpu")
    sys.exit(0)

for i, physical in enumerate(expected):
    props = torch.cuda.get_device_properties(i)
    assert props.uuid.endswith(f"{physical:012x}") and props.pci_bus_id == physical, (i, props.uuid, props.pci_bus_id)
print("ok properties")
for i in range(n):
    y = torch.randn(256, 256, device=f"cuda:{i}") @ torch.randn(256, 256, device=f"cuda:{i}")
    assert y.device == torch.device("cuda", i)
torch.cuda.synchronize()
print("ok kernels")
for bad in (n, 8):
    try:
        torch.cuda.set_device(bad)
    except Exception as e:  # torch.AcceleratorError / RuntimeError on a real GPU
        assert "invalid device ordinal" in str(e), str(e)
    else:
        raise AssertionError(f"set_device({bad}) worked with {n} visible GPUs")
print("ok invalid ordinal")
