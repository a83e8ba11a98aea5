"""Values that steer a distributed script survive the trip between ranks: small integer and
boolean tensors on virtual GPUs (send/recv, all_reduce, broadcast) and pickled objects
(send/recv_object_list, gather_object, scatter_object_list)."""
import os

import torch
import torch.distributed as dist

torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
dist.init_process_group("nccl")
rank = dist.get_rank()

# pipelining's stage vote: a product of per-stage flags passed along with send/recv
vote = torch.tensor([0 if rank == 0 else 1], dtype=torch.int32, device="cuda")
if rank == 0:
    dist.send(vote, dst=1)
else:
    acc = torch.zeros(1, dtype=torch.int32, device="cuda")
    dist.recv(acc, src=0)
    print(f"rank 1: vote product {(acc * vote).item()}", flush=True)

counts = torch.tensor([rank + 1, 10 * (rank + 1)], device="cuda")  # int64
dist.all_reduce(counts)
print(f"rank {rank}: summed counts {counts.tolist()}", flush=True)
flag = torch.tensor(rank == 1, device="cuda")
dist.all_reduce(flag, op=dist.ReduceOp.MAX)
print(f"rank {rank}: any flag {bool(flag)}", flush=True)
step = torch.tensor(7 if rank == 1 else 0, device="cuda")
dist.broadcast(step, src=1)
print(f"rank {rank}: broadcast step {int(step)}", flush=True)

if rank == 0:
    dist.send_object_list([{"shape": (4, 256), "from": 0}], dst=1)
else:
    box = [None]
    dist.recv_object_list(box, src=0)
    print(f"rank 1: received object {box[0]}", flush=True)
gathered = [None, None] if rank == 0 else None
dist.gather_object(f"hello from {rank}", gathered, dst=0)
if rank == 0:
    print(f"rank 0: gathered {gathered}", flush=True)
mine = [None]
dist.scatter_object_list(mine, [["a"], ["b", "c"]] if rank == 1 else None, src=1)
print(f"rank {rank}: scattered {mine[0]}", flush=True)
dist.destroy_process_group()
