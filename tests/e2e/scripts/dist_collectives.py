"""Every collective kind once (object collectives too), async and sync, with sizes the test checks against phantora.net."""
import os
import time

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as fc

torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
dist.init_process_group("nccl")
rank, world = dist.get_rank(), dist.get_world_size()
t = torch.ones(32 << 20, device="cuda", dtype=torch.bfloat16)  # 64 MiB
torch.cuda.synchronize()
t0 = time.perf_counter()
dist.all_reduce(t)
torch.cuda.synchronize()
print(f"rank {rank}: all_reduce {(time.perf_counter() - t0) * 1e6:.1f} us", flush=True)
out = torch.empty(world * t.numel(), device="cuda", dtype=t.dtype)
dist.all_gather_into_tensor(out, t)
shard = torch.empty(t.numel() // world, device="cuda", dtype=t.dtype)
dist.reduce_scatter_tensor(shard, t)
work = dist.all_reduce(t, async_op=True)
work.wait()
dist.broadcast(t, src=0)
r = fc.all_reduce(t, "sum", dist.group.WORLD) + 1
if rank == 0:
    dist.send(t, dst=1)
elif rank == 1:
    dist.recv(t, src=0)
dist.barrier()
objects = [None] * world
dist.all_gather_object(objects, {"rank": rank, "text": "x" * rank})
print(f"rank {rank}: gathered {objects}", flush=True)
sent = [f"from rank {rank}", rank * 10]
dist.broadcast_object_list(sent, src=1)
print(f"rank {rank}: broadcast got {sent}", flush=True)
torch.cuda.synchronize()
print(f"rank {rank}: done", flush=True)
dist.destroy_process_group()
