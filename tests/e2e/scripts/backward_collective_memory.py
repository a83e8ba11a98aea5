"""Collectives issued inside a backward pass, whose tensors the program drops once they are
done (FSDP's reduce-scatter inputs, an expert-parallel all-to-all's outputs): their memory is
free again at once, as on a GPU, not held to the end of the backward (phantora test)."""
import os, torch, torch.distributed as dist
torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
dist.init_process_group("nccl")
MiB = 1 << 20
growth = []  # memory_allocated after each backward's collectives minus before them


def scratch(mib: int) -> torch.Tensor:
    return torch.empty(mib * MiB, dtype=torch.uint8, device="cuda")


class Exchange(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, g):
        before = torch.cuda.memory_allocated()
        buf = scratch(64)
        dist.all_reduce(buf)  # synchronous: c10d waits on the work itself
        outputs = [scratch(16) for _ in range(2)]
        dist.all_to_all(outputs, [scratch(16) for _ in range(2)])
        work = dist.all_reduce(scratch(32), async_op=True)
        work.wait()
        del buf, outputs, work
        growth.append((torch.cuda.memory_allocated() - before) // MiB)
        return g * 2


x = torch.randn(1024, device="cuda", requires_grad=True)
y = x
for _ in range(4):
    y = Exchange.apply(y)
y.sum().backward()
torch.cuda.synchronize()
print(f"rank {dist.get_rank()}: MiB still allocated after each backward's collectives {growth}", flush=True)
dist.destroy_process_group()
