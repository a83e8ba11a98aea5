"""The training thread and a second Python thread each run spin_loop.spin (N and M iterations)
between two reads of the script's clock: one interpreter runs both, so the clock shows both.

Prints the simulated time the clock shows across them."""
import json
import sys
import threading
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from spin_loop import spin  # noqa: E402

n, m = int(sys.argv[1]), int(sys.argv[2])
x = torch.zeros(4, device="cuda")
x.add_(1)  # its kernel's first launch (a module load) before the clock reads
torch.cuda.synchronize()


def beside() -> None:
    cpu = torch.zeros(4)
    cpu.pin_memory()  # as a DataLoader's pin-memory thread: pinning around its Python, no GPU work
    spin(m)
    cpu.pin_memory()


t0 = time.perf_counter()
other = threading.Thread(target=beside)
other.start()
spin(n)
other.join()
x.add_(1)
t1 = time.perf_counter()
print(json.dumps({"simulated_s": t1 - t0, "n": n, "m": m}))
