"""What the simulator knows about one intercepted aten op: its signature.

A signature is everything the cost model may look at (op name, tags, argument tensors' shapes,
dtypes, strides and devices, non-float scalar arguments, output tensors). The user process
sends each distinct signature once (interned); later records refer to it by id.

This module is shared by interpose/ (which builds signatures from live tensors) and by the
simulator side (engine, cost, trace), so it must not import torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Union

# Bytes per element, keyed by the dtype names torch prints without the "torch." prefix.
DTYPE_BYTES: dict[str, int] = {
    "float64": 8, "float32": 4, "float16": 2, "bfloat16": 2,
    "float8_e4m3fn": 1, "float8_e5m2": 1, "float8_e4m3fnuz": 1, "float8_e5m2fnuz": 1,
    "float8_e8m0fnu": 1, "float4_e2m1fn_x2": 1,
    "int64": 8, "int32": 4, "int16": 2, "int8": 1, "uint8": 1, "uint16": 2, "uint32": 4,
    "uint64": 8, "bool": 1, "complex64": 8, "complex128": 16, "complex32": 4,
    "quint8": 1, "qint8": 1, "qint32": 4, "quint4x2": 1, "quint2x4": 1, "bits8": 1,
    "bits16": 2, "bits1x8": 1, "bits2x4": 1, "bits4x2": 1,
}


def dtype_bytes(dtype: str) -> int:
    """Element size of a dtype name; unknown names count as 4 bytes rather than 0."""
    return DTYPE_BYTES.get(dtype, 4)


@dataclass(frozen=True, slots=True)
class TensorMeta:
    """Shape, dtype, layout and placement of one tensor argument or result."""

    shape: tuple[int, ...]
    dtype: str
    stride: tuple[int, ...]
    device: str  # "cuda:0", "cpu", "meta"
    pinned: bool = False  # page-locked host memory (only meaningful for cpu tensors)

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    @property
    def itemsize(self) -> int:
        return dtype_bytes(self.dtype)

    @property
    def nbytes(self) -> int:
        """Bytes of the elements this view addresses (what a kernel reads or writes)."""
        return self.numel * self.itemsize

    @property
    def is_cuda(self) -> bool:
        return self.device.startswith("cuda")

    @property
    def device_index(self) -> int | None:
        if not self.is_cuda:
            return None
        _, _, idx = self.device.partition(":")
        return int(idx) if idx else 0

    def is_contiguous(self) -> bool:
        expected = 1
        for size, stride in zip(reversed(self.shape), reversed(self.stride)):
            if size != 1 and stride != expected:
                return False
            expected *= size
        return True

    def to_wire(self) -> list[Any]:
        return ["T", list(self.shape), self.dtype, list(self.stride), self.device, self.pinned]

    @staticmethod
    def from_wire(w: list[Any]) -> "TensorMeta":
        return TensorMeta(tuple(w[1]), w[2], tuple(w[3]), w[4], bool(w[5]))


# An argument as the cost model sees it: a tensor, a list of arguments (e.g. Tensor[] or
# int[]), or a plain scalar. Float scalars are sent as the string "<float>" so that ops whose
# only difference is a learning rate share one signature.
Arg = Union[TensorMeta, list, tuple, int, bool, str, None]

FLOAT_PLACEHOLDER = "<float>"


def arg_to_wire(a: Arg) -> Any:
    if isinstance(a, TensorMeta):
        return a.to_wire()
    if isinstance(a, (list, tuple)):
        return ["L", [arg_to_wire(x) for x in a]]
    return a


def arg_from_wire(w: Any) -> Arg:
    if isinstance(w, list):
        if w and w[0] == "T":
            return TensorMeta.from_wire(w)
        if w and w[0] == "L":
            return tuple(arg_from_wire(x) for x in w[1])
    return w


@dataclass(frozen=True, slots=True)
class OpSignature:
    """One aten op call, minus the data: name, schema-ordered arguments, results and tags.

    `name` is the overload's qualified name without namespace prefix noise, e.g.
    "aten::mm" with overload "default" (`full_name` gives "aten::mm.default").
    `args` follow the op schema's positional order (keyword arguments included, in order).
    """

    name: str
    overload: str
    args: tuple[Arg, ...]
    outputs: tuple[TensorMeta | None, ...]
    tags: frozenset[str] = field(default_factory=frozenset)
    # Values of the few arguments whose data decides the work, by argument name: a grouped
    # GEMM's group offsets ("offs"). Empty for every other op.
    data: tuple[tuple[str, tuple[int, ...]], ...] = ()

    def data_of(self, name: str) -> tuple[int, ...] | None:
        for key, value in self.data:
            if key == name:
                return value
        return None

    @property
    def full_name(self) -> str:
        return f"{self.name}.{self.overload}" if self.overload else self.name

    @property
    def short_name(self) -> str:
        """"mm" for "aten::mm": what users see in traces and summaries."""
        return self.name.split("::", 1)[-1]

    def tensors_in(self) -> list[TensorMeta]:
        out: list[TensorMeta] = []

        def walk(a: Arg) -> None:
            if isinstance(a, TensorMeta):
                out.append(a)
            elif isinstance(a, (list, tuple)):
                for x in a:
                    walk(x)

        for a in self.args:
            walk(a)
        return out

    def tensors_out(self) -> list[TensorMeta]:
        return [t for t in self.outputs if t is not None]

    def cuda_device(self) -> int | None:
        """Index of the first CUDA device among outputs then inputs, or None for host-only ops."""
        for t in self.tensors_out():
            if t.is_cuda:
                return t.device_index
        for t in self.tensors_in():
            if t.is_cuda:
                return t.device_index
        return None

    def to_wire(self) -> list[Any]:
        return [
            self.name,
            self.overload,
            [arg_to_wire(a) for a in self.args],
            [o.to_wire() if o is not None else None for o in self.outputs],
            sorted(self.tags),
            *([[[k, list(v)] for k, v in self.data]] if self.data else []),
        ]

    @staticmethod
    def from_wire(w: list[Any]) -> "OpSignature":
        return OpSignature(
            name=w[0],
            overload=w[1],
            args=tuple(arg_from_wire(a) for a in w[2]),
            outputs=tuple(TensorMeta.from_wire(o) if o is not None else None for o in w[3]),
            tags=frozenset(w[4]),
            data=tuple((str(k), tuple(int(x) for x in v)) for k, v in w[5]) if len(w) > 5 else (),
        )


# Tag of an op whose CUDA implementation copies a count to the host and waits for it (nonzero,
# boolean-mask indexing, unique, bincount, ...): the host stalls until the op is done on the GPU.
HOST_SYNC = "host_sync"
