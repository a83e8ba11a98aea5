"""A multi-rank loop that never ends (all-reduce, reduce-scatter, a real-time pause); each rank writes
its pid to $PIDFILE_DIR/rank<R>.pid and prints STARTED once its first step ran."""
import os
import pathlib
import threading

import torch
import torch.distributed as dist

rank = int(os.environ["RANK"])
pathlib.Path(os.environ["PIDFILE_DIR"], f"rank{rank}.pid").write_text(str(os.getpid()))
torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
dist.init_process_group("nccl")
world = dist.get_world_size()
grad = torch.ones(1 << 16, device="cuda")
shard = torch.empty((1 << 16) // world, device="cuda")
step = 0
while True:
    dist.all_reduce(grad)
    dist.reduce_scatter_tensor(shard, grad)
    torch.cuda.synchronize()
    if step == 0:
        print(f"STARTED rank {rank}", flush=True)
    step += 1
    threading.Event().wait(0.05)  # real time: keeps the trace small
