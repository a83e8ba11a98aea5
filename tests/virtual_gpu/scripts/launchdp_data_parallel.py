"""nn.DataParallel on every visible GPU of one process, as the HF Trainer does on a multi-GPU node
when it is started with plain `python train.py`. Usage: launchdp_data_parallel.py EXPECTED_GPUS."""

import sys
import time

import torch
import torch.nn as nn
from torch.cuda import comm

expected = int(sys.argv[1])
n = torch.cuda.device_count()
assert n == expected, (n, expected)
print("ok device_count")

# torch.cuda.comm, the primitives DataParallel is built on
x = torch.randn(8, 16, device="cuda:0")
parts = comm.scatter(x, devices=list(range(n)))
assert [p.device for p in parts] == [torch.device("cuda", i) for i in range(n)], [p.device for p in parts]
assert sum(p.shape[0] for p in parts) == 8 and all(p.shape[1] == 16 for p in parts)
back = comm.gather(parts, dim=0, destination=0)
assert back.shape == (8, 16) and back.device == torch.device("cuda", 0)
copies = comm.broadcast_coalesced([x, torch.randn(3, device="cuda:0")], list(range(n)))
assert len(copies) == n and all(c[0].device == torch.device("cuda", i) and c[0].shape == (8, 16) and c[1].shape == (3,)
                                for i, c in enumerate(copies))
summed = comm.reduce_add([torch.randn(5, device=f"cuda:{i}") for i in range(n)], destination=0)
assert summed.shape == (5,) and summed.device == torch.device("cuda", 0)
print("ok comm")

# A copy from cuda:1 to cuda:0 waits for cuda:1's work (copy_kernel_cuda's event barrier), so
# synchronizing cuda:0 waits for the matmul on cuda:1: 2 * 8192^3 FLOP at an H100's fp32 peak
# (67 TFLOP/s) takes at least 16 ms.
a = torch.randn(8192, 8192, device="cuda:1")
torch.cuda.synchronize(1)
t0 = time.perf_counter()
b = (a @ a).to("cuda:0")
torch.cuda.synchronize(0)
waited = time.perf_counter() - t0
assert b.device == torch.device("cuda", 0) and waited > 2 * 8192**3 / 67e12, waited
del a, b
print("ok peer copy waits")



def step_time(module: nn.Module, batch: int, steps: int = 3) -> float:
    """Simulated seconds of the fastest of `steps` training steps (after one warm-up step)."""
    opt = torch.optim.SGD(module.parameters(), lr=0.1)
    times = []
    for _ in range(steps + 1):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = module(torch.randn(batch, 8192, device="cuda"))
        assert out.shape == (batch, 8192) and out.device == torch.device("cuda", 0), (out.shape, out.device)
        out.float().pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return min(times[1:])


# Big enough that GPU compute dominates: on n GPUs each replica gets batch / n.
model = nn.Sequential(nn.Linear(8192, 8192), nn.ReLU(), nn.Linear(8192, 8192)).cuda()
single = step_time(model, 8192)
dp = nn.DataParallel(model)
parallel = step_time(dp, 8192)
assert all(p.grad is None and p.device == torch.device("cuda", 0) for p in model.parameters())
print("ok train")
ratio = parallel / single
print(f"single {single * 1e3:.3f} ms, DataParallel on {n} GPUs {parallel * 1e3:.3f} ms, ratio {ratio:.3f}")
# Per-GPU compute shrinks n-fold; broadcasting the 512 MiB of weights and reducing the gradients
# over NVLink each step costs extra, more with more GPUs (they run one after another on cuda:0).
assert 1 / n < ratio < min(1.0, 1 / n + 0.25), ratio
print("ok step time")
