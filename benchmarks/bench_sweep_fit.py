"""phantora's kernel-time models against the H100 kernel sweep, case by case and per family.

    python benchmarks/bench_sweep_fit.py [--estimator auto|analytical] [--cases] [--kernels] [--loo]
    python benchmarks/bench_sweep_fit.py --gpu h200 [--ratio] [--cases]

With --gpu h200 the model's H200 times (from the H100 fits and hardware.py's peaks: nothing is
fitted to the H200) are set against phantora/cost/data/h200_sxm_sweep.jsonl, measured on a lent
H200 with the same script and torch; --ratio adds, per family, the measured H200/H100 ratio of
each case beside the model's (the cases both sweeps have).

The sweep (phantora/cost/data/h100_sxm_sweep.jsonl; shared/calibration/kernel_sweep.py made it)
profiled 132 op cases on an H100 SXM with torch.profiler: every kernel of each case with its
mean time, and `total_us`, their sum. For each case this rebuilds the op signatures phantora sees
when the sweep's own code runs on the virtual GPU (tests/cost/sweep_cases.py: the op, the
ones_like gradient, the accumulation into .grad left by the warm-ups) and compares the sum of
the estimator's kernel times with `total_us` (kernel time only: no launch gaps on either side).

Prints, per family: cases, median and max |error|, median signed error (negative: predicted
faster than measured). --cases adds one line per case; --kernels adds phantora's kernel list
beside the measured one. With --loo, also the leave-one-out figures of the fitted curves
(phantora/cost/sweep_fit.py): each case predicted from a fit without that case.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import warnings
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from phantora.cost import choose_estimator  # noqa: E402
from phantora.cost.analytical import AnalyticalEstimator  # noqa: E402
from phantora.cost.sweep_fit import H200_SWEEP, SWEEP  # noqa: E402
from phantora.hardware import lookup_gpu  # noqa: E402
from tests.cost.sweep_cases import family, label, load_sweep, loo_errors, predict_ns, signatures  # noqa: E402

# The measured sweep of each GPU phantora has one for (same cases and script as the H100's).
SWEEPS = {"h100": SWEEP, "h200": H200_SWEEP}


def estimator(kind: str, gpu):
    """The estimator `phantora trace` would use on `gpu` without a GPU (auto), or the models alone."""
    if kind == "analytical":
        return AnalyticalEstimator(gpu)
    return choose_estimator("auto", gpu, cuda_probe=lambda: None).estimator


def case_key(r: dict) -> str:
    return label(r)


def ratio_table(kind: str, rows_200: list[dict], sigs_200: list) -> dict[str, list[tuple[float, float]]]:
    """Per family, (measured, modelled) H200/H100 ratio of each case both sweeps hold."""
    h100 = {case_key(r): r for r in load_sweep(SWEEPS["h100"])}
    e100, e200 = estimator(kind, lookup_gpu("h100")), estimator(kind, lookup_gpu("h200"))
    by = defaultdict(list)
    for r, sigs in zip(rows_200, sigs_200):
        r100 = h100.get(case_key(r))
        if r100 is None:
            continue
        by[family(r)].append((r["total_us"] / r100["total_us"], predict_ns(e200, sigs) / predict_ns(e100, sigs)))
    return dict(sorted(by.items()))


def print_ratios(kind: str, rows_200: list[dict], sigs_200: list) -> None:
    print("\nH200/H100 time ratio per family (median over cases; measured: the two sweeps; modelled: phantora)")
    print(f"  {'family':28s} {'n':>3s} {'measured':>9s} {'min..max':>13s} {'modelled':>9s} {'min..max':>13s}")
    for f, pairs in ratio_table(kind, rows_200, sigs_200).items():
        ms, ps = [m for m, _ in pairs], [p for _, p in pairs]
        print(f"  {f:28s} {len(pairs):3d} {statistics.median(ms):9.3f} {min(ms):6.3f}..{max(ms):5.3f}"
              f" {statistics.median(ps):9.3f} {min(ps):6.3f}..{max(ps):5.3f}")


def errors(est, rows, sigs_by_case):
    """[(row, predicted_us, error)] with error = predicted / measured - 1."""
    out = []
    for r, sigs in zip(rows, sigs_by_case):
        p = predict_ns(est, sigs) / 1e3
        out.append((r, p, p / r["total_us"] - 1))
    return out


def family_table(results) -> dict[str, tuple[int, float, float, float]]:
    by = defaultdict(list)
    for r, _, e in results:
        by[family(r)].append(e)
    return {f: (len(es), statistics.median(abs(e) for e in es), max(abs(e) for e in es), statistics.median(es))
            for f, es in sorted(by.items())}


def print_table(title, table, overall):
    print(f"\n{title}")
    print(f"  {'family':28s} {'n':>3s} {'median|err|':>11s} {'max|err|':>9s} {'median err':>10s}")
    for f, (n, med, mx, signed) in table.items():
        print(f"  {f:28s} {n:3d} {med:10.1%} {mx:9.1%} {signed:+10.1%}")
    print(f"  {'all cases':28s} {overall[0]:3d} {overall[1]:10.1%} {overall[2]:9.1%} {overall[3]:+10.1%}")


def overall(results):
    es = [e for _, _, e in results]
    return len(es), statistics.median(abs(e) for e in es), max(abs(e) for e in es), statistics.median(es)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--estimator", choices=("auto", "analytical"), default="auto",
                    help="auto: what `phantora trace` uses without a GPU (the calibrated H100 table, "
                         "analytical outside it); analytical: the models alone")
    ap.add_argument("--cases", action="store_true", help="one line per case")
    ap.add_argument("--kernels", action="store_true", help="with --cases: predicted and measured kernels")
    ap.add_argument("--loo", action="store_true", help="also leave-one-out: each case from curves fitted without it")
    ap.add_argument("--gpu", choices=sorted(SWEEPS), default="h100",
                    help="the simulated GPU and the sweep measured on it")
    ap.add_argument("--ratio", action="store_true",
                    help="per family, measured and modelled H200/H100 ratios of the cases both sweeps have")
    args = ap.parse_args(argv)
    if args.loo and args.gpu != "h100":
        ap.error("--loo refits the H100 curves; on another GPU every case is held out already")
    gpu = lookup_gpu(args.gpu)
    est = estimator(args.estimator, gpu)
    rows = load_sweep(SWEEPS[args.gpu])
    with warnings.catch_warnings():  # nn.RMSNorm on bf16 with fp32 weights says it cannot fuse: as on the GPU
        warnings.simplefilter("ignore", UserWarning)
        sigs = [signatures(r) for r in rows]
    results = errors(est, rows, sigs)
    if args.cases:
        for (r, p, e), ss in zip(results, sigs):
            print(f"{family(r):24s} {label(r):70s} measured {r['total_us']:9.1f} us  predicted {p:9.1f}  {e:+7.1%}")
            if args.kernels:
                ana = AnalyticalEstimator(gpu)
                for s in ss:
                    ks = ana.kernels(s).kernels
                    for k in ks:
                        print(f"      phantora {k.duration_ns / 1e3:8.2f}  {s.short_name}: {k.name}")
                for k in r["kernels"]:
                    print(f"      measured {k['us']:8.2f}  {k['name'][:90]}")
    print_table(f"{est.name} estimator vs the {args.gpu.upper()} sweep "
                "(|predicted/measured - 1| of each case's total kernel time)",
                family_table(results), overall(results))
    if args.loo:
        loo = loo_errors(est, rows, sigs)
        if args.cases:
            for r, p, e in loo:
                print(f"LOO {family(r):24s} {label(r):70s} measured {r['total_us']:9.1f} us  predicted {p:9.1f}  {e:+7.1%}")
        print_table("leave-one-out: each case predicted from curves fitted without it", family_table(loo), overall(loo))
    if args.ratio:
        print_ratios(args.estimator, rows, sigs)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
