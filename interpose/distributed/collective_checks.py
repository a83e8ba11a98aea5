"""The argument checks ProcessGroupNCCL makes before it launches a collective.

A real NCCL process group refuses bad arguments on the host, before anything is enqueued:
wrong sizes, mixed dtypes, CPU tensors, several tensors where one is expected. The simulated
group (process_group.py) must refuse the same calls with the same exception types and messages,
or a script that crashes on a GPU runs under phantora and is timed as a transfer of whatever
size the bad arguments imply. The messages are torch's own (torch/csrc/distributed/c10d/
ProcessGroupNCCL.cpp: check_gpu_single_tensor, check_gpu_tensors_same_device, the size checks of
_allgather_base, _reduce_scatter_base, alltoall_base, gather and scatter; Utils.hpp: assert*,
checkSplitSizes); C10_THROW_ERROR(ValueError / TypeError) reach Python as ValueError /
TypeError, TORCH_CHECK as RuntimeError.

Checks the Python layer of torch.distributed already makes (argument types, ranks outside the
group, complex reductions) run unchanged in the user's process and are not repeated here.
"""

from __future__ import annotations

from typing import Sequence

import torch

# ProcessGroupNCCL.hpp's MULTI_DEVICE_ERROR_MSG, raised by TORCH_CHECK (RuntimeError).
MULTI_DEVICE_ERROR_MSG = (
    "Expecting one tensor only but got multiple. You are probably using multiple devices under one thread. "
    "The support for such usage has been deprecated. For details, please refer to "
    "https://pytorch.org/docs/stable/distributed.html#multi-gpu-collective-functions. "
    "ProcessGroupNCCL continues supporting multi-process and multi-thread modes."
)


def _dispatch_device(tensors: Sequence[torch.Tensor]) -> None:
    """ProcessGroup::<collective> goes through the c10d dispatcher, which picks the backend by
    the tensors' device; an 'nccl' group has a backend for CUDA only."""
    types = {t.device.type for t in tensors if isinstance(t, torch.Tensor)}
    if types and "cuda" not in types:
        raise RuntimeError(f"No backend type associated with device type {sorted(types)[0]}")


def _contiguous(t: torch.Tensor) -> bool:
    # tensor.is_contiguous(tensor.suggest_memory_format()): channels-last tensors pass too.
    formats = [torch.contiguous_format]
    if t.dim() == 4:
        formats.append(torch.channels_last)
    elif t.dim() == 5:
        formats.append(torch.channels_last_3d)
    return any(t.is_contiguous(memory_format=f) for f in formats)


def single_tensor(t: torch.Tensor, p2p: bool = False) -> None:
    """check_gpu_single_tensor."""
    if t.device.type != "cuda" or t.is_sparse:
        raise ValueError("Tensors must be CUDA and dense")
    if not p2p and not _contiguous(t):
        raise ValueError("Tensors must be contiguous")


def one_tensor(tensors: Sequence[torch.Tensor], p2p: bool = False) -> torch.Tensor:
    """The single-tensor form every non-coalesced collective takes: exactly one, on a GPU."""
    _dispatch_device(tensors)
    if len(tensors) != 1:
        raise RuntimeError(MULTI_DEVICE_ERROR_MSG)
    t = tensors[0]
    single_tensor(torch.view_as_real(t) if t.is_complex() else t, p2p)
    return t


def same_device(tensors: Sequence[torch.Tensor]) -> None:
    """check_gpu_tensors_same_device (the coalesced collectives)."""
    _dispatch_device(tensors)
    if not tensors:
        raise ValueError("Tensor list must be nonempty")
    first = tensors[0]
    for t in tensors:
        if t.device.type != "cuda" or t.is_sparse:
            raise ValueError("Tensors must be CUDA and dense")
        if t.dtype != first.dtype:
            raise TypeError("Tensors must have identical type")
        if not _non_overlapping_and_dense(t):
            raise ValueError("Tensors must be non-overlapping and dense")
        if t.device != first.device:
            raise ValueError("Expected list of tensors on the same device")


def _non_overlapping_and_dense(t: torch.Tensor) -> bool:
    from torch._prims_common import is_non_overlapping_and_dense_or_false as is_non_overlapping_and_dense

    return bool(is_non_overlapping_and_dense(t))


def allgather_base(output: torch.Tensor, input: torch.Tensor, world_size: int) -> None:
    """_allgather_base (all_gather_into_tensor / all_gather_single)."""
    _dispatch_device([output, input])
    single_tensor(input)
    single_tensor(output)
    if input.dtype != output.dtype:
        raise TypeError("output tensor must have the same type as input tensor")
    if input.numel() * world_size != output.numel():
        raise ValueError("output tensor size must be equal to world_size times input tensor size")


def reduce_scatter_base(output: torch.Tensor, input: torch.Tensor, world_size: int) -> None:
    """_reduce_scatter_base (reduce_scatter_tensor / reduce_scatter_single)."""
    _dispatch_device([output, input])
    if input.dtype != output.dtype:
        raise TypeError("input tensor must be the same type as the output tensor.")
    if input.numel() != output.numel() * world_size:
        raise ValueError("input tensor must be the same size as output size times world size")


def list_against_own(mine: torch.Tensor, parts: Sequence[torch.Tensor], rank: int, what: str) -> None:
    """allgather / reduce_scatter with a list of unequal sizes: NCCL runs one broadcast (reduce)
    per member, out of place, and _broadcast_oop (_reduce_oop) refuses a size mismatch between
    this rank's own slot and its tensor."""
    if parts and any(p.shape != parts[0].shape for p in parts) and rank < len(parts) \
            and parts[rank].numel() != mine.numel():
        raise ValueError(f"Tensor input and output of {what} must have the same number of elements ")


def alltoall_base(output: torch.Tensor, input: torch.Tensor, output_splits: Sequence[int],
                  input_splits: Sequence[int], world_size: int) -> None:
    """alltoall_base (all_to_all_single)."""
    _dispatch_device([output, input])
    single_tensor(output, p2p=True)
    single_tensor(input, p2p=True)
    if output_splits or input_splits:
        _split_sizes(input_splits, input, world_size)
        _split_sizes(output_splits, output, world_size)


def _split_sizes(splits: Sequence[int], t: torch.Tensor, world_size: int) -> None:
    """c10d::checkSplitSizes."""
    if not splits:
        if t.dim() == 0 or t.size(0) % world_size != 0:
            raise RuntimeError("Tensor's dim 0 does not divide equally across group size")
        return
    if len(splits) != world_size:
        raise RuntimeError("Number of tensor splits not equal to group size")
    if any(s < 0 for s in splits):
        raise RuntimeError("Split sizes must be non-negative")
    if sum(splits) != t.size(0):
        raise RuntimeError("Split sizes doesn't match total dim 0 size")


def alltoall(outputs: Sequence[torch.Tensor], inputs: Sequence[torch.Tensor]) -> None:
    """alltoall (all_to_all with tensor lists)."""
    _dispatch_device([*outputs, *inputs])
    if not outputs:
        return
    device = outputs[0].device
    for out, inp in zip(outputs, inputs):
        single_tensor(out, p2p=True)
        single_tensor(inp, p2p=True)
        if out.device != device or inp.device != device:
            raise RuntimeError("Tensors must be on the same device")


def _invalid(what: str, message: str) -> ValueError:
    return ValueError(f"ProcessGroupNCCL::{what}: {message}")


def _type_and_sizes(what: str, tensors: Sequence[torch.Tensor], like: torch.Tensor) -> None:
    """assertTypeAndSizesMatch against `like` (dtype and device type, then sizes)."""
    for i, t in enumerate(tensors):
        if t.dtype != like.dtype or t.device.type != like.device.type:
            raise _invalid(what, f"invalid tensor type at index {i} (expected {_type_name(like)}, got {_type_name(t)})")
        if t.shape != like.shape:
            raise _invalid(what, f"invalid tensor size at index {i} (expected {list(like.shape)}, "
                                 f"got {list(t.shape)})")


def _type_name(t: torch.Tensor) -> str:
    return f"{t.device.type} {str(t.dtype).removeprefix('torch.')}"


def gather(outputs: Sequence[Sequence[torch.Tensor]], inputs: Sequence[torch.Tensor], root: int, rank: int,
           world_size: int) -> None:
    """gather: the root receives a list of world-size tensors like its input; others pass none."""
    _rooted("gather", inputs, outputs, root, rank, world_size, "output")


def scatter(outputs: Sequence[torch.Tensor], inputs: Sequence[Sequence[torch.Tensor]], root: int, rank: int,
            world_size: int) -> None:
    """scatter: the root sends a list of world-size tensors like its output; others pass none."""
    _rooted("scatter", outputs, inputs, root, rank, world_size, "input")


def _rooted(what: str, own: Sequence[torch.Tensor], lists: Sequence[Sequence[torch.Tensor]], root: int, rank: int,
            world_size: int, side: str) -> None:
    _dispatch_device([*own, *(t for lst in lists for t in lst)])
    if root < 0 or root >= world_size:
        raise _invalid(what, f"invalid root rank: {root}")
    if len(own) != 1:
        raise RuntimeError(MULTI_DEVICE_ERROR_MSG)
    if rank == root:
        if len(lists) != 1:
            raise _invalid(what, f"requires a single-element {side} list containing a list with {world_size} tensors.")
        if len(lists[0]) != world_size:
            raise _invalid(what, f"Incorrect {side} list size {len(lists[0])}. {side.capitalize()} list size should "
                                 f"be {world_size}, same as size of the process group.")
        _type_and_sizes(what, lists[0], own[0])
    elif lists:
        raise _invalid(what, f"requires empty {side} on non-root")
