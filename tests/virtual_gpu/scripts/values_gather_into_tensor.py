"""Values through all_gather_into_tensor (Accelerate's gather: Trainer counts the label tokens
of each rank's batch and gathers the counts to normalise the loss), and uninitialized tensors
read the same on every run."""
import os

import torch
import torch.distributed as dist

torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
dist.init_process_group("nccl")
rank, world = dist.get_rank(), dist.get_world_size()


def ok(check: str) -> None:
    print(f"ok {check}\n", end="", flush=True)  # one write: ranks share the output pipe


# an uninitialized tensor reads as a tensor nothing is known about (1), not as host garbage
e = torch.empty(world, 3, dtype=torch.int64, device="cuda")
assert e.tolist() == [[1, 1, 1]] * world, e.tolist()
assert torch.empty_like(e).tolist() == e.tolist() and e.new_empty(2).tolist() == [1, 1]
ok("empty_reads_default")

# Accelerate's _gpu_gather_one: a 0-dim count, unsqueezed, into an empty output
count = torch.tensor(2044 + rank).to("cuda")
out = torch.empty(world, dtype=count.dtype, device="cuda")
dist.all_gather_into_tensor(out, count.clone()[None])
assert out.tolist() == [2044 + r for r in range(world)], out.tolist()
assert out.sum().item() == sum(2044 + r for r in range(world))
# a 2-D input: the output holds the members' inputs one after another
pair = torch.tensor([[rank, 10 * rank]], device="cuda")
both = torch.empty(world, 2, dtype=pair.dtype, device="cuda")
dist.all_gather_into_tensor(both, pair)
assert both.tolist() == [[r, 10 * r] for r in range(world)], both.tolist()
# data with no shadow (a placeholder) reads as the members' value
big = torch.randn(1 << 17, device="cuda").abs().sum() * 0 + 3.0
gathered = torch.empty(world, device="cuda")
dist.all_gather_into_tensor(gathered, big[None])
assert gathered.max().item() == 3.0, gathered.tolist()
ok("all_gather_into_tensor_values")
dist.destroy_process_group()
