"""Where a predicted step time differs from the real H100 run: GPU time per kernel family,
GPU busy and idle per step, and aten op calls per step, phantora against the real profile.

    python benchmarks/profile_breakdown.py gpt_124m_b4_ckpt [--kernel-times auto] [--trace run.json]

Runs the configuration of benchmarks/groundtruth/examples_probe.py under `phantora trace`
(or reads --trace) and compares it with tests/data/groundtruth/examples/profile_NAME.json
(torch-profiler totals over the 8 real steps, step 0 included) and the real step times in
examples.json. Real figures per step are the profile's totals / 8, without the model's
initial host-to-device copies; phantora's are the mean over its steps after the first.
The profile has no timeline, so the real GPU busy time is the sum of kernel times (one stream)
and real idle is the median real step minus that.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from collections import Counter, defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TRUTH = ROOT / "tests/data/groundtruth/examples"
sys.path.insert(0, str(ROOT / "benchmarks/groundtruth"))
from examples_probe import CONFIGS  # noqa: E402

PROFILED_STEPS = 8

# (family, substrings of a real kernel name); first match wins.
REAL_FAMILIES = [
    ("gemm", ("nvjet", "gemm", "splitKreduce", "cutlass")),
    ("sdpa fwd", ("sdpa_sm90_flash_fprop",)),
    ("sdpa bwd", ("sdpa_sm90_flash_bprop", "cudnn::fusion")),
    ("layernorm fwd", ("vectorized_layer_norm_kernel",)),
    ("layernorm bwd", ("GammaBeta", "layer_norm_grad_input")),
    ("cast/copy/cat", ("bfloat16_copy", "direct_copy", "CatArray")),
    ("gelu bwd", ("GeluBackward",)),
    ("gelu fwd", ("GeluCUDAKernel",)),
    ("loss", ("SoftMax", "nll_loss")),
    ("optimizer", ("FusedOptimizer",)),
    ("clip_grad_norm", ("LpNorm", "lpnorm", "NormTwoOps", "TensorListMetadata<1>", "reciprocal", "clamp",
                        "MulFunctor", "OnSelf_add")),
    ("add", ("CUDAFunctor_add",)),
    ("fill/zero", ("FillFunctor", "Memset")),
    ("embedding", ("gather", "embedding", "radix", "segment", "scatter", "grad_weight", "cub::", "reduce_kernel")),
]
SIM_FAMILIES = {
    "gemm": {"mm", "addmm", "bmm"},
    "sdpa fwd": {"_scaled_dot_product_cudnn_attention", "_scaled_dot_product_flash_attention",
                 "_scaled_dot_product_efficient_attention"},
    "sdpa bwd": {"_scaled_dot_product_cudnn_attention_backward", "_scaled_dot_product_flash_attention_backward",
                 "_scaled_dot_product_efficient_attention_backward"},
    "layernorm fwd": {"native_layer_norm"},
    "layernorm bwd": {"native_layer_norm_backward"},
    "cast/copy/cat": {"_to_copy", "copy_", "cat", "clone"},
    "gelu bwd": {"gelu_backward"},
    "gelu fwd": {"gelu"},
    "loss": {"_log_softmax", "_log_softmax_backward_data", "nll_loss_forward", "nll_loss_backward"},
    "optimizer": {"_fused_adamw_", "_fused_adam_"},
    "clip_grad_norm": {"_foreach_norm", "_foreach_mul_", "linalg_vector_norm", "stack", "reciprocal", "clamp",
                       "mul", "mul_"},
    "add": {"add", "add_"},
    "fill/zero": {"zeros", "zeros_like", "fill_", "zero_", "ones_like", "arange", "_foreach_add_"},
    "embedding": {"embedding", "embedding_dense_backward", "sum"},
}
NOTES = """\
Attribution differs in two rows: the real 'fill/zero' holds step 0's optimizer-state zeros
(spread over 8 steps) and nll_loss_backward's zeroing of its gradient, which phantora counts in
'loss'; real 'fill/zero' also holds cuDNN's memsets, which phantora does not model."""


def real_family(kernel: str) -> str | None:
    if kernel.startswith("Optimizer.") or kernel.startswith("Memcpy"):
        return None  # a profiler range over the optimizer's kernels; copies: model load, see module doc
    for family, keys in REAL_FAMILIES:
        if any(k in kernel for k in keys):
            return family
    return "other"


def sim_family(op: str) -> str:
    name = op.removeprefix("aten::").split(".")[0]
    for family, ops in SIM_FAMILIES.items():
        if name in ops:
            return family
    return "other"


def real_figures(config: str) -> tuple[dict[str, tuple[float, float]], Counter, list[float]]:
    profile = json.loads((TRUTH / f"profile_{config}.json").read_text())
    fam: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for k in profile["kernels"]:
        f = real_family(k["name"])
        if f is not None:
            fam[f][0] += k["count"] / PROFILED_STEPS
            fam[f][1] += k["us"] / PROFILED_STEPS
    calls: Counter = Counter()
    for row in profile["ops"]:
        if row["op"].startswith("aten::"):
            calls[row["op"]] += row["count"] / PROFILED_STEPS
    stdout = json.loads((TRUTH / "examples.json").read_text())["data"][config]["stdout"]
    steps = [float(line.split(" time ")[1].split(" ms")[0]) for line in stdout.splitlines()
             if line.startswith("step ")][1:]
    return {f: (n, us) for f, (n, us) in fam.items()}, calls, steps


def sim_figures(trace: Path) -> tuple[dict[str, tuple[float, float]], Counter, float, float]:
    events = json.loads(trace.read_text())["traceEvents"]
    starts = sorted(e["ts"] for e in events if e.get("cat") == "cuda_runtime" and e["name"] == "cudaDeviceSynchronize")
    end = max(e["ts"] + e.get("dur", 0) for e in events if e.get("ph") == "X")
    bounds = starts + [end]
    first, steps = bounds[1], len(bounds) - 2
    fam: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    intervals = []
    for e in events:
        if e.get("cat") in ("kernel", "gpu_memcpy") and e["ts"] >= first:
            f = sim_family(e["args"]["op"])
            fam[f][0] += e["args"]["kernels"] / steps
            fam[f][1] += e["dur"] / steps
            intervals.append((e["ts"], e["ts"] + e["dur"]))
    busy, reach = 0.0, first
    for a, b in sorted(intervals):
        a = max(a, reach)
        if b > a:
            busy, reach = busy + b - a, b
    calls = Counter(e["name"] for e in events if e.get("cat") == "cpu_op" and e["ts"] >= first)
    step_us = (bounds[-2] - first) / (steps - 1) if steps > 1 else end - first
    return ({f: (n, us) for f, (n, us) in fam.items()}, Counter({k: v / steps for k, v in calls.items()}),
            step_us, busy / steps)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("config", choices=sorted(CONFIGS))
    ap.add_argument("--kernel-times", default="auto")
    ap.add_argument("--trace", type=Path, help="an existing phantora trace of the configuration")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        trace = args.trace
        if trace is None:
            trace = Path(tmp) / "run.json"
            proc = subprocess.run([sys.executable, "-m", "phantora.cli", "trace", "--kernel-times", args.kernel_times,
                                   "--host", "lent-h100",  # the host the real profiles were taken on
                                   "-o", str(trace), "--", sys.executable, *CONFIGS[args.config]], cwd=ROOT,
                                  capture_output=True, text=True, timeout=1200)
            if proc.returncode != 0:
                sys.exit(f"phantora trace failed:\n{proc.stderr[-3000:]}")
        sim_fam, sim_calls, sim_step, sim_busy = sim_figures(trace)
    real_fam, real_calls, real_steps = real_figures(args.config)
    real_busy = sum(us for _, us in real_fam.values())
    real_med = statistics.median(real_steps)

    print(f"{args.config}: real steps 1-7 (ms) {', '.join(f'{s:.2f}' for s in real_steps)}; "
          f"mean {statistics.mean(real_steps):.2f}, median {real_med:.2f}; phantora {sim_step / 1e3:.2f}")
    print(f"\n{'kernel family':<16}{'real n':>8}{'sim n':>8}{'real us':>10}{'sim us':>10}{'err':>8}")
    for f in sorted(set(real_fam) | set(sim_fam), key=lambda f: -real_fam.get(f, (0, 0))[1]):
        rn, ru = real_fam.get(f, (0, 0))
        sn, su = sim_fam.get(f, (0, 0))
        err = f"{su / ru - 1:+.0%}" if ru else "-"
        print(f"{f:<16}{rn:>8.1f}{sn:>8.1f}{ru:>10.0f}{su:>10.0f}{err:>8}")
    print(f"{'GPU busy':<16}{'':>16}{real_busy:>10.0f}{sim_busy:>10.0f}{sim_busy / real_busy - 1:>+8.0%}")
    print(f"{'GPU idle':<16}{'':>16}{real_med * 1e3 - real_busy:>10.0f}{sim_step - sim_busy:>10.0f}"
          f"   (real: median step - busy)")
    print(NOTES)
    print(f"\n{'aten op calls per step':<40}{'real':>8}{'sim':>8}   (real includes step 0's init, / 8)")
    names = {n for n in real_calls if real_calls[n] >= 1} & {n for n in sim_calls if sim_calls[n] >= 1}
    names |= {n for n in sim_calls if sim_calls[n] >= 1 and n not in real_calls}
    for n in sorted(names, key=lambda n: -max(real_calls.get(n, 0), sim_calls.get(n, 0)))[:30]:
        print(f"{n:<40}{real_calls.get(n, 0):>8.1f}{sim_calls.get(n, 0):>8.1f}")


if __name__ == "__main__":
    main()
