"""The Triton kernels Inductor generates, launched on virtual GPUs.

Inductor's generated wrapper (the Python module `call(args)` of a compiled graph) runs as it
would on a GPU: it allocates its buffers (`empty_strided_cuda`), calls extern kernels (cuBLAS
GEMMs, attention, convolutions: aten ops the observer reports) and launches its Triton kernels
with `kernel.run(*args, stream=...)`. Here a Triton kernel is never compiled (there is no GPU to
compile for): `AsyncCompile.triton` loads the kernel's module (its CachingAutotuner, which holds
the kernel's argument names and metadata) and hands the wrapper a VirtualTritonKernel whose
`run` reports one fused kernel to the simulator.

What a fused kernel moves and computes comes from its launch, as Inductor generated it: its
pointer arguments are exactly the buffers that enter or leave the kernel (everything fused
inside stays in registers): `in_ptr*` are read, `out_ptr*` written, `in_out_ptr*` both, each
counted once over the elements its view addresses. Its FLOPs are one per element per fused aten
op that computes (the count the eager pointwise model uses; phantora/cost/fused.py), over the
elements it processes (xnumel times r0_numel). The aten ops it fused are those of Inductor's own comment above the kernel in the
wrapper ("Original ATen: [...]"); the trace shows them in the kernel's args.
"""

from __future__ import annotations

import functools
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from interpose.values import policy as values
from phantora.ops import OpSignature, TensorMeta

# The signature namespace of generated kernels (phantora/cost/fused.py times them).
NAMESPACE = "triton"


@dataclass(frozen=True)
class KernelInfo:
    """What one generated kernel is, known when its module is loaded."""

    name: str  # Inductor's kernel name: triton_poi_fused_gelu_0, triton_per_fused_..., triton_tem_...
    arg_names: tuple[str, ...]  # the kernel function's parameters, in launch order
    fused_ops: tuple[str, ...]  # the aten ops Inductor fused into it ("aten.gelu", ...)
    kind: str  # pointwise / reduction / persistent_reduction / template / foreach / ...
    kv_block: int = 0  # flex attention's template: its SPARSE_KV_BLOCK_SIZE


_SPARSE_KV_BLOCK = re.compile(r"SPARSE_KV_BLOCK_SIZE\s*:\s*tl\.constexpr\s*=\s*(\d+)")


_ORIGINAL_ATEN = re.compile(r"Original ATen: \[([^\]]*)\]")


def _fused_ops_from_wrapper(wrapper_file: str | None, kernel_name: str) -> tuple[str, ...]:
    """The aten ops Inductor fused into the kernel, from its comment above the kernel's
    definition in the wrapper module being loaded: the "Original ATen: [...]" list, or for
    templates (which have none) the ops their "Graph fragment" calls; empty without a comment."""
    if not wrapper_file:
        return ()
    try:
        text = _read(wrapper_file)
    except OSError:
        return ()
    at = text.find(f"{kernel_name} = async_compile.")
    if at < 0:
        return ()
    previous = text.rfind("async_compile.", 0, at)  # the comment starts after the kernel before
    header = text[max(0, previous):at]
    found = _ORIGINAL_ATEN.findall(header)
    if found:
        return tuple(op.strip() for op in found[-1].split(",") if op.strip())
    calls = dict.fromkeys(f"{ns}.{op}" for ns, op in _FRAGMENT_CALL.findall(header))
    return tuple(calls)


_FRAGMENT_CALL = re.compile(r"call_function\[target=torch\.ops\.(\w+)\.(\w+)")


@functools.lru_cache(maxsize=64)
def _read(path: str) -> str:
    return Path(path).read_text()


def _kind(autotuner: Any, name: str) -> str:
    meta = getattr(autotuner, "heuristic_type", None)
    if meta is not None:
        return str(getattr(meta, "name", meta)).lower()
    prefix = name.split("_")[1] if name.count("_") >= 1 else ""
    return {"poi": "pointwise", "red": "reduction", "per": "persistent_reduction", "tem": "template"}.get(prefix, prefix)


class VirtualTritonKernel:
    """Stands for one compiled Triton kernel in Inductor's wrapper: `run` reports it."""

    def __init__(self, autotuner: Any, info: KernelInfo, report: Callable[[OpSignature, tuple, int], None]) -> None:
        self._autotuner = autotuner
        self.info = info
        self._report = report
        self._sigs: dict[tuple, OpSignature] = {}

    def __getattr__(self, name: str) -> Any:
        return getattr(self._autotuner, name)

    def run(self, *args: Any, stream: Any = None, **kwargs: Any) -> None:
        if self.info.kv_block:
            sig = launch_signature(self.info, args)  # its cost follows the BlockMask's values
        else:
            key = tuple((tuple(a.shape), a.dtype, a.stride(), a.device) if isinstance(a, torch.Tensor) else a
                        for a in args)
            sig = self._sigs.get(key)
            if sig is None:
                sig = self._sigs[key] = launch_signature(self.info, args)
        self._report(sig, args, int(stream) if isinstance(stream, int) else -1)
        for name, a in zip(self.info.arg_names, args):
            if isinstance(a, torch.Tensor) and name.startswith(("out_ptr", "in_out_ptr")):
                # written by code phantora does not evaluate: its data is unknown (the value
                # policy's placeholder), whatever the buffer held before
                values.set_shadow(a, None)
                values.set_value(a, None)

    def precompile(self, *args: Any, **kwargs: Any) -> None:
        return None  # nothing to compile for a virtual GPU


def _wrapper_file() -> str | None:
    """The file of the generated wrapper module whose top level is defining kernels now."""
    frame = sys._getframe(1)
    while frame is not None:
        if "async_compile" in frame.f_globals and frame.f_code.co_name == "<module>":
            return frame.f_globals.get("__file__")
        frame = frame.f_back
    return None


def _meta(t: torch.Tensor) -> TensorMeta:
    from interpose.ops.signature import tensor_meta

    return tensor_meta(t)


def launch_signature(info: KernelInfo, args: tuple) -> OpSignature:
    """The signature of one launch: the tensors read and written (by their parameter names),
    the elements processed, the fused aten ops."""
    reads: list[TensorMeta] = []
    writes: list[TensorMeta] = []
    numel = {"x": 1, "y": 1, "z": 1, "r": 1}
    for name, a in zip(info.arg_names, args):
        if isinstance(a, torch.Tensor):
            if name.startswith("in_out_ptr"):
                reads.append(_meta(a))
                writes.append(_meta(a))
            elif name.startswith("out_ptr"):
                writes.append(_meta(a))
            else:  # in_ptr*, and the named inputs of templates (arg_Q, arg_K, ...)
                reads.append(_meta(a))
        elif isinstance(a, int) and name.endswith("numel"):
            axis = "r" if name.startswith("r") else name[0]
            if axis in numel:
                numel[axis] *= int(a)
    elements = numel["x"] * numel["y"] * numel["z"] * numel["r"]
    extra: tuple = ()
    if "arg_Q" in info.arg_names and "arg_KV_NUM_BLKS" in info.arg_names:
        extra = (_flex_facts(info, dict(zip(info.arg_names, args))),)
    return OpSignature(
        name=f"{NAMESPACE}::{info.name}",
        overload="default",
        args=(tuple(reads), tuple(writes), elements, info.fused_ops, info.kind, *extra),
        outputs=tuple(writes),
        tags=frozenset({"inductor"}),
    )


def _flex_facts(info: KernelInfo, named: dict[str, Any]) -> tuple:
    """What the flex-attention model needs of its template's launch: q, k, v, the per-query-block
    key-block counts, the key block size, the blocks visited (from the BlockMask's real values,
    interpose/ops/hops.py; None when unknown) and whether it is the backward kernel."""
    from interpose.ops.hops import visited_blocks

    counts = named.get("arg_KV_NUM_BLKS")
    visited = visited_blocks((None, None, counts, None, named.get("arg_FULL_KV_NUM_BLKS")))
    backward = "arg_DO" in named
    return (_meta(named["arg_Q"]), _meta(named["arg_K"]), _meta(named["arg_V"]),
            _meta(counts) if isinstance(counts, torch.Tensor) else None, info.kv_block, visited, backward)


def virtual_kernel_loader(report: Callable[[OpSignature, tuple, int], None]) -> Callable[..., Any]:
    """A replacement for AsyncCompile.triton: the kernel's module is loaded (no GPU needed) and
    its launches are reported instead of compiled and run."""
    from torch._inductor.codecache import PyCodeCache

    def triton(self: Any, kernel_name: str, source_code: str, device_str: str = "cuda") -> VirtualTritonKernel:
        autotuner = getattr(PyCodeCache.load(source_code), kernel_name)
        caller = _wrapper_file()
        fn = getattr(autotuner, "fn", None)
        arg_names = tuple(getattr(fn, "arg_names", ()) or ())
        block = _SPARSE_KV_BLOCK.search(source_code)
        info = KernelInfo(kernel_name, arg_names, _fused_ops_from_wrapper(caller, kernel_name),
                          _kind(autotuner, kernel_name), int(block.group(1)) if block else 0)
        return VirtualTritonKernel(autotuner, info, report)

    return triton
