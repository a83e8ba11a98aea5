"""2 ranks, an all_to_all whose split sizes disagree: rank 1 expects 3 rows from rank 0, which sends
it 2 (on NCCL this hangs or corrupts data)."""
import torch
import torch.distributed as dist

dist.init_process_group("nccl")
rank = dist.get_rank()
torch.cuda.set_device(rank)
x = torch.randn(4, 8, device="cuda")
send = [2, 2]
recv = [2, 2] if rank == 0 else [3, 2]
out = torch.empty(sum(recv), 8, device="cuda")
dist.all_to_all_single(out, x, recv, send)
torch.cuda.synchronize()
print("not reached")
