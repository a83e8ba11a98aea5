"""A rank that does some GPU work, then spins in pure Python forever (sends nothing to phantora)."""
import os
import pathlib

import torch

pathlib.Path(os.environ["PIDFILE_DIR"], "rank0.pid").write_text(str(os.getpid()))
x = torch.randn(256, 256, device="cuda")
for _ in range(20):
    x = x @ x
torch.cuda.synchronize()
print("STARTED", flush=True)
n = 0
while True:
    n += 1
