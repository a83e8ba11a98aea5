"""Single-process multi-GPU (nn.DataParallel, torch.cuda.comm) on virtual GPUs.

torch.cuda.comm's broadcast / broadcast_coalesced / scatter / gather call torch._C bindings
(_broadcast, _broadcast_coalesced, _scatter, _gather and their _out forms) that exist only in
CUDA builds, where they run real CUDA copies on real streams (and NCCL for broadcasts). Here
they are written with torch's own tensor ops, in the same order torch/csrc/cuda/comm.cpp issues
them: each device-to-device copy is an aten copy the observer reports as a peer copy (timed by
phantora/cost/copies.py over NVLink, synchronised with both devices' current streams as
copy_kernel_cuda does), so the simulator places every device's work on that device's timeline.

The in-process NCCL path (torch.cuda.nccl: DataParallel's backward reduces gradients with
nccl.reduce when torch has NCCL) is reported unavailable, so torch takes its own fallback:
peer copies to the destination plus adds, which the simulator times as such.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
from torch._utils import _flatten_dense_tensors, _take_tensors, _unflatten_dense_tensors

DEFAULT_BUFFER = 10485760  # torch.cuda.comm's coalescing buffer size


def _cuda(index: int) -> torch.device:
    return torch.device("cuda", index)


def _index(device: Any) -> int:
    if isinstance(device, torch.device):
        return device.index if device.index is not None else torch.cuda.current_device()
    return int(device)


def broadcast(tensor: torch.Tensor, devices: Sequence[int]) -> list[torch.Tensor]:
    """torch._C._broadcast: the source tensor itself on its own device, a copy on each other
    (from a CPU tensor: a copy on every device)."""
    return [tensor if tensor.is_cuda and _index(d) == tensor.get_device()
            else tensor.to(_cuda(_index(d)), non_blocking=True) for d in devices]


def broadcast_out(tensor: torch.Tensor, out: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    for o in out:
        if o.shape != tensor.shape:
            raise RuntimeError(f"output tensor shape {tuple(o.shape)} does not match the input {tuple(tensor.shape)}")
        o.copy_(tensor, non_blocking=True)
    return list(out)


def broadcast_coalesced(tensors: Sequence[torch.Tensor], devices: Sequence[int],
                        buffer_size: int = DEFAULT_BUFFER) -> list[list[torch.Tensor]]:
    """torch._C._broadcast_coalesced: devices[0] must hold the tensors (they are returned as they
    are); for each other device, tensors are packed into flat buffers of at most `buffer_size`
    bytes, one peer copy per buffer, and unpacked there."""
    devices = [_index(d) for d in devices]
    if not devices:
        return []
    for t in tensors:
        if t.device != _cuda(devices[0]):
            raise RuntimeError(f"all tensors must be on devices[0]: cuda:{devices[0]}, got one on {t.device}")
    outputs: list[list[torch.Tensor]] = [list(tensors)] + [[] for _ in devices[1:]]
    if len(devices) == 1:
        return outputs
    order = {id(t): i for i, t in enumerate(tensors)}
    per_device: list[dict[int, torch.Tensor]] = [{} for _ in devices[1:]]
    with torch.no_grad():
        for chunk in _take_tensors(list(tensors), buffer_size):
            flat = _flatten_dense_tensors(chunk) if len(chunk) > 1 else chunk[0].reshape(-1)
            for k, d in enumerate(devices[1:]):
                copied = flat.to(_cuda(d), non_blocking=True)
                parts = _unflatten_dense_tensors(copied, chunk) if len(chunk) > 1 else [copied.view_as(chunk[0])]
                for t, p in zip(chunk, parts):
                    per_device[k][order[id(t)]] = p
    for k in range(len(devices) - 1):
        outputs[k + 1] = [per_device[k][i] for i in range(len(tensors))]
    return outputs


def scatter(tensor: torch.Tensor, devices: Sequence[int], chunk_sizes: Sequence[int] | None = None, dim: int = 0,
            streams: Sequence[Any] | None = None) -> list[torch.Tensor]:
    """torch._C._scatter: split along `dim`, one copy to each device (on streams[i] if given)."""
    devices = [_index(d) for d in devices]
    chunks = tensor.split(list(chunk_sizes), dim) if chunk_sizes is not None else tensor.chunk(len(devices), dim)
    out = []
    for i, chunk in enumerate(chunks):
        d = devices[i]
        if tensor.device == _cuda(d):
            out.append(chunk)
            continue
        stream = streams[i] if streams is not None and i < len(streams) else None
        with torch.cuda.stream(stream):
            out.append(chunk.to(_cuda(d), non_blocking=True))
    return out


def scatter_out(tensor: torch.Tensor, out: Sequence[torch.Tensor], dim: int = 0,
                streams: Sequence[Any] | None = None) -> list[torch.Tensor]:
    chunks = tensor.split([o.shape[dim] for o in out], dim)
    for i, (chunk, o) in enumerate(zip(chunks, out)):
        stream = streams[i] if streams is not None and i < len(streams) else None
        with torch.cuda.stream(stream):
            o.copy_(chunk, non_blocking=True)
    return list(out)


def _gathered_shape(tensors: Sequence[torch.Tensor], dim: int) -> list[int]:
    if not tensors:
        raise RuntimeError("Expected at least one tensor to gather from")
    first = tensors[0]
    dim = dim % first.dim() if first.dim() else 0
    shape = list(first.shape)
    shape[dim] = 0
    for i, t in enumerate(tensors):
        if t.device.type != "cuda":
            raise RuntimeError(f"Expected all input tensors to be CUDA tensors, but tensor at index {i} is on {t.device}")
        if t.dim() != first.dim() or any(a != b for k, (a, b) in enumerate(zip(t.shape, first.shape)) if k != dim):
            raise RuntimeError(f"Input tensor at index {i} has invalid shape {list(t.shape)}, "
                               f"but expected {list(first.shape)} apart from dimension {dim}")
        shape[dim] += t.shape[dim]
    return shape


def gather(tensors: Sequence[torch.Tensor], dim: int = 0, destination: int | None = None) -> torch.Tensor:
    """torch._C._gather: concatenate along `dim` on `destination` (-1: the CPU), one copy per input."""
    shape = _gathered_shape(tensors, dim)
    device = torch.device("cpu") if destination == -1 else _cuda(
        torch.cuda.current_device() if destination is None else destination)
    out = torch.empty(shape, dtype=tensors[0].dtype, device=device)
    return gather_out(tensors, out, dim)


def gather_out(tensors: Sequence[torch.Tensor], out: torch.Tensor, dim: int = 0) -> torch.Tensor:
    dim = dim % out.dim() if out.dim() else 0
    for chunk, t in zip(out.split([t.shape[dim] for t in tensors], dim), tensors):
        chunk.copy_(t, non_blocking=out.is_cuda)
    return out


_BINDINGS = {
    "_broadcast": broadcast, "_broadcast_out": broadcast_out, "_broadcast_coalesced": broadcast_coalesced,
    "_scatter": scatter, "_scatter_out": scatter_out, "_gather": gather, "_gather_out": gather_out,
}


def install_data_parallel() -> None:
    """On both builds: the CPU build lacks the bindings, the CUDA build's need a driver."""
    import torch.cuda.nccl as nccl

    for name, fn in _BINDINGS.items():
        setattr(torch._C, name, fn)
    nccl.is_available = lambda tensors: False  # torch's non-NCCL paths, without its warning
