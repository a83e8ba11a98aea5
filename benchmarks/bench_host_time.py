"""The program's own host time against real runs (docs/host-time.md).

    python benchmarks/bench_host_time.py [--repeats 3] [--only probe,examples,lightning,spread]

probe      benchmarks/groundtruth/host_probe.py under phantora on the lent H100 host's speed
           (--host lent-h100), its phases' times against the same script's real run on that host
           (tests/data/groundtruth/host_probe.json), counted, measured and modelled host.
examples   examples/gpt_train.py and cnn_train.py as their real runs on the lent H100 ran them
           (tests/data/groundtruth/examples/examples.json): mean step after the first and the
           first step, counted, measured and modelled host, with and without start-up costs.
lightning  benchmarks/host/lightning_gpt.py (GPT-124M under Lightning 2.6, default progress bar):
           the steady and the first step, counted, measured and modelled (real: ~31-34 ms and ~620 ms on an
           H100 and an H200, issue 26; the real script is not this one).
spread     the README example (examples/gpt_train.py, default host) `--repeats` times, counted and
           measured, alone and beside two CPU-burning processes: min / mean / max of its mean step,
           and of its simulated Python per step.

Each row is one phantora run unless said; the measured host's figures carry this machine's
run-to-run noise, so compare rows of one invocation.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GT = ROOT / "tests" / "data" / "groundtruth"


def trace(out: Path, command: list[str], *options: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "phantora.cli", "trace", "--quiet", *options, "-o", str(out), "--",
                           sys.executable, *command], cwd=ROOT, capture_output=True, text=True, timeout=1800)
    if check and proc.returncode != 0:
        raise SystemExit(f"phantora failed on {command}: {proc.stderr[-2000:]}")
    return proc


MODES = ("counted", "measured", "modelled")  # --host-time, the default first


def pct(a: float, b: float) -> str:
    return f"{(a / b - 1) * 100:+.1f}%"


def probe(work: Path) -> None:
    real = {r["name"]: r["us"] for r in json.loads((GT / "host_probe.json").read_text())["data"]}
    print("host_probe.py, lent-h100 host: phase time (us), phantora vs the real run")
    print(f"{'workload':22s} {'phase':10s} {'real':>9s}" + "".join(f" {m:>9s} {'err':>7s}" for m in MODES))
    errs: dict[str, list[float]] = {m: [] for m in MODES}
    got: dict[str, dict] = {}
    for mode in MODES:
        out = work / f"probe_{mode}"
        # its last part (the CUDA allocator's history) needs the CUDA build; the phases print before
        proc = trace(work / f"probe_{mode}.json", ["benchmarks/groundtruth/host_probe.py", str(out)],
                     "--host", "lent-h100", "--host-time", mode, "--no-startup-costs", check=False)
        for line in proc.stdout.splitlines():
            m = re.match(r"^(\S+): [\d.]+s\s+(\{.*\})$", line)
            if m:
                got.setdefault(m.group(1), {})[mode] = json.loads(m.group(2))
    for name, phases in real.items():
        for phase in ("fwd", "fwd_bwd", "step", "full"):
            r = phases[phase]
            row = f"{name:22s} {phase:10s} {r:9.0f}"
            for mode in MODES:
                a = got[name][mode][phase]
                errs[mode].append(abs(a / r - 1))
                row += f" {a:9.0f} {pct(a, r):>7s}"
            print(row)
    for mode, e in errs.items():
        print(f"{mode}: mean |error| {statistics.fmean(e) * 100:.1f}%, worst {max(e) * 100:.1f}% over {len(e)} phases")


def _steps(stdout: str, pattern: str) -> list[float]:
    return [float(x) for x in re.findall(pattern, stdout)]


def examples(work: Path) -> None:
    real = json.loads((GT / "examples" / "examples.json").read_text())["data"]
    print("examples on the lent-h100 host: mean step after the first and the first step (ms), phantora vs real")
    print(f"{'example':20s} {'real':>8s} {'real 1st':>9s} | " + " | ".join(f"{m:>9s} {'1st':>8s}" for m in MODES)
          + f" | {'no start-up 1st':>15s}")
    for name, r in real.items():
        cmd = list(r["command"])
        pattern = r"time ([\d.]+) ms" if "gpt" in name else r"GPU time ([\d.]+) ms"
        real_steps = _steps(r["stdout"], pattern)
        row = [f"{name:20s} {statistics.fmean(real_steps[1:]):8.2f} {real_steps[0]:9.1f}"]
        for options in (*(("--host-time", m) for m in MODES), ("--host-time", "counted", "--no-startup-costs")):
            proc = trace(work / f"{name}.json", cmd, "--host", "lent-h100", *options)
            s = _steps(proc.stdout, pattern)
            if "--no-startup-costs" in options:
                row.append(f"{s[0]:15.1f}")
            else:
                row.append(f"{statistics.fmean(s[1:]):9.2f} {s[0]:8.1f}")
        print(" | ".join(row))


def lightning(work: Path) -> None:
    print("Lightning GPT-124M, 1 GPU, default host (reference): steady step (mean of steps 2-8) and first step (ms)")
    for mode in MODES:
        proc = trace(work / f"lightning_{mode}.json", ["benchmarks/host/lightning_gpt.py", "--steps", "8",
                                                       "--root", str(work / "lightning")], "--host-time", mode)
        s = _steps(proc.stdout, r"step \d+: ([\d.]+) ms")
        print(f"  {mode:9s} steady {statistics.fmean(s[1:]):6.2f}  first {s[0]:7.1f}   (steps: {' '.join(f'{x:.1f}' for x in s)})")


def spread(work: Path, repeats: int) -> None:
    from phantora.query import load
    from phantora.query.summary import summarize

    for mode in ("counted", "measured"):
        for burn in (False, True):
            means, python = [], []
            burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2 if burn else 0)]
            try:
                for i in range(repeats):
                    out = work / f"gpt_{mode}_{burn}_{i}.json"
                    proc = trace(out, ["examples/gpt_train.py"], "--host-time", mode)
                    means.append(float(re.search(r"mean step time \(after the first\): ([\d.]+) ms",
                                                 proc.stdout).group(1)))
                    h = summarize(load(str(out))).host
                    python.append(h.per_step_ns.get("python", 0) / 1e6 if h else 0.0)
            finally:
                for b in burners:
                    b.kill()
            lo, hi = min(means), max(means)
            print(f"README example x{repeats}, {mode} host{', 2 CPU-burning processes beside it' if burn else ''}: "
                  f"mean step {lo:.2f}-{hi:.2f} ms (mean {statistics.fmean(means):.2f}, spread "
                  f"{(hi - lo) / statistics.fmean(means) * 100:.1f}%); Python per step {min(python):.2f}-{max(python):.2f} ms")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--only", default="probe,examples,lightning,spread")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="phantora-host-time-") as tmp:
        work = Path(tmp)
        for part in args.only.split(","):
            if part == "spread":
                spread(work, args.repeats)
            else:
                {"probe": probe, "examples": examples, "lightning": lightning}[part](work)
            print(flush=True)


if __name__ == "__main__":
    main()
