"""Measured kernel times (shared/calibration/*.jsonl) as the op signatures they timed.

Each row of a calibration file times one PyTorch call on a real GPU; `load_measurements`
turns it into the aten op signature(s) that call dispatches on CUDA, so an estimator can be
compared with, or calibrated on, the measurement. `read_calibration` reads a whole file with
its device row and checks every line (the calibrated estimator and `phantora trace
--calibration` use it); `load_measurements` is the lenient reader tests and benchmarks use.

Rows and what they timed (see shared/calibration/README.md):
    mm            a [M, K] @ [K, N] in bf16 or true fp32           -> aten::mm
    add / gelu    elementwise on n elements                         -> aten::add.Tensor / aten::gelu
    copy          copy of n elements on the device                  -> aten::copy_ (d2d)
    sum           full reduction of n elements                      -> aten::sum
    layer_norm    rows x cols                                       -> aten::native_layer_norm
    softmax       rows x cols, last dim                             -> aten::_softmax
    sdpa_fwd      causal F.scaled_dot_product_attention, B x H x S x D, bf16: torch 2.11 on
                  the H100 picked cuDNN                             -> _scaled_dot_product_cudnn_attention
    sdpa_fwd_bwd  the same plus autograd.grad of q, k, v            -> + ..._cudnn_attention_backward
    h2d_pinned / d2h_pinned / d2d   copies of `bytes` bytes         -> aten::copy_
    tiny_launch_host_us             host time per 1-element add_    (host cost, no kernel)
    device        the GPU (or CPU) the file was measured on: name, torch version, and
                  optionally floor_us, the measuring method's floor (default 25 us), and
                  gap_us, the per-launch gap each timing includes (default: estimated)
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

# The H100 measurements shipped with phantora (copied from shared/calibration; README beside it).
H100_CALIBRATION = Path(__file__).with_name("data") / "h100_sxm_kernels.jsonl"

from phantora.cost.estimate import KernelTimesError
from phantora.ops import OpSignature, TensorMeta

# Timings under this are the floor of the measuring method (one CUDA event pair around one
# launch), not the kernel's own duration: real short kernels take ~1-2.5 us.
MEASUREMENT_FLOOR_US = 25.0
# A family whose fastest point sits under that floor shows the floor itself (cuBLAS calls
# floor at ~20 us, elementwise at ~13 us); its points within this factor of that fastest point
# are floor-dominated: at least half of the measured time is the method's launch gap.
FLOOR_DOMINATED_FACTOR = 2.0

_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
# The fields each kind of row needs besides "op" and "us" (a "device" row needs "name").
ROW_FIELDS: dict[str, tuple[str, ...]] = {
    "mm": ("M", "N", "K", "dtype"),
    "add": ("n", "dtype"), "gelu": ("n", "dtype"), "copy": ("n", "dtype"), "sum": ("n", "dtype"),
    "layer_norm": ("rows", "cols", "dtype"), "softmax": ("rows", "cols", "dtype"),
    "sdpa_fwd": ("B", "H", "S", "D", "dtype"), "sdpa_fwd_bwd": ("B", "H", "S", "D", "dtype"),
    "h2d_pinned": ("bytes",), "d2h_pinned": ("bytes",), "d2d": ("bytes",),
    "tiny_launch_host_us": (),
}


@dataclass(frozen=True, slots=True)
class Measurement:
    family: str  # benchmark grouping: "mm bf16", "elementwise", "sdpa fwd", "copy h2d", ...
    label: str  # the row in short, e.g. "mm 4096x4096x4096 bf16"
    signatures: tuple[OpSignature, ...]  # the ops the measured call dispatches, in order
    measured_ns: float
    kind: str = "kernel"  # "kernel": GPU time of the signatures; "host": host time per call


def floor_dominated(measurements: list[Measurement], floor_us: float = MEASUREMENT_FLOOR_US) -> list[bool]:
    """For each measurement: is it dominated by the measuring method's floor?

    Per family: if the family's fastest point is under `floor_us`, that point is the family's
    floor, and every point under FLOOR_DOMINATED_FACTOR times it is floor-dominated. Host
    timings are never floor-dominated.
    """
    fastest: dict[str, float] = {}
    for m in measurements:
        if m.kind == "kernel":
            fastest[m.family] = min(fastest.get(m.family, float("inf")), m.measured_ns)
    out = []
    for m in measurements:
        floor = fastest.get(m.family, 0.0)
        limited = m.kind == "kernel" and (
            m.measured_ns < floor_us * 1e3
            or (floor < floor_us * 1e3 and m.measured_ns < FLOOR_DOMINATED_FACTOR * floor)
        )
        out.append(limited)
    return out


def _contiguous(shape: tuple[int, ...], dtype: str, device: str = "cuda:0", pinned: bool = False) -> TensorMeta:
    stride, acc = [], 1
    for size in reversed(shape):
        stride.append(acc)
        acc *= size
    return TensorMeta(tuple(shape), dtype, tuple(reversed(stride)), device, pinned)


def _sig(name: str, overload: str, args: tuple, outputs: tuple, tags: tuple[str, ...] = ()) -> OpSignature:
    return OpSignature(name, overload, args, outputs, frozenset(tags))


def mm_signature(m: int, n: int, k: int, dtype: str) -> OpSignature:
    a, b, out = _contiguous((m, k), dtype), _contiguous((k, n), dtype), _contiguous((m, n), dtype)
    return _sig("aten::mm", "default", (a, b), (out,), ("core",))


def add_signature(n: int, dtype: str) -> OpSignature:
    x = _contiguous((n,), dtype)
    return _sig("aten::add", "Tensor", (x, x, 1), (x,), ("core", "pointwise"))


def gelu_signature(n: int, dtype: str) -> OpSignature:
    x = _contiguous((n,), dtype)
    return _sig("aten::gelu", "default", (x, "none"), (x,), ("core", "pointwise"))


def copy_signature(src: TensorMeta, dst: TensorMeta) -> OpSignature:
    return _sig("aten::copy_", "default", (dst, src, False), (dst,), ("inplace",))


def sum_signature(n: int, dtype: str) -> OpSignature:
    x = _contiguous((n,), dtype)
    return _sig("aten::sum", "default", (x, None), (_contiguous((), dtype),), ("core", "reduction"))


def layer_norm_signature(rows: int, cols: int, dtype: str) -> OpSignature:
    x, w = _contiguous((rows, cols), dtype), _contiguous((cols,), dtype)
    stats = _contiguous((rows, 1), "float32")
    return _sig("aten::native_layer_norm", "default", (x, (cols,), w, w, "<float>"), (x, stats, stats), ("core",))


def softmax_signature(rows: int, cols: int, dtype: str) -> OpSignature:
    x = _contiguous((rows, cols), dtype)
    return _sig("aten::_softmax", "default", (x, -1, False), (x,), ("core",))


def cudnn_attention_signatures(b: int, h: int, s: int, d: int, dtype: str, causal: bool,
                               backward: bool) -> tuple[OpSignature, ...]:
    q = _contiguous((b, h, s, d), dtype)
    lse = _contiguous((b, h, s, 1), "float32")
    seed = _contiguous((), "int64")
    fwd = _sig("aten::_scaled_dot_product_cudnn_attention", "default",
               (q, q, q, None, backward, "<float>", causal, False, None),
               (q, lse, None, None, None, None, seed, seed, None), ("nondeterministic_seeded",))
    if not backward:
        return (fwd,)
    bwd = _sig("aten::_scaled_dot_product_cudnn_attention_backward", "default",
               (q, q, q, q, q, lse, seed, seed, None, None, None, s, s, "<float>", causal, None),
               (q, q, q))
    return (fwd, bwd)


def _row_to_measurement(r: dict) -> Measurement | None:
    op, us = r.get("op"), r.get("us")
    if us is None:
        return None
    ns = float(us) * 1e3
    dtype = _DTYPES.get(r.get("dtype", ""), "float32")
    short = r.get("dtype", "")
    if op == "mm":
        label = f"mm {r['M']}x{r['N']}x{r['K']} {short}"
        return Measurement(f"mm {short}", label, (mm_signature(r["M"], r["N"], r["K"], dtype),), ns)
    if op in ("add", "gelu", "copy"):
        n = r["n"]
        if op == "add":
            sig = add_signature(n, dtype)
        elif op == "gelu":
            sig = gelu_signature(n, dtype)
        else:
            x = _contiguous((n,), dtype)
            sig = copy_signature(x, x)
        return Measurement("elementwise", f"{op} {n} {short}", (sig,), ns)
    if op == "sum":
        return Measurement("reduction", f"sum {r['n']} {short}", (sum_signature(r["n"], dtype),), ns)
    if op == "layer_norm":
        return Measurement("layer_norm", f"layer_norm {r['rows']}x{r['cols']} {short}",
                           (layer_norm_signature(r["rows"], r["cols"], dtype),), ns)
    if op == "softmax":
        return Measurement("softmax", f"softmax {r['rows']}x{r['cols']} {short}",
                           (softmax_signature(r["rows"], r["cols"], dtype),), ns)
    if op in ("sdpa_fwd", "sdpa_fwd_bwd"):
        backward = op == "sdpa_fwd_bwd"
        sigs = cudnn_attention_signatures(r["B"], r["H"], r["S"], r["D"], dtype, bool(r.get("causal")), backward)
        label = f"{op} B{r['B']} H{r['H']} S{r['S']} D{r['D']}"
        return Measurement("sdpa fwd+bwd" if backward else "sdpa fwd", label, sigs, ns)
    if op in ("h2d_pinned", "d2h_pinned", "d2d"):
        n = r["bytes"]
        dev, host = _contiguous((n,), "uint8"), _contiguous((n,), "uint8", "cpu", pinned=True)
        src, dst = {"h2d_pinned": (host, dev), "d2h_pinned": (dev, host), "d2d": (dev, dev)}[op]
        return Measurement(f"copy {op.split('_')[0]}", f"{op} {n} B", (copy_signature(src, dst),), ns)
    if op == "tiny_launch_host_us":
        x = _contiguous((1,), "float32")
        sig = _sig("aten::add_", "Tensor", (x, x, 1), (x,), ("pointwise", "inplace"))
        return Measurement("host launch", "1-element add_ host time", (sig,), ns, kind="host")
    return None


def row_signatures(row: dict) -> tuple[OpSignature, ...]:
    """The aten op signatures a calibration row's PyTorch call dispatches (no "us" needed)."""
    m = _row_to_measurement({**row, "us": 1.0})
    if m is None:
        raise ValueError(f"not a calibration row phantora knows: {row}")
    return m.signatures


def load_measurements(path: str | Path) -> list[Measurement]:
    """Every row of a calibration .jsonl file that phantora knows how to express as ops."""
    out = []
    for line in Path(path).read_text().splitlines():
        if line.strip():
            m = _row_to_measurement(json.loads(line))
            if m is not None:
                out.append(m)
    return out


class CalibrationFileError(KernelTimesError):
    """A calibration file phantora cannot use; the message names the file (and line) and the fix."""


@dataclass(frozen=True)
class CalibrationFile:
    """One calibration table as read from disk: its device row and its measurements."""

    path: Path
    device: dict  # the {"op": "device", "name": ...} row
    measurements: list[Measurement]
    lines: list[int]  # line number of each measurement, for messages
    unknown_ops: dict[str, int]  # rows whose op phantora does not use, by op (skipped)

    @property
    def device_name(self) -> str:
        return str(self.device["name"])

    @property
    def floor_us(self) -> float:
        """The measuring method's floor: timings under it say little about the kernel."""
        return float(self.device.get("floor_us", MEASUREMENT_FLOOR_US))

    @property
    def gap_us(self) -> float | None:
        """The per-launch gap every timing includes, when the file states it (phantora calibrate
        writes 0: its method has none); None: unknown, to be estimated from the floor."""
        gap = self.device.get("gap_us")
        return None if gap is None else float(gap)


def _example_row() -> str:
    return '{"op": "mm", "M": 4096, "N": 4096, "K": 4096, "dtype": "bf16", "us": 207.3}'


def _check_row(path: Path, line: int, r: object) -> None:
    where = f"{path}:{line}"
    if not isinstance(r, dict):
        raise CalibrationFileError(f"{where}: expected a JSON object per line, e.g. {_example_row()}")
    op = r.get("op")
    if not isinstance(op, str):
        raise CalibrationFileError(f'{where}: no "op" field; each line is one measurement, e.g. {_example_row()}')
    if op == "device":
        if not isinstance(r.get("name"), str) or not r["name"]:
            raise CalibrationFileError(f'{where}: the device row needs "name" (what torch.cuda.get_device_name() '
                                       'returns on the measured GPU)')
        for name in ("floor_us", "gap_us"):
            value = r.get(name, 0.0)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise CalibrationFileError(f'{where}: "{name}" must be a number of microseconds >= 0')
        return
    fields = ROW_FIELDS.get(op)
    if fields is None:
        return  # an op this version does not use: skipped, counted in unknown_ops
    missing = [f for f in (*fields, "us") if f not in r]
    if missing:
        raise CalibrationFileError(f'{where}: a "{op}" row needs {", ".join((*fields, "us"))}; '
                                   f'missing {", ".join(missing)}')
    us = r["us"]
    if isinstance(us, bool) or not isinstance(us, (int, float)) or not us > 0:
        raise CalibrationFileError(f'{where}: "us" must be a positive number of microseconds, not {us!r}')
    for f in fields:
        v = r[f]
        if f == "dtype":
            if v not in _DTYPES:
                raise CalibrationFileError(f"{where}: dtype {v!r} is not one of {', '.join(_DTYPES)}")
        elif isinstance(v, bool) or not isinstance(v, int) or v <= 0:
            raise CalibrationFileError(f'{where}: "{f}" must be a positive integer, not {v!r}')


def read_calibration(path: str | Path) -> CalibrationFile:
    """Read and check a calibration .jsonl file (shared/calibration format plus a device row).

    Raises CalibrationFileError naming the file, the line and what to change.
    """
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise CalibrationFileError(f"calibration file {path} does not exist") from None
    except (OSError, UnicodeDecodeError) as e:
        reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        raise CalibrationFileError(f"cannot read calibration file {path}: {reason}") from None
    device: dict | None = None
    measurements: list[Measurement] = []
    lines: list[int] = []
    unknown: dict[str, int] = {}
    for n, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            r = json.loads(line)
        except json.JSONDecodeError as e:
            raise CalibrationFileError(f"{path}:{n}: not valid JSON ({e.msg} at column {e.colno}); "
                                       f"each line is one measurement, e.g. {_example_row()}") from None
        _check_row(path, n, r)
        if r["op"] == "device":
            device = r
            continue
        if r["op"] not in ROW_FIELDS:
            unknown[r["op"]] = unknown.get(r["op"], 0) + 1
            continue
        m = _row_to_measurement(r)
        if m is not None:
            measurements.append(m)
            lines.append(n)
    if device is None:
        raise CalibrationFileError(f'{path}: no device row; add one line like {{"op": "device", "name": '
                                   f'"NVIDIA H100 80GB HBM3"}} naming the GPU it was measured on '
                                   f"(phantora calibrate writes it)")
    if not any(m.kind == "kernel" for m in measurements):
        raise CalibrationFileError(f"{path}: no kernel measurements phantora can use; known ops: "
                                   f"{', '.join(k for k in ROW_FIELDS if k != 'tiny_launch_host_us')}")
    return CalibrationFile(path, device, measurements, lines, unknown)
