"""Prints, as one JSON line per rank, what a rank process is: whether torch was imported before the
script's own import (it is in a rank forked from phantora's fork server), its environment, argv,
sys.path[0], threads and a draw of numpy's global generator; then one all-reduce. Options:
--exit-rank R --code C: rank R exits with code C after the all-reduce; --raise-rank R: rank R
raises ValueError there; --set-visible: sets CUDA_VISIBLE_DEVICES=LOCAL_RANK before importing torch;
--wait-rank R: rank R then waits for SIGTERM, prints "SIGTERM rank R" when it comes and exits 143."""
import json
import os
import select
import signal
import sys

torch_before = "torch" in sys.modules
if "--set-visible" in sys.argv:
    os.environ["CUDA_VISIBLE_DEVICES"] = os.environ["LOCAL_RANK"]

import numpy as np
import torch
import torch.distributed as dist

local = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(0 if "--set-visible" in sys.argv else local)
dist.init_process_group("nccl")
waits = "--wait-rank" in sys.argv and dist.get_rank() == int(sys.argv[sys.argv.index("--wait-rank") + 1])
if waits:  # before the all-reduce, which no rank leaves before this one joins it
    signal.signal(signal.SIGTERM, lambda *_: (print(f"SIGTERM rank {os.environ['RANK']}", flush=True), os._exit(143)))
x = torch.ones(1000, device="cuda")
dist.all_reduce(x)
sys.stdout.write("RANKINFO " + json.dumps({
    "torch_before": torch_before, "rank": os.environ["RANK"], "local_rank": os.environ["LOCAL_RANK"],
    "dist_rank": dist.get_rank(), "argv": sys.argv, "path0": sys.path[0], "file": __file__,
    "threads": torch.get_num_threads(), "pid": os.getpid(), "ppid": os.getppid(),
    "draw": float(np.random.rand()), "devices": torch.cuda.device_count(), "sum": x[0].item(), "orig_argv": sys.orig_argv,
    "write_through": sys.stdout.write_through}) + "\n")
sys.stdout.flush()
dist.destroy_process_group()
while waits:
    select.select([], [], [], 60)  # real time; the virtual clock has time.sleep
rank = dist_rank = int(os.environ["RANK"])
if "--exit-rank" in sys.argv and rank == int(sys.argv[sys.argv.index("--exit-rank") + 1]):
    sys.exit(int(sys.argv[sys.argv.index("--code") + 1]))
if "--raise-rank" in sys.argv and rank == int(sys.argv[sys.argv.index("--raise-rank") + 1]):
    raise ValueError(f"rank {rank} failed on purpose")
