"""The calibrated kernel-time estimator: a measured table, interpolated across shapes.

    cal = read_calibration(path)                     # measurements.py: checked rows + device row
    est = CalibratedEstimator(build_table(cal, analytical), analytical)
    est.estimate(sig)   # KernelEstimate; .estimator is "calibrated" or "analytical (<why>)"

From rows to points. Each measurement row (one PyTorch call timed on a real GPU) becomes a
point: its op family and dtype (the key, from `table_key`, the same function that reads a
query signature), its shape in log2 coordinates, and its kernel time, which is the measured
time minus the measuring method's gap. The gap: calibration files time one launch between two
CUDA events, so every timing carries the launch gap (shared/calibration README: ~15-25 us is
the method's floor). Points dominated by that floor (measurements.floor_dominated) say nothing
about the kernel and are left out, but they do measure the gap: for each measurement family it
is the median of (measured - analytical kernel time) over its floor-dominated points, where the
kernel is a few microseconds at most; a family without such points takes the file's median,
and a file without any takes 0. A file whose device row states the gap (gap_us: `phantora
calibrate` writes 0, its method has none) is taken at its word. Points measured >10%
slower than a point of the same key that is at least as large in every coordinate are left out
too, and so are GEMMs >15% slower than their mirror (M and N swapped): those are measurement
events (clock, contention), not shape effects.

From points to estimates. For a signature whose key has points, the estimate is

    analytical(sig) * exp(r),   r = inverse-distance-weighted mean of log(kernel / analytical)

over the nearest points (at most NEIGHBOURS) within INTERPOLATION_RADIUS octaves (Euclidean
distance in log2 shape), and only inside the measured points' bounding box. It reproduces a
measured shape exactly, keeps the analytical model's shape effects (tiles, waves, bytes) between
measured shapes, and corrects the model where this GPU deviates from it (throttling on the
largest GEMMs, cuBLAS's choices on skinny ones). Why this rather than interpolating the times
themselves (log time vs log FLOPs between neighbours) or one fitted efficiency per family:
leave-one-out on the shipped H100 table, all families, |error| median / p90: analytical
4.2% / 13.1%, one correction per family 2.8% / 10.9%, log-log in FLOPs 4.9% / 17.0%, this
2.0% / 7.8% (benchmarks/bench_cost.py prints these and the per-family figures). One octave is
the table's grid spacing. Wider radii (1.5-3) do as well on held-out table points (7.6-7.9%
p90) but calibrate shapes far from any measurement: on the GPT examples' GEMMs as
torch.profiler timed them in training, their p90 error grows from 18% to 24-31%.

Outside that range, for ops no row measures, and for shapes whose key has no points, the
analytical estimate is returned unchanged with its reason in `estimator`:
"analytical (outside calibrated range)" or "analytical (no calibration data for this op)".
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from dataclasses import dataclass
from pathlib import Path

from phantora.cost.estimate import NO_GPU_WORK, KernelEstimate
from phantora.cost.analytical import AnalyticalEstimator
from phantora.cost.attention import parse_attention
from phantora.cost.host import HOST_COSTS
from phantora.cost.roofline import context_for
from phantora.cost.measurements import CalibrationFile, Measurement, floor_dominated
from phantora.hardware import GPUSpec
from phantora.ops import OpSignature, TensorMeta

ESTIMATOR_NAME = "calibrated"
OUTSIDE_RANGE = "analytical (outside calibrated range)"
NOT_CALIBRATED = "analytical (no calibration data for this op)"
TF32_NOT_CALIBRATED = "analytical (TF32 on; the table's fp32 GEMMs ran without it)"

INTERPOLATION_RADIUS = 1.0  # octaves (log2 units) around a query
NEIGHBOURS = 8
# A point measured this much slower than a point of the same key that is at least as large in
# every coordinate is a measurement event (the H100 table's M=4096 bf16 row reads 1.3-4x slow).
DOMINATED_SLOWER_BY = 1 / 0.9
# GEMMs with M and N swapped do the same work; cuBLAS runs such pairs within 12% of each other
# in the H100 table (median 1.6%) except in its M=4096 bf16 row (up to 4.6x): a point this much
# slower than its mirror is the measurement event, not the shape.
MIRROR_SLOWER_BY = 1.15
_MIRRORS = {"mm": (1, 0, 2)}  # key family -> the coordinate permutation that gives the same work
# A multi-call row (sdpa forward + backward) whose earlier calls explain all but this fraction
# of the time cannot time its last call.
MIN_REMAINDER_FRACTION = 0.2

# key: (op family, dtype or direction, ...) e.g. ("mm", "bfloat16"), ("copy", "h2d"),
# ("sdpa_bwd", "bfloat16", "causal"); coordinates: the shape sizes the family's time depends on.
Key = tuple[str, ...]

_BINARY_ARITHMETIC = frozenset({"add", "sub", "mul", "div", "add_", "sub_", "mul_", "div_"})
_CUDNN_ATTENTION = frozenset({
    "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_cudnn_attention_backward",
    "_cudnn_attention_forward", "_cudnn_attention_backward",
})


def _dense(*ts: object) -> bool:
    return all(isinstance(t, TensorMeta) and t.is_contiguous() for t in ts)


def _copy_direction(src: TensorMeta, dst: TensorMeta) -> str | None:
    if src.is_cuda and dst.is_cuda:
        return "d2d" if src.device == dst.device else None  # peer copies go over NVLink
    if dst.is_cuda and src.device == "cpu" and src.pinned:
        return "h2d"
    if src.is_cuda and dst.device == "cpu" and dst.pinned:
        return "d2h"
    return None  # pageable host memory: staged by the driver, not what the table measured


def table_key(sig: OpSignature) -> tuple[Key, tuple[int, ...]] | None:
    """(key, shape coordinates) of an op a calibration row can time, or None.

    Which ops share a row's key, and why they may:
      mm, addmm              ("mm", dtype), (M, N, K): the same cuBLAS GEMM; addmm's bias is
                             its epilogue, which the analytical part of the estimate adds
      add/sub/mul/div .Tensor, in place too, same-shape dense operands
                             ("add", dtype), (numel,): one vectorized binary kernel, memory-bound
      gelu                   ("gelu", dtype), (numel,)
      copy_ / clone, same dtype, dense
                             ("copy", "d2d" | "h2d" | "d2h"), (bytes,) (host side pinned)
      sum to one element     ("sum", dtype), (numel,)
      native_layer_norm      ("layer_norm", dtype), (rows, cols)
      _softmax on the last dim  ("softmax", dtype), (rows, cols)
      cuDNN attention, self-attention shapes
                             ("sdpa_fwd" | "sdpa_bwd", dtype, "causal" | "full"), (B*H, S, D)
    """
    if sig.cuda_device() is None:
        return None
    name, args = sig.short_name, sig.args
    outs = sig.tensors_out()
    try:
        if name == "mm" and sig.overload == "default" or name == "addmm" and sig.overload == "default":
            a, b = (args[0], args[1]) if name == "mm" else (args[1], args[2])
            if len(a.shape) != 2 or len(b.shape) != 2:
                return None
            return ("mm", a.dtype), (a.shape[0], b.shape[1], a.shape[1])
        if name in _BINARY_ARITHMETIC and sig.overload == "Tensor":
            x, y = args[0], args[1]
            if not outs or not _dense(x, y, outs[0]) or x.shape != y.shape or x.dtype != y.dtype:
                return None
            return ("add", x.dtype), (x.numel,)
        if name == "gelu" and sig.overload == "default":
            return (("gelu", args[0].dtype), (args[0].numel,)) if _dense(args[0]) else None
        if name in ("copy_", "clone"):
            dst, src = (args[0], args[1]) if name == "copy_" else (outs[0], args[0])
            if not _dense(src, dst) or src.dtype != dst.dtype or src.shape != dst.shape:
                return None
            direction = _copy_direction(src, dst)
            return (("copy", direction), (dst.nbytes,)) if direction else None
        if name == "sum" and outs and outs[0].numel == 1:
            x = args[0]
            return (("sum", x.dtype), (x.numel,)) if _dense(x) else None
        if name == "native_layer_norm":
            x, normalized = args[0], args[1]
            cols = math.prod(normalized)
            return (("layer_norm", x.dtype), (x.numel // cols, cols)) if _dense(x) and cols else None
        if name == "_softmax":
            x, dim = args[0], args[1]
            if not _dense(x) or not x.shape or dim not in (-1, len(x.shape) - 1):
                return None
            return ("softmax", x.dtype), (x.numel // x.shape[-1], x.shape[-1])
        if name in _CUDNN_ATTENTION:
            call = parse_attention(sig)
            s = call.shape
            if s.seq_q != s.seq_kv or s.head_dim != s.head_dim_v:
                return None
            kind = "sdpa_bwd" if call.backward else "sdpa_fwd"
            return (kind, call.dtype, "causal" if s.causal else "full"), (s.batch * s.heads, s.seq_q, s.head_dim)
    except (IndexError, AttributeError, TypeError, KeyError, ValueError, ZeroDivisionError):
        return None  # an overload whose arguments do not look like the measured op's
    return None


@dataclass(frozen=True, slots=True)
class TablePoint:
    """One measured shape of one key."""

    label: str  # the calibration row, e.g. "mm 4096x4096x4096 bf16"
    key: Key
    shape: tuple[int, ...]
    measured_ns: float  # the row's time as measured
    kernel_ns: float  # measured time minus the method's gap (minus earlier calls' time)
    residual: float  # log(kernel_ns / analytical estimate of the same signature)

    @property
    def log_shape(self) -> tuple[float, ...]:
        return tuple(math.log2(x) for x in self.shape)


@dataclass(frozen=True)
class CalibrationTable:
    """The usable points of one calibration file, by key, for one analytical model."""

    source: Path
    device_name: str
    points: dict[Key, tuple[TablePoint, ...]]
    gap_ns: dict[str, float]  # measuring method's gap per measurement family
    excluded: dict[str, str]  # row label -> why it is not a point
    tiny_launch_host_ns: float | None = None  # host time per 1-element add_ on the measured host

    def without(self, label: str) -> "CalibrationTable":
        """The same table minus one point (leave-one-out evaluation)."""
        points = {k: tuple(p for p in ps if p.label != label) for k, ps in self.points.items()}
        return dataclasses.replace(self, points={k: ps for k, ps in points.items() if ps})

    def point(self, label: str) -> TablePoint | None:
        return next((p for ps in self.points.values() for p in ps if p.label == label), None)


def _log_shape(shape: tuple[int, ...]) -> tuple[float, ...]:
    return tuple(math.log2(max(x, 1)) for x in shape)


def interpolate_residual(points: tuple[TablePoint, ...], shape: tuple[int, ...]) -> float | None:
    """Inverse-distance-weighted log residual at `shape`, or None outside the measured range."""
    if not points:
        return None
    q = _log_shape(shape)
    logs = [p.log_shape for p in points]
    for i, c in enumerate(q):
        if c < min(s[i] for s in logs) - 1e-9 or c > max(s[i] for s in logs) + 1e-9:
            return None
    near = sorted((math.dist(q, s), p.residual) for s, p in zip(logs, points))
    near = [(d, r) for d, r in near[:NEIGHBOURS] if d <= INTERPOLATION_RADIUS + 1e-9]
    if not near:
        return None
    if near[0][0] < 1e-9:
        return near[0][1]
    weights = [1.0 / (d * d) for d, _ in near]
    return sum(w * r for w, (_, r) in zip(weights, near)) / sum(weights)


def _analytical_ns(analytical: AnalyticalEstimator, sigs: tuple[OpSignature, ...]) -> float:
    return float(sum(analytical.estimate(s).duration_ns for s in sigs))


def method_gaps(measurements: list[Measurement], floor: list[bool],
                analytical: AnalyticalEstimator) -> dict[str, float]:
    """The measuring method's per-launch gap, by measurement family (see the module doc)."""
    by_family: dict[str, list[float]] = {}
    for m, at_floor in zip(measurements, floor):
        if at_floor and m.kind == "kernel":
            by_family.setdefault(m.family, []).append(m.measured_ns - _analytical_ns(analytical, m.signatures))
    everything = [g for gs in by_family.values() for g in gs]
    default = max(0.0, statistics.median(everything)) if everything else 0.0
    families = {m.family for m in measurements if m.kind == "kernel"}
    return {f: max(0.0, statistics.median(by_family[f])) if f in by_family else default for f in families}


def _dominated(p: TablePoint, others: list[TablePoint]) -> bool:
    return any(o is not p and o.shape != p.shape and all(a >= b for a, b in zip(o.shape, p.shape))
               and p.measured_ns > DOMINATED_SLOWER_BY * o.measured_ns for o in others)


def build_table(cal: CalibrationFile, analytical: AnalyticalEstimator) -> CalibrationTable:
    """Turn a checked calibration file into interpolation points against `analytical`."""
    ms = [m for m in cal.measurements if m.kind == "kernel"]
    floor = floor_dominated(ms, cal.floor_us)
    if cal.gap_us is None:
        gaps = method_gaps(ms, floor, analytical)
    else:
        gaps = {m.family: cal.gap_us * 1e3 for m in ms}
    excluded: dict[str, str] = {}
    candidates: dict[Key, list[TablePoint]] = {}
    multi: list[tuple[Measurement, Key, tuple[int, ...], float]] = []
    for m, at_floor in zip(ms, floor):
        if at_floor:
            excluded[m.label] = "at the measuring method's floor"
            continue
        keyed = table_key(m.signatures[-1])
        if keyed is None:
            excluded[m.label] = "no op phantora maps to this row"
            continue
        key, shape = keyed
        kernel_ns = max(m.measured_ns - gaps[m.family], 0.0)
        if len(m.signatures) > 1:
            multi.append((m, key, shape, kernel_ns))
            continue
        est = _analytical_ns(analytical, m.signatures)
        candidates.setdefault(key, []).append(
            TablePoint(m.label, key, shape, m.measured_ns, kernel_ns, math.log(kernel_ns / est)))
    single = _keep_consistent(candidates, excluded)
    # Rows timing several calls (sdpa forward + backward) time their last call: the whole minus
    # what the single-call points predict for the calls before it.
    derived: dict[Key, list[TablePoint]] = {}
    for m, key, shape, kernel_ns in multi:
        earlier = sum(_predict_ns(single, analytical, s) for s in m.signatures[:-1])
        last_ns = kernel_ns - earlier
        if last_ns < MIN_REMAINDER_FRACTION * kernel_ns:
            excluded[m.label] = "the calls before the last one take nearly all of it"
            continue
        est = _analytical_ns(analytical, m.signatures[-1:])
        derived.setdefault(key, []).append(
            TablePoint(m.label, key, shape, m.measured_ns, last_ns, math.log(last_ns / est)))
    points = {**single, **_keep_consistent(derived, excluded)}
    host = [m.measured_ns for m in cal.measurements if m.kind == "host"]
    return CalibrationTable(cal.path, cal.device_name, points, gaps, excluded, host[-1] if host else None)


def _slower_than_mirror(p: TablePoint, others: list[TablePoint]) -> bool:
    perm = _MIRRORS.get(p.key[0])
    if perm is None:
        return False
    mirror = tuple(p.shape[i] for i in perm)
    return mirror != p.shape and any(o.shape == mirror and p.measured_ns > MIRROR_SLOWER_BY * o.measured_ns
                                     for o in others)


def _keep_consistent(candidates: dict[Key, list[TablePoint]], excluded: dict[str, str]) -> dict[Key, tuple[TablePoint, ...]]:
    """Drop measurement events: points slower than a shape that does at least as much work."""
    out = {}
    for key, ps in candidates.items():
        kept = []
        for p in ps:
            if _dominated(p, ps):
                excluded[p.label] = ">10% slower than a measured shape at least as large in every size"
            elif _slower_than_mirror(p, ps):
                excluded[p.label] = ">15% slower than the same GEMM with M and N swapped"
            else:
                kept.append(p)
        if kept:
            out[key] = tuple(kept)
    return out


def _predict_ns(points: dict[Key, tuple[TablePoint, ...]], analytical: AnalyticalEstimator, sig: OpSignature) -> float:
    base = float(analytical.estimate(sig).duration_ns)
    keyed = table_key(sig)
    r = interpolate_residual(points.get(keyed[0], ()), keyed[1]) if keyed else None
    return base if r is None else base * math.exp(r)


class CalibratedEstimator:
    """Kernel times from a measured table where it covers the op, the analytical model elsewhere."""

    name = ESTIMATOR_NAME

    def __init__(self, table: CalibrationTable, analytical: AnalyticalEstimator) -> None:
        self.table = table
        self.analytical = analytical
        self.gpu: GPUSpec = analytical.gpu

    @property
    def host_scale(self) -> float:
        """Host costs times this: the table's host against the one the host model was measured
        on (a 1-element add_ is dispatch plus one launch there)."""
        measured = self.table.tiny_launch_host_ns
        if not measured:
            return 1.0
        return measured / (HOST_COSTS.dispatch_ns + HOST_COSTS.launch_ns)

    def estimate(self, sig: OpSignature) -> KernelEstimate:
        est = self._kernel_estimate(sig)
        scale = self.host_scale
        return est if scale == 1.0 else dataclasses.replace(est, host_ns=int(round(est.host_ns * scale)))

    def _kernel_estimate(self, sig: OpSignature) -> KernelEstimate:
        est = self.analytical.estimate(sig)
        if est.kind == NO_GPU_WORK or est.kernels == 0 or not est.known:
            return est  # nothing runs on the GPU, or an unknown op: the generic fallback says so
        keyed = table_key(sig)
        if keyed is None or keyed[0] not in self.table.points:
            return dataclasses.replace(est, estimator=NOT_CALIBRATED)
        key, shape = keyed
        if key[0] == "mm" and key[1] == "float32" and context_for(self.analytical.ctx, sig.tags).allow_tf32:
            return dataclasses.replace(est, estimator=TF32_NOT_CALIBRATED)
        r = interpolate_residual(self.table.points[key], shape)
        if r is None:
            return dataclasses.replace(est, estimator=OUTSIDE_RANGE)
        duration = max(est.duration_ns * math.exp(r), float(self.gpu.min_kernel_ns * est.kernels))
        return dataclasses.replace(est, duration_ns=int(round(duration)), estimator=self.name)

    def measured_equivalent_ns(self, m: Measurement) -> float:
        """What the calibration method would measure for row `m`: the estimate plus its gap."""
        return sum(self._kernel_estimate(s).duration_ns for s in m.signatures) + self.table.gap_ns.get(m.family, 0.0)
