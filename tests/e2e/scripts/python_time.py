"""20 ms of pure Python between two reads of the script's own clock, after some GPU work.

Prints the simulated time the clock shows across the Python and the CPU time the Python took
here (time.thread_time stays real under phantora: it measures this machine)."""
import json
import time

import torch

x = torch.zeros(4, device="cuda")
torch.cuda.synchronize()
t0, c0 = time.perf_counter(), time.thread_time()
spins = 0
while time.thread_time() - c0 < 0.020:
    spins += 1
c1, t1 = time.thread_time(), time.perf_counter()
print(json.dumps({"simulated_s": t1 - t0, "cpu_s": c1 - c0}))
