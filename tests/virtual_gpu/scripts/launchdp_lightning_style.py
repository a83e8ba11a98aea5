"""A launch the way Lightning's _SubprocessScriptLauncher does it, without Lightning: the script is
started once; it sets MASTER_ADDR/PORT, NODE_RANK, LOCAL_RANK and WORLD_SIZE in its own
environment (after torch's import), re-runs its own command line with subprocess.Popen for local
ranks 1..N-1, and every process passes its global rank to init_process_group. No RANK anywhere.
Each process also touches its GPU before init_process_group. Usage: launchdp_lightning_style.py N."""

import os
import socket
import subprocess
import sys

import torch
import torch.distributed as dist

nprocs = int(sys.argv[1])
if "LOCAL_RANK" not in os.environ:  # the process the user started: local rank 0, launches the others
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), NODE_RANK="0", LOCAL_RANK="0",
                      WORLD_SIZE=str(nprocs))
    children = [subprocess.Popen([sys.executable, *sys.argv], env=dict(os.environ, LOCAL_RANK=str(i)))
                for i in range(1, nprocs)]
else:
    children = []

local = int(os.environ["LOCAL_RANK"])
rank = int(os.environ["NODE_RANK"]) * nprocs + local
torch.cuda.set_device(local)
warm = torch.ones(4, device="cuda") * 2  # GPU work before the process group exists
dist.init_process_group("nccl", rank=rank, world_size=nprocs)
assert dist.get_rank() == rank and dist.get_world_size() == nprocs
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(256, 256).cuda(), device_ids=[local])
for _ in range(2):
    model(torch.randn(32, 256, device="cuda")).sum().backward()
t = torch.ones(8, dtype=torch.int64, device="cuda") * (rank + 1)
dist.all_reduce(t)
assert t.tolist() == [sum(range(1, nprocs + 1))] * 8, t.tolist()
dist.destroy_process_group()
for c in children:
    assert c.wait() == 0
print(f"ok rank {rank}")
