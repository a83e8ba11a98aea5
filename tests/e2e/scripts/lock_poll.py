"""A rank waits for a file lock another process holds for 0.5 s of wall time (as ranks wait for
the one that builds a Hugging Face dataset): filelock polls with time.sleep. Prints the simulated
and the wall time the wait took."""
import json
import subprocess
import sys
import time

import torch
from filelock import FileLock

path = sys.argv[1]
holder = subprocess.Popen([sys.executable, "-c", (
    "import sys, time\nfrom filelock import FileLock\n"
    "with FileLock(sys.argv[1]):\n    print('held', flush=True)\n    time.sleep(0.5)\n"), path],
    stdout=subprocess.PIPE, text=True)
assert holder.stdout.readline().strip() == "held"
torch.zeros(4, device="cuda")  # a rank from here on: its sleeps are simulated
t0 = time.perf_counter()
with FileLock(path, timeout=30):
    t1 = time.perf_counter()
holder.wait()
print(json.dumps({"simulated_s": t1 - t0}))

# A lock nobody releases: filelock's own timeout expires in real time (it is not a hang, and not
# a Timeout after 600 fast polls that each claimed 50 ms of simulated time).
blocker = subprocess.Popen([sys.executable, "-c", (
    "import sys, time\nfrom filelock import FileLock\n"
    "with FileLock(sys.argv[1]):\n    print('held', flush=True)\n    time.sleep(30)\n"), path + ".2"],
    stdout=subprocess.PIPE, text=True)
assert blocker.stdout.readline().strip() == "held"
try:
    with FileLock(path + ".2", timeout=1.0):
        pass
except Exception as e:  # filelock.Timeout
    print(json.dumps({"timeout": type(e).__name__}))
blocker.kill()
