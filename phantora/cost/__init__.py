"""Kernel-time estimation: how long the GPU work of one aten op takes on a simulated GPU.

Public surface:
    KernelEstimate      what an estimator returns for one op signature
    Estimator           the protocol every estimator implements
    make_estimator()    pick an estimator by name for a GPU
    choose_estimator()  the same, resolving `--kernel-times` and `--calibration` as
                        `phantora trace` does, with what to tell the user (EstimatorChoice)
    KernelTimesError    a choice that cannot be made (message for the user)

The shared vocabulary (KernelEstimate, the kinds of GPU work, Estimator, KernelTimesError) lives in
estimate.py, below every other module here; this package re-exports it.

Estimators: analytical.py (roofline model, no data), calibrated.py (a measured table,
interpolated; analytical outside it), measured.py (ops timed on a local device; the next
estimator for what it cannot run).

Where each op family is modelled (analytical estimator): analytical.py (the estimator),
families.py (op -> family table), roofline.py (shared pieces), gemm.py, conv.py,
attention.py, pointwise.py, normalization.py, reductions.py, indexing.py, movement.py,
losses.py, optimizers.py, copies.py, spectral.py, recurrent.py, host.py (host-side cost);
fitted.py (the per-family efficiency curves the models read, fitted by sweep_fit.py to the H100
kernel sweep in data/h100_sxm_sweep.jsonl, parameters in data/h100_sweep_fit.json).

The simulator calls `estimate` once per distinct op signature and caches the result, so an
estimator may be slow-ish (tens of microseconds) but must be deterministic.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from phantora.cost.estimate import (COMPUTE, COPY_D2D, COPY_D2H, COPY_H2D, NO_GPU_WORK, Estimator, KernelEstimate,
                                    KernelTimesError)
from phantora.hardware import GPUSpec

__all__ = ["COMPUTE", "COPY_D2D", "COPY_D2H", "COPY_H2D", "NO_GPU_WORK", "Estimator", "EstimatorChoice", "KERNEL_TIMES",
           "KernelEstimate", "KernelTimesError", "choose_estimator", "make_estimator", "shipped_table"]

KERNEL_TIMES = ("auto", "analytical", "calibrated", "measured")


@dataclass(frozen=True)
class EstimatorChoice:
    """The estimator a run uses and what to tell the user about it."""

    estimator: Estimator
    requested: str  # the --kernel-times value
    description: str  # one line: which estimator, from what data, why
    notes: tuple[str, ...] = ()  # things the user must know (times from another device, ...)
    calibration: Path | None = None  # the table the calibrated part uses, if any
    measured_on: str | None = None  # the local device the measured part runs on, if any

    def metadata(self) -> dict:
        """For the trace's metadata ("kernel_times")."""
        out: dict = {"requested": self.requested, "estimator": self.estimator.name,
                     "description": self.description}
        if self.calibration is not None:
            out["calibration"] = str(self.calibration)
        if self.measured_on is not None:
            out["measured_on"] = self.measured_on
        if self.notes:
            out["notes"] = list(self.notes)
        return out

    def after_run(self) -> list[str]:
        """Lines for the run summary once the run is over (what the measured mode did)."""
        stats = getattr(self.estimator, "stats", None)
        if not stats:
            return []
        done = ", ".join(f"{n} {what}" for what, n in stats.most_common(6))
        return [f"distinct ops: {done}"]


# Tables shipped with phantora, by GPUSpec.key (phantora/cost/data).
SHIPPED_TABLES = {"h100-sxm-80gb": "h100_sxm_kernels.jsonl"}


def shipped_table(gpu: GPUSpec) -> Path | None:
    name = SHIPPED_TABLES.get(gpu.key)
    return Path(__file__).with_name("data") / name if name else None


def choose_estimator(
    kind: str,
    gpu: GPUSpec,
    *,
    calibration: Path | str | None = None,
    allow_tf32: bool = False,
    cudnn_allow_tf32: bool = True,
    cuda_probe: Callable[[], str | None] | None = None,
    measure_device: str | None = None,
) -> EstimatorChoice:
    """Resolve `--kernel-times KIND [--calibration FILE]` for a simulated `gpu`.

    auto: measured when a CUDA GPU is visible to this process, else calibrated where a table
    exists for the simulated GPU (shipped: H100; or `calibration` when its device row names the
    simulated GPU), else analytical. calibrated: that table (`calibration` even when it was
    measured on another device: then a note says so); error when there is none. measured: on
    `measure_device` ($PHANTORA_MEASURE_DEVICE, else the first CUDA GPU); error without one; what
    it cannot run goes to the estimator auto would pick without a GPU.

    cuda_probe (tests): returns the visible CUDA GPU's name or None; default: measured.visible_cuda_device.
    Raises KernelTimesError (calibration file problems included: CalibrationFileError).
    """
    from phantora.cost.analytical import AnalyticalEstimator

    if kind not in KERNEL_TIMES:
        raise KernelTimesError(f"unknown kernel-time estimator {kind!r}; choose from: {', '.join(KERNEL_TIMES)}")
    analytical = AnalyticalEstimator(gpu, allow_tf32=allow_tf32, cudnn_allow_tf32=cudnn_allow_tf32)
    if kind == "analytical":
        if calibration is not None:
            raise KernelTimesError("--calibration is not used by --kernel-times analytical; "
                                   "drop it or use --kernel-times calibrated")
        return EstimatorChoice(analytical, kind, "analytical (roofline model with efficiency curves; requested)")
    table, notes = _table_for(gpu, Path(calibration) if calibration is not None else None, kind)
    calibrated = None
    if table is not None:
        from phantora.cost.calibrated import CalibratedEstimator, build_table

        calibrated = CalibratedEstimator(build_table(table, analytical), analytical)
    if kind == "calibrated" and calibrated is None:
        raise KernelTimesError(
            f"no calibration table for the simulated {gpu.key} ({gpu.device_name}); pass --calibration FILE "
            f"measured on one (`phantora calibrate -o FILE` on that GPU), or use --kernel-times analytical")
    from phantora.cost import measured as measured_mod

    probe = cuda_probe or measured_mod.visible_cuda_device
    cuda_name = probe()
    device = measure_device or measured_mod.measure_device_from_env()
    if device is not None and not re.fullmatch(r"cpu|cuda(:\d+)?", device):
        raise KernelTimesError(f"{measured_mod.MEASURE_DEVICE_ENV}={device!r}: use cpu, cuda or cuda:N")
    if kind == "measured" and cuda_name is None and (device is None or device.startswith("cuda")):
        raise KernelTimesError("--kernel-times measured needs a CUDA GPU visible to phantora's simulator process "
                               "and none is (torch.cuda.is_available() is False); use --kernel-times auto, "
                               "calibrated or analytical")
    fallback: Estimator = calibrated or analytical
    table_words = _table_words(calibrated)
    if kind == "measured" or (kind == "auto" and cuda_name is not None):
        device = device or "cuda"
        try:
            est = measured_mod.MeasuredEstimator(gpu, fallback, device)
        except ImportError:
            raise KernelTimesError("--kernel-times measured runs ops with torch in phantora's own Python "
                                   f"({sys.executable}), which cannot import it; install torch there") from None
        why = "requested" if kind == "measured" else "auto: a CUDA GPU is visible"
        if est.device_name != gpu.device_name:
            notes.append(f"kernel times measured on {est.device_name}, not the simulated {gpu.device_name}: "
                         "they come from a different device")
        desc = (f"measured on {est.device_name} ({why}; cache {est.cache.path}); "
                f"ops it cannot run: {table_words or 'analytical'}")
        return EstimatorChoice(est, kind, desc, tuple(notes), _source(calibrated), est.device_name)
    if calibrated is not None:
        why = "requested" if kind == "calibrated" else "auto: no CUDA GPU visible"
        scale = calibrated.host_scale
        if abs(scale - 1) > 0.02:
            from phantora.cost.host import HOST_COSTS

            notes.append(f"host costs of ops scaled x{scale:.2f}: the table's host launches a 1-element add_ in "
                         f"{calibrated.table.tiny_launch_host_ns / 1e3:.1f} us, the host model's in "
                         f"{(HOST_COSTS.dispatch_ns + HOST_COSTS.launch_ns) / 1e3:.1f} us")
        return EstimatorChoice(calibrated, kind, f"{table_words} ({why})", tuple(notes), _source(calibrated))
    desc = f"analytical (auto: no CUDA GPU visible and no calibration table for {gpu.key})"
    return EstimatorChoice(analytical, kind, desc, tuple(notes))


def _source(calibrated) -> Path | None:  # type: ignore[no-untyped-def]
    return calibrated.table.source if calibrated is not None else None


def _table_words(calibrated) -> str:  # type: ignore[no-untyped-def]
    if calibrated is None:
        return ""
    t = calibrated.table
    points = sum(len(ps) for ps in t.points.values())
    return (f"calibrated from {t.source.name} ({t.device_name}, {points} measured shapes); "
            "analytical outside its range")


def _table_for(gpu: GPUSpec, calibration: Path | None, kind: str):  # type: ignore[no-untyped-def]
    """(CalibrationFile or None, notes) for the simulated GPU."""
    from phantora.cost.measurements import read_calibration

    notes: list[str] = []
    if calibration is not None:
        cal = read_calibration(calibration)
        if cal.device_name == gpu.device_name or kind == "calibrated":
            if cal.device_name != gpu.device_name:
                notes.append(f"kernel times come from a table measured on {cal.device_name} ({calibration}), "
                             f"not on the simulated {gpu.device_name}")
            return cal, notes
        notes.append(f"--calibration {calibration} was measured on {cal.device_name}, not the simulated "
                     f"{gpu.device_name}: not used")
    shipped = shipped_table(gpu)
    return (read_calibration(shipped) if shipped is not None else None), notes


def make_estimator(kind: str, gpu: GPUSpec, *, allow_tf32: bool = False, cudnn_allow_tf32: bool = True) -> Estimator:
    """The estimator named `kind` (one of KERNEL_TIMES) for `gpu`; choose_estimator says more.

    allow_tf32 / cudnn_allow_tf32 mirror torch.backends.cuda.matmul.allow_tf32 (default off)
    and torch.backends.cudnn.allow_tf32 (default on): whether fp32 matmuls / convolutions may
    run on tensor cores as TF32.
    """
    return choose_estimator(kind, gpu, allow_tf32=allow_tf32, cudnn_allow_tf32=cudnn_allow_tf32).estimator
