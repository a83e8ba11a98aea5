"""torch.multiprocessing.spawn: children get no rank in their environment, only the argument they
pass to init_process_group; here each uses its GPU before init_process_group (both would guess
rank 0 from the environment). Usage: launchdp_spawn.py N PORT."""

import os
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def worker(index: int, nprocs: int, port: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
    rank = nprocs - 1 - index  # not the spawn index: only init_process_group tells
    torch.cuda.set_device(rank)
    x = torch.randn(64, 64, device="cuda") @ torch.randn(64, 64, device="cuda")  # before init
    time.sleep(0.5 * index)  # the later process claims its guess second
    dist.init_process_group("nccl", rank=rank, world_size=nprocs)
    t = torch.ones(4, dtype=torch.int64, device="cuda") * (rank + 1)
    dist.all_reduce(t)
    assert t.tolist() == [sum(range(1, nprocs + 1))] * 4
    assert x.shape == (64, 64)
    dist.destroy_process_group()
    print(f"ok rank {rank}", flush=True)


if __name__ == "__main__":
    mp.spawn(worker, args=(int(sys.argv[1]), sys.argv[2]), nprocs=int(sys.argv[1]))
