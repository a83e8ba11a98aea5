"""Every rank starts N all-reduces without waiting for any (async_op=True), prints STARTED, then
waits in real time for a signal: the collectives stay in the network until the run ends."""
import os
import pathlib
import threading

import torch
import torch.distributed as dist

rank = int(os.environ["RANK"])
pathlib.Path(os.environ["PIDFILE_DIR"], f"rank{rank}.pid").write_text(str(os.getpid()))
torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
dist.init_process_group("nccl")
x = torch.ones(1 << 20, device="cuda")
works = [dist.all_reduce(x, async_op=True) for _ in range(int(os.environ.get("N", "200")))]
print(f"STARTED rank {rank}", flush=True)
threading.Event().wait(600)
