"""The script's clocks read simulated host time."""
import time
import timeit
import torch

torch.zeros(1, device="cuda")  # first GPU activity: from here on clocks are simulated
t0, p0, m0, n0 = time.time(), time.perf_counter(), time.monotonic(), time.perf_counter_ns()
time.sleep(2.5)
t1, p1, m1, n1 = time.time(), time.perf_counter(), time.monotonic(), time.perf_counter_ns()
# nothing else ran between the reads, so each clock advanced by exactly the sleep
for name, d in (("time", t1 - t0), ("perf_counter", p1 - p0), ("monotonic", m1 - m0)):
    assert abs(d - 2.5) < 1e-6, (name, d)
assert n1 - n0 == 2_500_000_000, n1 - n0
assert timeit.default_timer is time.perf_counter or abs(timeit.default_timer() - time.perf_counter()) < 1e-3

a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
torch.cuda.synchronize()
t0 = time.perf_counter()
for _ in range(5):
    a @ a
t_launch = time.perf_counter() - t0
torch.cuda.synchronize()
t_total = time.perf_counter() - t0
# launches are asynchronous: the host returns long before the GPU finishes
assert t_launch < 0.001 < t_total, (t_launch, t_total)
print(f"MATMUL_S {t_total:.9f} LAUNCH_S {t_launch:.9f}")
print("CLOCK_OK")
