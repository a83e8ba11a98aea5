"""Each collective refuses the arguments ProcessGroupNCCL refuses, with torch's exception type and
message (torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp, Utils.hpp), and good calls still run.

Two ranks make the same calls; rank 0 prints `ok <name>` per refused call (and the error it got on
the next line), rank 1 only asserts. A call that is not refused fails the script on both ranks.
"""
import os

import torch
import torch.distributed as dist

rank = int(os.environ["RANK"])
torch.cuda.set_device(rank)
dist.init_process_group("nccl")
world = dist.get_world_size()
pg = dist.distributed_c10d._get_default_group()
dev = torch.device("cuda", rank)
MULTI = "Expecting one tensor only but got multiple"


def refused(name: str, exc_type: type, message: str, call) -> None:
    try:
        call()
    except Exception as e:  # noqa: BLE001 - the check is on its exact type below
        assert type(e) is exc_type, f"{name}: expected {exc_type.__name__}, got {type(e).__name__}: {e}"
        assert message in str(e), f"{name}: expected {message!r} in {str(e)!r}"
        if rank == 0:
            print(f"ok {name}\n   {type(e).__name__}: {str(e).splitlines()[0]}", flush=True)
        return
    raise AssertionError(f"{name}: accepted; ProcessGroupNCCL raises {exc_type.__name__}: {message}")


x = torch.ones(4, device=dev)
refused("all_gather_into_tensor_output_8x", ValueError,
        "output tensor size must be equal to world_size times input tensor size",
        lambda: dist.all_gather_into_tensor(torch.empty(8 * 4 * world, device=dev), x))
refused("all_gather_into_tensor_dtype", TypeError, "output tensor must have the same type as input tensor",
        lambda: dist.all_gather_into_tensor(torch.empty(4 * world, device=dev, dtype=torch.bfloat16), x))
refused("all_gather_into_tensor_non_contiguous", ValueError, "Tensors must be contiguous",
        lambda: dist.all_gather_into_tensor(torch.empty(4 * world, 2, device=dev)[:, 0], x))
refused("reduce_scatter_tensor_size", ValueError,
        "input tensor must be the same size as output size times world size",
        lambda: dist.reduce_scatter_tensor(torch.empty(4, device=dev), torch.ones(3 * world, device=dev)))
refused("reduce_scatter_tensor_dtype", TypeError, "input tensor must be the same type as the output tensor.",
        lambda: dist.reduce_scatter_tensor(torch.empty(4, device=dev, dtype=torch.half), torch.ones(4 * world, device=dev)))
refused("all_reduce_cpu_tensor", RuntimeError, "No backend type associated with device type cpu",
        lambda: dist.all_reduce(torch.ones(4)))
refused("all_reduce_non_contiguous", ValueError, "Tensors must be contiguous",
        lambda: dist.all_reduce(torch.ones(4, 4, device=dev).t()[::2]))
refused("all_reduce_two_tensors", RuntimeError, MULTI, lambda: pg.allreduce([x, x.clone()]))
refused("all_reduce_coalesced_not_dense", ValueError, "Tensors must be non-overlapping and dense",
        lambda: dist.all_reduce_coalesced([x, torch.ones(4, 4, device=dev)[:, ::2]]))
refused("broadcast_non_contiguous", ValueError, "Tensors must be contiguous",
        lambda: dist.broadcast(torch.ones(4, 4, device=dev).t(), src=0))
refused("reduce_cpu_tensor", RuntimeError, "No backend type associated with device type cpu",
        lambda: dist.reduce(torch.ones(4), dst=0))
refused("all_gather_own_slot_size", ValueError, "Tensor input and output of _broadcast_oop must have the same number",
        lambda: dist.all_gather([torch.empty(5 + r, device=dev) for r in range(world)], x))
refused("reduce_scatter_own_slot_size", ValueError, "Tensor input and output of _reduce_oop must have the same number",
        lambda: dist.reduce_scatter(torch.empty(4, device=dev), [torch.ones(5 + r, device=dev) for r in range(world)]))
refused("all_to_all_single_split_sum", RuntimeError, "Split sizes doesn't match total dim 0 size",
        lambda: dist.all_to_all_single(torch.empty(2, device=dev), torch.ones(3, device=dev), [1, 1], [1, 1]))
refused("all_to_all_single_split_count", RuntimeError, "Number of tensor splits not equal to group size",
        lambda: dist.all_to_all_single(torch.empty(2, device=dev), torch.ones(2, device=dev), [1, 1], [2]))
refused("all_to_all_single_dim0", RuntimeError, "Tensor's dim 0 does not divide equally across group size",
        lambda: dist.all_to_all_single(torch.empty(3, device=dev), torch.ones(2, device=dev), None, [1, 1]))
refused("all_to_all_devices", RuntimeError, "Tensors must be on the same device",
        lambda: dist.all_to_all([torch.empty(2, device=dev), torch.empty(2, device=torch.device("cuda", 7))],
                                [torch.ones(2, device=dev) for _ in range(world)]))
refused("send_cpu_tensor", RuntimeError, "No backend type associated with device type cpu",
        lambda: dist.send(torch.ones(2), dst=1 - rank))
if rank == 0:  # the root refuses before anything is issued; the other ranks make no call
    refused("gather_list_size", ValueError,
            f"ProcessGroupNCCL::gather: Incorrect output list size {world + 1}. Output list size should be {world}",
            lambda: dist.gather(x, [torch.empty(4, device=dev) for _ in range(world + 1)], dst=0))
    refused("scatter_sizes", ValueError, "ProcessGroupNCCL::scatter: invalid tensor size at index 0 (expected [4], got [5])",
            lambda: dist.scatter(torch.empty(4, device=dev), [torch.ones(5, device=dev) for _ in range(world)], src=0))

# The good calls still run and match across the ranks (the trace is checked by the test).
dist.all_gather_into_tensor(torch.empty(4 * world, device=dev), x)
dist.reduce_scatter_tensor(torch.empty(4, device=dev), torch.ones(4 * world, device=dev))
dist.all_reduce(x)
dist.all_reduce_coalesced([x, torch.ones(8, device=dev)])
dist.all_gather([torch.empty(4, device=dev) for _ in range(world)], x)
out_splits, in_splits = ([2, 0], [2, 1]) if rank == 0 else ([1, 3], [0, 3])
dist.all_to_all_single(torch.empty(sum(out_splits), device=dev), torch.ones(3, device=dev), out_splits, in_splits)
dist.send(torch.ones(4, 4, device=dev).t(), dst=1) if rank == 0 else dist.recv(torch.empty(4, 4, device=dev).t(), src=0)
dist.gather(x, [torch.empty(4, device=dev) for _ in range(world)] if rank == 0 else None, dst=0)
torch.cuda.synchronize()
if rank == 0:
    print("ok good_calls", flush=True)
dist.destroy_process_group()
