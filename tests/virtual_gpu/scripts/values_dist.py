"""The value policy across ranks (run with 1 and 2 ranks): collectives compute on placeholders
and shadows as on data, DeepSpeed's overflow vote says "no overflow", CPU data survives a
broadcast through the GPU, and a DTensor reads as its local tensor does."""
import os

import torch
import torch.distributed as dist

torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
dist.init_process_group("nccl")
rank, world = dist.get_rank(), dist.get_world_size()


def ok(check: str) -> None:
    print(f"ok {check}\n", end="", flush=True)  # one write: ranks share the output pipe


# placeholders through all_reduce: a flag stays False, SUM of N placeholders reads N, MAX reads 1
flag = torch.isinf(torch.randn(100, device="cuda")).any()
dist.all_reduce(flag.byte(), op=dist.ReduceOp.MAX)
as_byte = flag.byte()
dist.all_reduce(as_byte, op=dist.ReduceOp.MAX)
assert as_byte.item() == 0 and not bool(as_byte) and as_byte.cpu().item() == 0, as_byte.item()
loss = torch.randn(8, device="cuda").abs().mean()
total = loss.clone()
dist.all_reduce(total)
assert total.item() == world * loss.item() and total.cpu().item() == total.item(), (total.item(), loss.item())
dist.all_reduce(loss, op=dist.ReduceOp.AVG)
assert loss.item() == 1.0, loss.item()
# the functional collectives DTensor and FSDP2 use compute on values and shadows the same way
import torch.distributed._functional_collectives as funcol

group = dist.group.WORLD
flag = funcol.all_reduce(torch.isnan(torch.randn(100, device="cuda")).any().byte(), "max", group)
assert flag.item() == 0 and int(flag.cpu()) == 0, flag.item()
steps = funcol.all_reduce(torch.tensor([rank + 1], device="cuda"), "sum", group)
assert steps.item() == world * (world + 1) // 2, steps.item()
norm = funcol.all_reduce(torch.randn(64, 64, device="cuda").norm() ** 2, "sum", group)
assert norm.item() == world and 0 < norm.sqrt().item() < float("inf"), norm.item()
ok("placeholder_all_reduce")

# DeepSpeed ZeRO-1/2 has_overflow: bool count of inf/nan over grads -> byte -> all_reduce(MAX) -> item
grads = [torch.randn(4096, device="cuda", dtype=torch.bfloat16) for _ in range(2)]
invalid = torch.zeros([1], dtype=torch.float, device="cuda")
for grad in grads:
    f = grad.float()
    invalid += f.isnan().logical_or(f.isinf()).float().max()
overflow_gpu = invalid.bool().byte().to(torch.cuda.current_device())
dist.all_reduce(overflow_gpu, op=dist.ReduceOp.MAX)
assert overflow_gpu[0].item() == 0 and not bool(overflow_gpu[0].item())
# CheckOverflow.has_overflow_serial: float(x.float().sum()) compared to inf on each grad
overflow = any(float(g.float().sum()) in (float("inf"), -float("inf")) for g in grads)
overflow_gpu = torch.tensor([overflow], dtype=torch.uint8, device="cuda")  # accelerator.ByteTensor
dist.all_reduce(overflow_gpu, op=dist.ReduceOp.MAX)
assert overflow_gpu[0].item() == 0
ok("deepspeed_overflow")

# real values computed on the CPU keep their value through all_reduce(SUM) and all_gather
flos = torch.tensor([1e12 * (rank + 1)], device="cuda", dtype=torch.float64)
summed = flos.clone()
dist.all_reduce(summed)
assert summed.item() == 1e12 * world * (world + 1) / 2, summed.item()
gathered = [torch.zeros_like(flos) for _ in range(world)]
dist.all_gather(gathered, flos)
assert torch.cat(gathered).sum().item() == summed.item(), torch.cat(gathered).tolist()
ok("real_counter_collectives")

# Accelerate's synchronize_rng_states: rank 0's CPU generator state broadcast through the GPU
torch.manual_seed(100 + rank)
state = torch.get_rng_state().to("cuda")
dist.broadcast(state, src=0)
torch.set_rng_state(state.cpu())
x = torch.rand(3).tolist()
box = [x]
dist.broadcast_object_list(box, src=0)
assert box[0] == x, "ranks' CPU generators differ after the broadcast"
torch.manual_seed(100)
assert torch.rand(3).tolist() == x
ok("rng_state_broadcast")

# a DTensor reads as its local tensor does
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard, distribute_tensor

mesh = init_device_mesh("cuda", (world,))
d = distribute_tensor(torch.randn(8, 8, device="cuda"), mesh, [Replicate()])
assert d.sum().item() == d.to_local().sum().item()
assert not bool(d.isnan().any()) and bool(d.isfinite().all())
assert f"{d.norm():.2f}" == "1.00"
z = distribute_tensor(torch.zeros(8, device="cuda"), mesh, [Replicate()])
assert z.max().item() == 0 and not bool(z.any())
z.add_(2)
assert z.max().item() == 2 and z.to_local().max().item() == 2, z.max().item()
z.fill_(1.0)
assert z.to_local().amax().item() == 1 and int(z.byte().max()) == 1
mask = distribute_tensor(torch.randn(8, 8, device="cuda"), mesh, [Shard(0)]) < -100
if mask.any():  # trunc_normal_-style resampling loop
    raise AssertionError("a healthy mask reads as set")
w = torch.nn.Parameter(distribute_tensor(torch.randn(16, 16, device="cuda"), mesh, [Shard(0)]))
w.grad = distribute_tensor(torch.randn(16, 16, device="cuda"), mesh, [Shard(0)])
norm = torch.nn.utils.clip_grad_norm_([w], 1.0)
assert 0 < norm.item() < float("inf"), norm.item()
ok("dtensor_reads")
dist.destroy_process_group()
