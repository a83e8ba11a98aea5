"""spin_loop.spin(N) between two reads of the script's own clock, after some GPU work.

Prints the simulated time the clock shows across the loop."""
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from spin_loop import spin  # noqa: E402

n = int(sys.argv[1])
x = torch.zeros(4, device="cuda")
torch.cuda.synchronize()
t0 = time.perf_counter()
spin(n)
t1 = time.perf_counter()
print(json.dumps({"simulated_s": t1 - t0, "n": n}))
