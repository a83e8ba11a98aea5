"""`phantora calibrate`: measure an op/shape grid on the local GPU and write a calibration table.

    rows = calibration_grid("quick")                  # dict rows without "us"
    for row in calibrate(rows, "cuda", out_file): ...  # writes the device row, then each timed row

The table has the shared/calibration format (one JSON object per line: op, sizes, dtype, us)
plus a device row, so `phantora trace --calibration FILE` reads it like the shipped H100 table.
Each row is timed through the measured mode's code (measured.measure_signature): its aten ops
run with random inputs, CUDA events around back-to-back calls queued behind a sleep kernel.
That method has no per-launch gap, unlike the shared file's one event pair per launch, so the
device row says so (gap_us 0) and records its floor (a 1-element add_ timed the same way) as floor_us.

Grids: "full" is the shared H100 file's families and shapes plus the sizes between them (an
octave apart, so that every shape inside the grid has a measured neighbour within the
calibrated estimator's one-octave radius) and common model widths (768, 3072); "quick" a
coarse subset (a few minutes on a GPU); "tiny" a handful of small shapes that a CPU times in
seconds (`--device cpu`, for checking the pipeline: those times describe the CPU).

`--grid sweep` is not a table of this format: kernel_sweep.py runs the H100 kernel sweep's op cases
(every kernel each launches, torch.profiler) for the per-family fit.
"""

from __future__ import annotations

import datetime as _dt
import itertools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, TextIO

from phantora.cost.measurements import row_signatures
from phantora.ops import OpSignature, TensorMeta

GRIDS = ("full", "quick", "tiny")


def _mm(sizes: list[int], dtypes: list[str]) -> list[dict]:
    return [{"op": "mm", "M": m, "N": n, "K": k, "dtype": d}
            for d in dtypes for m, n, k in itertools.product(sizes, sizes, sizes)]


def _elementwise(ns: list[int], dtypes: list[str]) -> list[dict]:
    return [{"op": op, "n": n, "dtype": d} for n in ns for d in dtypes for op in ("add", "gelu", "copy", "sum")]


def _norms(shapes: list[tuple[int, int]], dtypes: list[str]) -> list[dict]:
    return [{"op": op, "rows": r, "cols": c, "dtype": d}
            for r, c in shapes for d in dtypes for op in ("layer_norm", "softmax")]


def _sdpa(shapes: list[tuple[int, int, int, int]]) -> list[dict]:
    return [{"op": op, "B": b, "H": h, "S": s, "D": dd, "causal": True, "dtype": "bf16"}
            for b, h, s, dd in shapes for op in ("sdpa_fwd", "sdpa_fwd_bwd")]


def _copies(sizes: list[int], gpu: bool) -> list[dict]:
    ops = ("h2d_pinned", "d2h_pinned", "d2d") if gpu else ("d2d",)
    return [{"op": op, "bytes": b} for b in sizes for op in ops]


def calibration_grid(grid: str, gpu: bool = True) -> list[dict]:
    """The rows (without "us") a calibration run measures; `gpu` False leaves out host copies."""
    if grid == "tiny":
        return (_mm([64, 256], ["fp32", "bf16"]) + _elementwise([1 << 12, 1 << 16], ["fp32", "bf16"])
                + _norms([(256, 256)], ["fp32", "bf16"]) + _copies([1 << 16, 1 << 20], False))
    if grid == "quick":
        return (_mm([256, 1024, 4096], ["bf16", "fp32"])
                + _elementwise([1 << 16, 1 << 20, 1 << 24, 1 << 28], ["bf16", "fp32"])
                + _norms([(8192, 1024), (8192, 4096), (32768, 4096)], ["bf16"])
                + _sdpa([(8, 16, 1024, 64), (2, 32, 4096, 128)])
                + _copies([1 << 20, 1 << 26], gpu))
    if grid == "full":
        sizes = [256, 512, 768, 1024, 2048, 3072, 4096, 8192]
        sdpa = [(b, h, s, d) for d in (64, 128) for s in (512, 1024, 2048, 4096, 8192)
                for b, h in ((2, 16), (4, 16), (8, 16), (16, 16)) if b * h * s * d <= (1 << 28)]
        return (_mm(sizes, ["bf16", "fp32"])
                + _elementwise([1 << e for e in range(14, 29)], ["bf16", "fp32"])
                + _norms([(r, c) for r in (4096, 8192, 16384, 32768) for c in (768, 1024, 2048, 4096, 8192)],
                         ["bf16", "fp32"])
                + _sdpa(sdpa)
                + _copies([1 << e for e in range(16, 29, 2)], gpu))
    raise ValueError(f"unknown grid {grid!r}; choose from {', '.join(GRIDS)}")


def _on_device(sig: OpSignature, device: str) -> OpSignature:
    """Rows describe cuda:0 tensors; on the CPU they become cpu tensors (pinned memory needs CUDA)."""
    if device.startswith("cuda"):
        return sig

    def move(a):  # type: ignore[no-untyped-def]
        if isinstance(a, TensorMeta):
            return TensorMeta(a.shape, a.dtype, a.stride, "cpu" if a.is_cuda else a.device, False)
        if isinstance(a, tuple):
            return tuple(move(x) for x in a)
        return a

    return OpSignature(sig.name, sig.overload, tuple(move(a) for a in sig.args),
                       tuple(move(o) for o in sig.outputs), sig.tags)


@dataclass(frozen=True)
class RowResult:
    row: dict  # with "us" when timed
    error: str | None  # why it was not timed


def _launch_floor_signature() -> OpSignature:
    x = TensorMeta((1,), "float32", (1,), "cuda:0")
    return OpSignature("aten::add_", "Tensor", (x, x, 1), (x,), frozenset({"pointwise", "inplace"}))


def device_row(device: str, floor_us: float) -> dict:
    from phantora.cost.measured import local_device_info

    row = {"op": "device", **local_device_info(device)}
    row.update(
        floor_us=round(floor_us, 3),
        gap_us=0.0,
        method="median of 5 samples of back-to-back calls after warm-up; on a GPU CUDA events around the "
               "calls, queued behind a sleep kernel (no per-launch gap); floor_us: a 1-element add_ timed so",
        note=f"measured {_dt.date.today().isoformat()} by phantora calibrate",
    )
    return row


def calibrate(rows: list[dict], device: str, out: TextIO,
              progress: Callable[[int, int, RowResult], None] | None = None) -> Iterator[RowResult]:
    """Time each row on `device`, writing the device row first and then each timed row to `out`."""
    from phantora.cost.measured import TimingConfig, Unmeasurable, measure_signature, tiny_launch_host_us

    timing = TimingConfig.for_device(device)
    if device.startswith("cuda"):
        timing = TimingConfig(warmup_calls=5, repeats=5, target_ns=2_000_000, max_calls=200, max_bytes=0)
    floor_ns = measure_signature(_on_device(_launch_floor_signature(), device), device, timing)
    out.write(json.dumps(device_row(device, floor_ns / 1e3)) + "\n")
    # the host's cost of dispatching and launching one small op (the host cost model's scale)
    out.write(json.dumps({"op": "tiny_launch_host_us", "us": round(tiny_launch_host_us(device), 3)}) + "\n")
    out.flush()
    for i, row in enumerate(rows):
        try:
            ns = sum(measure_signature(_on_device(s, device), device, timing) for s in row_signatures(row))
        except Unmeasurable as e:
            result = RowResult(row, str(e))
        else:
            result = RowResult({**row, "us": ns / 1e3}, None)
            out.write(json.dumps(result.row) + "\n")
            out.flush()
        if progress is not None:
            progress(i + 1, len(rows), result)
        yield result


def write_calibration(path: Path, grid: str, device: str,
                      progress: Callable[[int, int, RowResult], None] | None = None) -> list[RowResult]:
    """Measure `grid` on `device` into `path` (written as it goes: an interrupted run leaves a valid table)."""
    rows = calibration_grid(grid, gpu=device.startswith("cuda"))
    with open(path, "w") as out:
        return list(calibrate(rows, device, out, progress))
