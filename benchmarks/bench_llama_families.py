"""Llama-family steps on the H100 and H200, GPU time by op family (issue 40, items 1-2).

    python benchmarks/bench_llama_families.py [--gpus h100,h200] [--only 1b]

Runs benchmarks/_llama_steps.py (RMSNorm unfused in fp32, RoPE on strided halves, GQA through
SDPA's enable_gqa, SwiGLU, untied head with a 128k vocabulary, bf16 weights, fused AdamW) in the
Llama 3 shapes, 4 layers each, under `phantora trace --host-time modelled` (the host modelled, so
that only kernels and launches differ from run to run), and prints the step time and the GPU
time of one step by op family, from the trace's kernels of the last step. No real figures here:
the held-out programs of the issue are not in the repository; this shows where the time goes and
what a model change moves (run it from two checkouts to compare).
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STEPS = ROOT / "benchmarks" / "_llama_steps.py"
STEP = re.compile(r"mean step time \(after the first\): ([\d.]+) ms")
# name: _llama_steps.py arguments (Llama 3.2 1B / 3B and Llama 3 8B widths, 4 layers)
CONFIGS = {
    "1b": "--dim 2048 --heads 32 --kv-heads 8 --hidden 8192 --batch 2 --seq 2048",
    "1b-ckpt-accum2": "--dim 2048 --heads 32 --kv-heads 8 --hidden 8192 --batch 1 --seq 2048 --checkpoint --accum 2",
    "3b-ckpt": "--dim 3072 --heads 24 --kv-heads 8 --hidden 8192 --batch 2 --seq 2048 --checkpoint",
    "8b-accum2": "--dim 4096 --heads 32 --kv-heads 8 --hidden 14336 --batch 1 --seq 2048 --accum 2",
    "1b-seq8k": "--dim 2048 --heads 32 --kv-heads 8 --hidden 8192 --batch 1 --seq 8192",
}
COMMON = "--layers 4 --vocab 128256 --steps 3"


def family(op: str, kernel: str) -> str:
    name = op.split("::")[-1].split(".")[0]
    if "attention" in name:
        return "attention"
    if name in ("mm", "addmm", "bmm", "linear"):
        return "GEMM"
    if name in ("_log_softmax", "_log_softmax_backward_data", "nll_loss_forward", "nll_loss_backward"):
        return "cross-entropy"
    if "adam" in name or name.startswith("_foreach"):
        return "optimizer"
    if name in ("_to_copy", "copy_"):
        return "casts and copies"
    if name in ("silu", "silu_backward"):
        return "SwiGLU activation"
    if name in ("mean", "sum", "pow", "rsqrt", "div"):
        return "RMSNorm statistics"
    if kernel.startswith("elementwise_kernel"):
        return "broadcast/strided elementwise (RMSNorm, RoPE)"
    if "elementwise" in kernel or "Fill" in kernel:
        return "vectorized elementwise"
    return "other"


def last_step_families(trace: Path) -> dict[str, float]:
    doc = json.loads(trace.read_text())
    events = doc["traceEvents"] if isinstance(doc, dict) else doc
    kernels = sorted((e for e in events if e.get("ph") == "X" and e.get("cat") == "kernel"), key=lambda e: e["ts"])
    opt = [i for i, e in enumerate(kernels) if "Adam" in e["name"]]
    step = kernels[opt[-2] + 1: opt[-1] + 1]
    by: dict[str, float] = collections.defaultdict(float)
    for e in step:
        by[family(e["args"].get("op", ""), e["name"])] += e["dur"] / 1e3
    return dict(by)


def run(config: str, gpu: str, tmp: str) -> tuple[float, dict[str, float]]:
    out = Path(tmp) / f"{config}-{gpu}.json"
    cmd = [sys.executable, "-m", "phantora.cli", "trace", "--quiet", "--gpu", gpu, "--host-time", "modelled",
           "-o", str(out), "--", sys.executable, str(STEPS), *COMMON.split(), *CONFIGS[config].split()]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=1200)
    m = STEP.search(proc.stdout)
    if proc.returncode != 0 or not m:
        raise RuntimeError(f"{config} on {gpu}: rc={proc.returncode}: {proc.stderr[-1500:]}")
    return float(m.group(1)), last_step_families(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", default="h100,h200")
    ap.add_argument("--only", default=",".join(CONFIGS))
    ap.add_argument("--json", type=Path, help="also write the figures here")
    args = ap.parse_args(argv)
    gpus = args.gpus.split(",")
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for config in args.only.split(","):
            for gpu in gpus:
                results[f"{config} {gpu}"] = run(config, gpu, tmp)
    for config in args.only.split(","):
        steps = "  ".join(f"{g} {results[f'{config} {g}'][0]:8.2f} ms" for g in gpus)
        ratio = (f"  {gpus[1]}/{gpus[0]} {results[f'{config} {gpus[1]}'][0] / results[f'{config} {gpus[0]}'][0]:.3f}"
                 if len(gpus) == 2 else "")
        print(f"{config}: step {steps}{ratio}")
        fams = sorted({f for g in gpus for f in results[f"{config} {g}"][1]},
                      key=lambda f: -results[f"{config} {gpus[0]}"][1].get(f, 0.0))
        for f in fams:
            print("    " + f"{f:48s}" + "".join(f"{results[f'{config} {g}'][1].get(f, 0.0):9.3f}" for g in gpus))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
