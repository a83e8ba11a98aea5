"""Fit the counted host's costs (phantora/cost/host.py PythonWork) to host_probe's real phases.

    python benchmarks/host/fit_python_work.py [--runs DIR]

Three runs give what the fit needs (each cached in DIR, default /tmp/phantora-fit-python-work):
  1. benchmarks/groundtruth/host_probe.py under phantora (--host lent-h100, no start-up costs) with
     every PythonWork cost set to 0 (PHANTORA_PYTHON_WORK): each phase's host time without the
     program's Python and autograd, i.e. dispatch, launches and syncs as modelled;
  2. benchmarks/host/count_probe.py under phantora: instructions and calls counted per phase;
  3. the real phases and op counts of tests/data/groundtruth/host_probe.json (lent H100 VM).
Then real - (1) = instructions x a + calls x b + ops recording autograd x c + backward ops x d
+ backward views x e, non-negative least squares over every phase, with each workload's error when
the fit leaves it out (a workload's phases are not independent of each other).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
PHASES = ("fwd_nograd", "fwd", "fwd_bwd", "step")
PARAMS = ("instruction_ps", "call_site_ps", "call_ps", "forward_op_ns", "records_grad_ns", "backward_op_ns", "backward_view_ns",
          "checkpoint_region_ns")
SCALE = (1e-3, 1e-3, 1e-3, 1.0, 1.0, 1.0, 1.0, 1.0)  # feature units -> ns per parameter unit
CKPT_REGIONS = {"gpt_L6_ckpt": 6}  # blocks host_probe.py wraps in torch.utils.checkpoint


def _trace(args: list[str], env: dict[str, str] | None = None) -> str:
    cmd = [sys.executable, "-m", "phantora.cli", "trace", "--quiet", "--host", "lent-h100", "--no-startup-costs",
           "-o", os.devnull + ".json", "--", sys.executable, *args]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env={**os.environ, **(env or {})},
                          timeout=3600)
    return proc.stdout


def base_phases(runs: Path) -> dict[str, dict[str, float]]:
    path = runs / "base.json"
    if not path.exists():
        zero = ",".join(f"{p}=0" for p in PARAMS)
        out = _trace(["benchmarks/groundtruth/host_probe.py", str(runs / "probe_out")], {"PHANTORA_PYTHON_WORK": zero})
        got = {m.group(1): json.loads(m.group(2)) for m in re.finditer(r"^(\S+): [\d.]+s\s+(\{.*\})$", out, re.M)}
        path.write_text(json.dumps(got))
    return json.loads(path.read_text())


def counted_phases(runs: Path) -> dict[str, dict[str, list[int]]]:
    path = runs / "counts.json"
    if not path.exists():
        out = _trace(["benchmarks/host/count_probe.py", "--device", "cuda"])
        line = next(x for x in out.splitlines() if x.startswith("COUNTS "))
        path.write_text(line[len("COUNTS "):])
    return json.loads(path.read_text())


def features(counts: dict, phase: str, workload_counts: dict, regions: int) -> list[float]:
    """instructions that call nothing, call sites, Python calls, forward ops, forward ops recording autograd, backward ops, backward views,
    checkpoint regions entered (forward, and again when backward recomputes them)."""
    fwd, both = workload_counts["fwd"], workload_counts["fwd_bwd"]
    bwd_views = both["views"] - fwd["views"]
    bwd_ops = both["backward_ops"] - bwd_views
    own = workload_counts["fwd_nograd" if phase == "fwd_nograd" else "fwd"]
    forward = own["ops"] - own["views"] if phase != "step" else 0
    records = fwd["ops"] - fwd["views"] if phase in ("fwd", "fwd_bwd") else 0
    backward = (bwd_ops, bwd_views) if phase == "fwd_bwd" else (0, 0)
    instructions, calls, _, sites = counts[phase]
    entered = {"fwd_nograd": regions, "fwd": regions, "fwd_bwd": 2 * regions}.get(phase, 0)
    return [instructions - sites, sites, calls, forward, records, *backward, entered]


BENCH_AFTER_TORCH_MS = 161.769


def bench_counts() -> tuple[int, int, int]:
    """(instructions, calls, call sites) of host_bench.python_bench_ms, counted here."""
    sys.path.insert(0, str(ROOT))
    from interpose.host import python_work
    from phantora.cost.host_bench import python_bench_ms

    counter = python_work.load()
    counter.exclude(())  # the benchmark lives in phantora's own files, which never count otherwise
    counter.resume()
    before = counter.counts()
    python_bench_ms()
    after = counter.counts()
    counter.pause()
    return after[0] - before[0], after[1] - before[1], after[2] - before[2]


def nnls(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Least squares with x >= 0, by trying every set of free parameters (there are eight)."""
    best, best_err = np.zeros(a.shape[1]), float(np.sum(b * b))
    for k in range(1, a.shape[1] + 1):
        for free in itertools.combinations(range(a.shape[1]), k):
            x_free, *_ = np.linalg.lstsq(a[:, free], b, rcond=None)
            if np.any(x_free < 0):
                continue
            x = np.zeros(a.shape[1])
            x[list(free)] = x_free
            err = float(np.sum((a @ x - b) ** 2))
            if err < best_err:
                best, best_err = x, err
    return best


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=Path, default=Path("/tmp/phantora-fit-python-work"))
    ap.add_argument("--real", type=Path, default=ROOT / "tests/data/groundtruth/host_probe.json",
                    help="host_probe.json of the host to fit (default: the lent H100 VM's; the lent H200 VM's is "
                         "tests/data/groundtruth/h200_vm/host_probe.json)")
    ap.add_argument("--bench-ms", type=float, default=BENCH_AFTER_TORCH_MS,
                    help="that host's python_bench_after_torch (startup.jsonl; the H200 VM's: 85.697)")
    args = ap.parse_args()
    args.runs.mkdir(parents=True, exist_ok=True)
    real = {w["name"]: w for w in json.loads(args.real.read_text())["data"]}
    base, counts = base_phases(args.runs), counted_phases(args.runs)
    rows, names = [], []
    for name, w in real.items():
        for phase in PHASES:
            rows.append((features(counts[name], phase, w["counts"], CKPT_REGIONS.get(name, 0)), w["us"][phase] * 1e3 - base[name][phase] * 1e3,
                         w["us"][phase] * 1e3, base[name][phase] * 1e3))
            names.append((name, phase))
    # The fixed pure-Python benchmark (phantora/cost/host_bench.py: dict, str and int work, one call
    # site in ten instructions) on the same host, in a process after CUDA's initialisation as the
    # probe's phases ran (tests/data/groundtruth/h100_startup.jsonl python_bench_after_torch): the
    # one row whose instructions are not framework code, which sets plain instructions apart from
    # call sites.
    bench = bench_counts()
    rows.append(([bench[0] - bench[2], bench[2], bench[1], 0, 0, 0, 0, 0], args.bench_ms * 1e6,
                 args.bench_ms * 1e6, 0.0))
    names.append(("python_bench", "whole"))
    a = np.array([[f * s for f, s in zip(r[0], SCALE)] for r in rows])
    b = np.array([r[1] for r in rows])
    # relative errors matter: weigh each phase by 1 / its real time
    wts = 1 / np.array([r[2] for r in rows])
    x = nnls(a * wts[:, None], b * wts)
    print("fitted:", ", ".join(f"{p}={v:.0f}" for p, v in zip(PARAMS, x)))
    pred = a @ x + np.array([r[3] for r in rows])
    print(f"{'workload':20s} {'phase':10s} {'real us':>9s} {'fit':>9s} {'err':>7s} {'held out':>9s} {'err':>7s}")
    errs, held = [], []
    for wl in [*real, "python_bench"]:
        keep = np.array([n[0] != wl for n in names])
        xo = nnls((a * wts[:, None])[keep], (b * wts)[keep])
        for i, (n, r) in enumerate(zip(names, rows)):
            if n[0] != wl:
                continue
            p_out = a[i] @ xo + r[3]
            errs.append(pred[i] / r[2] - 1)
            held.append(p_out / r[2] - 1)
            print(f"{n[0]:20s} {n[1]:10s} {r[2] / 1e3:9.1f} {pred[i] / 1e3:9.1f} {errs[-1]:+7.1%} {p_out / 1e3:9.1f} "
                  f"{held[-1]:+7.1%}")
    print(f"mean |error|: fitted {np.mean(np.abs(errs)):.1%}, workload held out {np.mean(np.abs(held)):.1%}")


if __name__ == "__main__":
    main()
