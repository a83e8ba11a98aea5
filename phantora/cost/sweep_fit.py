"""Per-family efficiency curves fitted to the H100 kernel sweep, and the fit that makes them.

    python -m phantora.cost.sweep_fit            # refit: rewrites data/h100_sweep_fit.json
    python -m phantora.cost.sweep_fit --check    # refit and say whether the shipped file matches

The sweep (data/h100_sxm_sweep.jsonl, from shared/calibration/kernel_sweep.py) lists every kernel
each of 132 op cases launched on an H100 SXM with its time. This module sorts those kernels into
classes (one kernel of one family: BatchNorm's NCHW statistics kernel, cuDNN's nchwToNhwc layout
conversion, a depthwise forward, ...), gives each class a small parametric curve of its size, and
fits the curve's 1-3 parameters by least squares on log(time) over the sweep's kernels of that class.
The curves are not lookups: a handful of parameters per class, each a fraction of one of the GPU's
peaks, and they are used for every shape, not only the swept ones.

Curves (ns; `bytes` counts what the kernel reads plus writes, `C` the channels):

    stream    t = ramp + bytes / (B * e)
    stream_l2 t = ramp + bytes * (1 - h * exp(-bytes / L2)) / (B * e)
    channel   t = ramp + bytes * (1 / (B * e) + 1 / (C * b * S))    + C * c / SMs
    fixed     t = fixed + bytes / (B * e)

where B = GPUSpec.achieved_memory_bandwidth (large streaming kernels; H100 3.0 TB/s), L2 the
GPU's L2 size (a working set inside it is partly served from L2: the elementwise curve), S =
sm_stream_bandwidth / sm_count (what one SM streams), SMs = sm_count. `e` is a fraction of the
GPU's streaming bandwidth; `b`, of one SM's streaming rate, is what one channel's block reaches in
kernels that give each channel one block (torch's NCHW BatchNorm: its time falls as 1/C until DRAM
is the limit); `c` the fixed time of one channel's block. `fixed` is for ops made of several
small kernels and host-sized work (MoE routing: sort, bincount, nonzero): their time is mostly
launch and single-block phases.

How the curves transfer to other GPUs (H200, B200: phantora/hardware.py): `e` scales with the
GPU's achieved HBM bandwidth, `b` with its per-SM streaming rate (SM clock x bytes per clock),
`c` is per channel spread over the GPU's SMs; ramps and fixed costs stay in ns. Where a class's
fitted `e` is under fitted.SM_BOUND_BELOW, fitted.streaming_rate treats it as SM-bound, so more HBM
bandwidth does not speed it up (H200's 4.8 TB/s leaves a 0.07-efficiency depthwise kernel as slow
as on the H100; B200 speeds it up by its SMs x clock only, 148 / 132).

The fitted parameters live in data/h100_sweep_fit.json (this module writes it; fitted.py reads
it for the models). Leave-one-out figures: benchmarks/bench_sweep_fit.py --loo.
"""

from __future__ import annotations

import json
import math
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

DATA = Path(__file__).with_name("data")
SWEEP = DATA / "h100_sxm_sweep.jsonl"
# The same script's cases measured on a lent H200 (2026-11-29, torch 2.11): nothing is fitted to it;
# it checks how the H100's curves carry over (benchmarks/bench_sweep_fit.py --gpu h200).
H200_SWEEP = DATA / "h200_sxm_sweep.jsonl"
FIT_FILE = DATA / "h100_sweep_fit.json"
# The GPU the sweep ran on (phantora.hardware's key); its peaks turn times into fractions.
SWEEP_GPU = "h100-sxm-80gb"

from phantora.cost.fitted import FORMS, curve_ns  # noqa: E402  (the curves; this module fits them)


@dataclass(frozen=True)
class Obs:
    """One kernel of one sweep case: its class, its size, its measured time."""

    cls: str
    case: int  # line index in the sweep
    nbytes: float  # bytes read + written (for "simt": FLOPs)
    channels: int
    us: float


# --- kernel classes ------------------------------------------------------------------------

def _n(r: dict) -> int:
    return r["N"] * r["C"] * r["H"] * r["H"]


def _conv_out(r: dict) -> int:
    k, s = r["K"], r["stride"]
    p = k // 2 if k < 16 else 0
    ho = (r["H"] + 2 * p - k) // s + 1
    return r["N"] * r["Cout"] * ho * ho


_BF = {"bf16": 2, "fp16": 2, "fp32": 4}


def _rc(r: dict) -> tuple[int, int]:
    return r["rows"] * r["cols"], _BF[r["dtype"]]


def _dw_flops(r: dict, elements: int) -> float:
    return 2.0 * r["K"] * r["K"] * elements


# (class, form, fitted parameters, case ops, kernel-name pattern, size(row)): the size as the family
# model counts it (bytes read + written; FLOPs for "simt"). "." as pattern: the op's whole time.
# Conv layout conversions: per fwd+bwd step cuDNN converts x (forward), x and dy (backward) to NHWC
# and y (forward) and dx (backward) back, reading and writing each once.
CLASSES: list[tuple[str, str, tuple[str, ...], str, str, Callable[[dict], float] | None]] = [
    # BatchNorm, torch's native kernels (bf16 input, fp32 weights: what autocast gives)
    ("bn_nchw_stats", "channel", ("e", "b", "c_ns"), "batch_norm_fwd_bwd",
     r"batch_norm_collect_statistics_kernel", lambda r: 2 * _n(r)),
    ("bn_nchw_transform", "channel", ("e", "c_ns"), "batch_norm_fwd_bwd",
     r"batch_norm_transform_input_kernel", lambda r: 4 * _n(r)),
    ("bn_nchw_backward", "channel", ("e", "b", "c_ns"), "batch_norm_fwd_bwd",
     r"batch_norm_backward_kernel", lambda r: 6 * _n(r)),
    ("bn_nhwc_stats", "channel", ("e", "b"), "batch_norm_fwd_bwd",
     r"collect_statistics_channels_last", lambda r: 2 * _n(r)),
    ("bn_nhwc_transform", "channel", ("e", "b"), "batch_norm_fwd_bwd",
     r"transform_input_channels_last", lambda r: 4 * _n(r)),
    ("bn_nhwc_bwd_reduce", "channel", ("e", "b"), "batch_norm_fwd_bwd",
     r"backward_reduce_channels_last", lambda r: 4 * _n(r)),
    ("bn_nhwc_bwd_elemt", "channel", ("e", "b"), "batch_norm_fwd_bwd",
     r"backward_elemt_channels_last", lambda r: 6 * _n(r)),
    # depthwise convolutions: torch's NCHW kernels (SIMT stencils, FLOP-bound at a low rate),
    # cuDNN's NHWC ones (bandwidth-bound)
    ("dw_nchw_fwd", "simt", ("e",), "conv2d_fwd_bwd", r"conv_depthwise2d_forward_kernel",
     lambda r: _dw_flops(r, _conv_out(r))),
    ("dw_nchw_dgrad", "simt", ("e",), "conv2d_fwd_bwd", r"conv_depthwise2d_backward_kernel",
     lambda r: _dw_flops(r, _n(r))),
    ("dw_nchw_wgrad", "simt", ("e", "c_ns"), "conv2d_fwd_bwd", r"conv_depthwise2d_grad_weight_kernel",
     lambda r: _dw_flops(r, _conv_out(r))),
    ("dw_nhwc_fwd", "stream", ("ramp_ns", "e"), "conv2d_fwd_bwd", r"^conv2d_c1_k1_nhwc",
     lambda r: 2 * (_n(r) + _conv_out(r))),
    ("dw_nhwc_dgrad", "stream", ("ramp_ns", "e"), "conv2d_fwd_bwd", r"^dgrad2d_c1_k1_nhwc",
     lambda r: 2 * (_n(r) + _conv_out(r))),
    ("dw_nhwc_wgrad", "stream", ("ramp_ns", "e"), "conv2d_fwd_bwd", r"^wgrad2d_c1_k1_nhwc",
     lambda r: 2 * (_n(r) + _conv_out(r))),
    # cuDNN's layout conversions around NCHW tensor-core convolutions
    ("nchw_to_nhwc", "stream", ("e",), "conv2d_fwd_bwd", r"nchwToNhwcKernel",
     lambda r: 2 * 2 * (2 * _n(r) + _conv_out(r))),
    ("nhwc_to_nchw", "stream", ("e",), "conv2d_fwd_bwd", r"nhwcToNchwKernel",
     lambda r: 2 * 2 * (_n(r) + _conv_out(r))),
    # elementwise (the generic streaming curve; bf16 and fp32)
    ("elementwise", "stream_l2", ("e", "h"), "relu6_fwd_bwd gelu_fwd_bwd silu_fwd_bwd dropout_fwd_bwd",
     r"FillFunctor<(c10::BFloat16|float)>|CUDAFunctor_add<(c10::BFloat16|float)>|hardtanh_backward|"
     r"launch_clamp_scalar|silu_kernel|silu_backward_kernel|masked_scale_kernel", None),
    # GELU on 16-bit tensors (~0.9 of a plain elementwise kernel's rate; fp32 GELU streams like
    # any elementwise kernel); ramp and L2 term: elementwise's
    ("gelu", "stream_l2", ("e",), "gelu_fwd_bwd:bf16", r"GeluCUDAKernelImpl|GeluBackwardCUDAKernelImpl", None),
    # embedding backward (fp32, 8192 ids): the per-segment kernels scale with the gradient's bytes;
    # the small cub/segment kernels around the sort are a fixed pipeline
    ("embedding_segments", "stream", ("ramp_ns", "e"), "embedding_fwd_bwd", r"compute_grad_weight|sum_and_scatter",
     lambda r: 4 * r["tokens"] * r["dim"]),
    ("embedding_pipeline", "fixed", ("fixed_ns", "e"), "embedding_fwd_bwd",
     r"UniqueByKey|DeviceScan|DeviceCompactInit|krn_partial|compute_num_of_partial|arange_cuda_out",
     lambda r: 8 * r["tokens"]),
    # MoE routing and scatter ops
    ("topk", "fixed", ("fixed_ns", "e"), "topk", r"gatherTopK|bitonicSort", lambda r: 4 * r["tokens"] * r["experts"]),
    ("sort", "fixed", ("fixed_ns", "e"), "argsort", r".", lambda r: 8 * r["n"]),
    ("bincount", "fixed", ("fixed_ns", "e"), "bincount", r".", lambda r: 8 * r["n"]),
    ("histc", "fixed", ("fixed_ns", "e"), "histc", r"kernelHistogram1D|FillFunctor", lambda r: 4 * r["n"]),
    ("nonzero", "fixed", ("fixed_ns", "e"), "nonzero_sync", r".", lambda r: r["n"]),
    ("index_add", "stream", ("e",), "index_add", r"indexFuncLargeIndex", lambda r: 2 * 3 * r["rows"] * r["dim"]),
    ("scatter_add", "stream", ("e",), "scatter_add", r"_scatter_gather_elementwise_kernel",
     lambda r: 2 * 3 * r["rows"] * r["dim"]),
    # torch's generic (non-vectorized) elementwise_kernel<128, ...>, taken when an operand is
    # broadcast or not dense: every operand is loaded element by element through the offset
    # calculator, so its time follows the operand bytes at the output's size (a broadcast
    # operand counted as if expanded), an SM-side cost ("sm" form). Sweep: the unfused RMSNorm
    # of bf16 input with fp32 weight (torch's composite, as phantora's signatures of the case
    # show): 4 launches of x * rstd / x * weight and their gradients (3 fp32 operands of the
    # full size each), 1 of mean's backward, grad.expand(...) / cols (2).
    ("elementwise_strided", "sm", ("e",), "rms_norm_fwd_bwd:bf16",
     r"elementwise_kernel<128, 2, at::native::gpu_kernel_impl_nocast<at::native::BinaryFunctor<float",
     lambda r: (3 * 4 * r["rows"] * r["cols"], 4)),
    ("elementwise_strided", "sm", ("e",), "rms_norm_fwd_bwd:bf16",
     r"elementwise_kernel<128, 2, at::native::gpu_kernel_impl_nocast<at::native::BUnaryFunctor<float",
     lambda r: (2 * 4 * r["rows"] * r["cols"], 1)),
    # torch's dynamic-casting unrolled_elementwise_kernel: operands of different dtypes (a cast
    # other than fp32 -> bf16/fp16, which torch vectorizes; a mixed-dtype binary op), 2-byte
    # scalar loads: well under the streaming rate. Sweep: the RMSNorm cases' two bf16 -> fp32
    # casts (x.float() and the gradient of .type_as), 6 bytes per element each.
    ("unrolled_cast", "stream", ("e",), "rms_norm_fwd_bwd:bf16", r"unrolled_elementwise_kernel<at::native::direct_copy",
     lambda r: (6 * r["rows"] * r["cols"], 2)),
    # cuDNN's attention backward preprocessing, rowsum(dO * O) per query row (bf16 dO and O read,
    # an fp32 value written per row): about half the streaming rate in all three SDPA cases
    ("cudnn_dot_do_o", "stream", ("e",), "sdpa_fwd_bwd", r"compute_dot_do_o",
     lambda r: r["B"] * r["H"] * r["S"] * (2 * 2 * r["D"] + 4)),
]
FORM_OF = {c: f for c, f, *_ in CLASSES}  # a class may have several entries (kernel patterns)
# Classes that take the parameters they do not fit from another class's fit.
SHARED = {"gelu": "elementwise"}
FREE = {c: free for c, _, free, *_ in CLASSES}


def _elementwise_bytes(r: dict, name: str) -> float:
    n, b = (_n(r), 2) if "N" in r else _rc(r)
    if "FillFunctor" in name:
        return n * b
    if "masked_scale" in name:
        return n * (2 * b + 1)
    if "CUDAFunctor_add" in name or "backward" in name.lower():
        return 3 * n * b
    return 2 * n * b


def observations(rows: list[dict]) -> list[Obs]:
    """Every sweep kernel that belongs to a class, with its size."""
    out = []
    for i, r in enumerate(rows):
        if "kernels" not in r:  # a device row, or a case that failed ("error")
            continue
        for cls, form, _, ops, pattern, nbytes in CLASSES:
            # "op:dtype" restricts a class to one dtype's cases
            if not any(r["op"] == o.split(":")[0] and (":" not in o or r.get("dtype") == o.split(":")[1])
                       for o in ops.split()):
                continue
            ch = r.get("C", 1)
            if pattern == ".":  # the whole op: all its kernels
                out.append(Obs(cls, i, float(nbytes(r)), ch, r["total_us"]))
                continue
            us = sum(k["us"] for k in r["kernels"] if re.search(pattern, k["name"]))
            size = nbytes(r) if nbytes is not None else None
            if isinstance(size, tuple):  # (bytes of one launch, launches the case makes)
                if us > 0:
                    out.append(Obs(cls, i, float(size[0]), ch, us / size[1]))
                continue
            if nbytes is None:  # elementwise kernels: each its own observation
                for k in r["kernels"]:
                    if re.search(pattern, k["name"]):
                        out.append(Obs(cls, i, float(_elementwise_bytes(r, k["name"])), ch, k["us"]))
            elif us > 0:
                out.append(Obs(cls, i, float(size), ch, us))
    return out


def load_rows(path: Path = SWEEP) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


# --- fitting -------------------------------------------------------------------------------

_START = {"ramp_ns": 2000.0, "e": 0.5, "b": 0.2, "c_ns": 1000.0, "fixed_ns": 5000.0, "h": 0.5}


def _nelder_mead(f: Callable[[list[float]], float], x0: list[float], iters: int = 3000) -> list[float]:
    """Minimise f from x0 (plain Nelder-Mead; the problems here have 2-4 parameters)."""
    n = len(x0)
    pts = [list(x0)] + [[x + (0.5 if j == i else 0.0) for j, x in enumerate(x0)] for i in range(n)]
    vals = [f(p) for p in pts]
    for _ in range(iters):
        order = sorted(range(n + 1), key=lambda i: vals[i])
        pts, vals = [pts[i] for i in order], [vals[i] for i in order]
        if abs(vals[-1] - vals[0]) < 1e-12:
            break
        cen = [sum(p[j] for p in pts[:-1]) / n for j in range(n)]
        refl = [cen[j] + (cen[j] - pts[-1][j]) for j in range(n)]
        fr = f(refl)
        if fr < vals[0]:
            exp = [cen[j] + 2 * (cen[j] - pts[-1][j]) for j in range(n)]
            fe = f(exp)
            pts[-1], vals[-1] = (exp, fe) if fe < fr else (refl, fr)
        elif fr < vals[-2]:
            pts[-1], vals[-1] = refl, fr
        else:
            con = [cen[j] + 0.5 * (pts[-1][j] - cen[j]) for j in range(n)]
            fc = f(con)
            if fc < vals[-1]:
                pts[-1], vals[-1] = con, fc
            else:
                for i in range(1, n + 1):
                    pts[i] = [pts[0][j] + 0.5 * (pts[i][j] - pts[0][j]) for j in range(n)]
                    vals[i] = f(pts[i])
    return pts[min(range(n + 1), key=lambda i: vals[i])]


def fit_class(cls: str, obs: Iterable[Obs], gpu, base: dict | None = None) -> dict:
    """Least squares on log(time) of one class's kernels; parameters kept positive (log space).
    Parameters the class does not fit come from `base` (its SHARED class's fit), if any."""
    form = FORM_OF[cls]
    names = FREE[cls]
    fixed = {k: v for k, v in (base or {}).items() if k in FORMS[form] and k not in names}
    data = [o for o in obs if o.cls == cls]
    if not data:
        raise ValueError(f"no sweep kernels for class {cls}")

    def loss(x: list[float]) -> float:
        p = {**fixed, **{k: math.exp(min(max(v, -25.0), 25.0)) for k, v in zip(names, x)}}
        return sum((math.log(curve_ns(form, p, o.nbytes, o.channels, gpu)) - math.log(o.us * 1e3)) ** 2
                   for o in data)

    best = None
    for scale in (1.0, 0.1, 10.0):  # a few starts: the fits are small and cheap
        x = _nelder_mead(loss, [math.log(_START[k] * scale) for k in names])
        x = _nelder_mead(loss, x)
        if best is None or loss(x) < loss(best):
            best = x
    p = {**fixed, **{k: float(f"{math.exp(min(max(v, -25.0), 25.0)):.4g}") for k, v in zip(names, best)}}
    res = [curve_ns(form, p, o.nbytes, o.channels, gpu) / (o.us * 1e3) - 1 for o in data]
    return {"form": form, **p, "kernels": len(data), "max_abs_err": round(max(abs(e) for e in res), 3)}


def fit_all(rows: list[dict], exclude_case: int | None = None, only: Iterable[str] | None = None) -> dict:
    from phantora.hardware import lookup_gpu

    gpu = lookup_gpu(SWEEP_GPU)
    obs = [o for o in observations(rows) if o.case != exclude_case]
    classes = list(only) if only is not None else list(dict.fromkeys(c for c, *_ in CLASSES))
    out: dict[str, dict] = {}
    for c in dict.fromkeys(c for c, *_ in CLASSES if c in classes or c in {SHARED.get(x) for x in classes}):
        if any(o.cls == c for o in obs):
            out[c] = fit_class(c, obs, gpu, out.get(SHARED.get(c, "")))
    return {c: p for c, p in out.items() if c in classes}


def classes_of_case(rows: list[dict], case: int) -> set[str]:
    return {o.cls for o in observations(rows) if o.case == case}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    rows = load_rows()
    fit = {"source": f"{SWEEP.name} (H100 SXM, torch 2.11.0+cu130); written by python -m phantora.cost.sweep_fit",
           "gpu": SWEEP_GPU, "classes": fit_all(rows)}
    text = json.dumps(fit, indent=1) + "\n"
    if "--check" in argv:
        same = FIT_FILE.exists() and FIT_FILE.read_text() == text
        print("up to date" if same else f"{FIT_FILE.name} differs from a refit")
        return 0 if same else 1
    FIT_FILE.write_text(text)
    for c, p in fit["classes"].items():
        print(f"{c:20s} {p}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
