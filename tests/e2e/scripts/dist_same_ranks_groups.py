"""Two process groups with the same ranks: the world and new_group([0, 1]) (phantora test)."""
import os, torch, torch.distributed as dist
torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
dist.init_process_group("nccl")
g = dist.new_group([0, 1])
x = torch.ones(1 << 20, device="cuda")
w1 = dist.all_reduce(x, async_op=True)
w2 = dist.all_reduce(x, group=g, async_op=True)
w1.wait(); w2.wait()
dist.all_reduce(x, group=g)
torch.cuda.synchronize()
print(f"rank {dist.get_rank()} ok", flush=True)  # one write: ranks share the pipe, unbuffered
dist.destroy_process_group()
