"""phantora on the simulated H200 against the eight programs a lent H200 VM ran (2026-11-29).

    python benchmarks/bench_h200_kernels.py [--only gpt_124m_b8,llama_1b,...] [--families] [--json FILE]

tests/data/groundtruth/h200_vm/examples holds, for four bundled examples and four Llama-shaped
programs, the real steps (examples.json: each program's printed per-step times) and a
torch.profiler run of the whole program (profile_*.json). For each, this runs the same command
under `phantora trace --gpu h200 --host-time modelled` and prints

- the median step after the first, simulated and real (the real host is the VM's, which the host
  model was not fitted to: where the real GPU idles, the step is the host's, docs/host-time.md);
- the GPU kernel time per step, simulated and real: every kernel of the whole program (model
  initialisation and the first step included on both sides) divided by the steps it ran. This is
  the figure that isolates the kernel models. `--families` adds it by family
  (bench_llama_families.kernel_family). Nothing in phantora was fitted to these programs.
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_llama_families import REAL, real_families, trace_families  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
# "step 3: loss ..., time 23.60 ms" (GPT), "step 3: loss 4.664, GPU time 24.62 ms" (CNN),
# "step 1: time 36.40 ms" (Llama)
STEP = re.compile(r"^step (\d+):.*?time ([\d.]+) ms", re.M)


def median_step(stdout: str) -> float:
    """The median of the printed step times after the first."""
    steps = [float(t) for i, t in STEP.findall(stdout) if int(i) > 0]
    return statistics.median(steps)


def step_count(stdout: str) -> int:
    return len(STEP.findall(stdout))


def simulate(command: list[str], out: Path) -> str:
    cmd = [sys.executable, "-m", "phantora.cli", "trace", "--quiet", "--gpu", "h200", "--host-time", "modelled",
           "-o", str(out), "--", sys.executable, *command]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        raise RuntimeError(f"{command}: rc={proc.returncode}: {proc.stderr[-1500:]}")
    return proc.stdout


def compare(name: str, real: dict, tmp: str) -> dict:
    trace = Path(tmp) / f"{name}.json"
    stdout = simulate(real["command"], trace)
    steps = step_count(real["stdout"])
    sim_fam = {f: v / steps for f, v in trace_families(trace).items()}
    real_fam = {f: v / steps for f, v in real_families(name).items()}
    return {"real_step": median_step(real["stdout"]), "sim_step": median_step(stdout),
            "real_kernels": sum(real_fam.values()), "sim_kernels": sum(sim_fam.values()),
            "real_families": real_fam, "sim_families": sim_fam, "steps": steps}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    truth = json.loads((REAL / "examples.json").read_text())["data"]
    ap.add_argument("--only", default=",".join(truth))
    ap.add_argument("--families", action="store_true", help="kernel ms per step by family")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.only.split(","):
            results[name] = compare(name, truth[name], tmp)
    print(f"{'program':20s} {'real step':>10s} {'phantora':>9s} {'error':>7s}   {'real GPU':>9s} {'phantora':>9s} "
          f"{'error':>7s}  (ms; GPU: kernel time per step)")
    for name, r in results.items():
        print(f"{name:20s} {r['real_step']:10.2f} {r['sim_step']:9.2f} {r['sim_step'] / r['real_step'] - 1:+7.1%}   "
              f"{r['real_kernels']:9.2f} {r['sim_kernels']:9.2f} {r['sim_kernels'] / r['real_kernels'] - 1:+7.1%}")
        if args.families:
            fams = sorted(set(r["real_families"]) | set(r["sim_families"]), key=lambda f: -r["real_families"].get(f, 0))
            for f in fams:
                a, b = r["real_families"].get(f, 0.0), r["sim_families"].get(f, 0.0)
                print(f"    {f:40s} real {a:8.3f}  phantora {b:8.3f}  " + (f"{b / a - 1:+7.1%}" if a else "    n/a"))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
