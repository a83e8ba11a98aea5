"""Two ranks all-reduce a few times; each writes its pid to $PIDFILE_DIR/rank<R>.pid first (the test
checks that no rank outlives the run)."""
import os
import pathlib

import torch
import torch.distributed as dist

rank = int(os.environ["RANK"])
pathlib.Path(os.environ["PIDFILE_DIR"], f"rank{rank}.pid").write_text(str(os.getpid()))
torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
dist.init_process_group("nccl")
t = torch.ones(1 << 20, device="cuda")
for _ in range(3):
    t = t * 2
    dist.all_reduce(t)
torch.cuda.synchronize()
print(f"rank {rank} done", flush=True)
