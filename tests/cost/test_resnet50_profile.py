"""ResNet-50 (batch 128, 224^2, channels_last, bf16 autocast, SGD momentum) under phantora
against a torch.profiler trace of the same program on a real H100, kernel family by kernel family.

Ground truth: tests/data/groundtruth/h100_resnet50_b128.trace.json.gz (a copy of
shared/groundtruth/h100_resnet50_b128.trace.json.gz; one profiled step; the program is described
in shared/groundtruth/README.md and is benchmarks/groundtruth/resnet50_b128.py; real median step
34.81 ms). Each real kernel is put in a family by the aten op that launched it (the innermost
cpu_op around its cudaLaunchKernel), each simulated kernel by its op in phantora's trace.

Print the table:  python tests/cost/test_resnet50_profile.py [phantora_trace.json]
"""

from __future__ import annotations

import bisect
import gzip
import json
import re
import statistics
import subprocess
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
REAL_TRACE = ROOT / "tests" / "data" / "groundtruth" / "h100_resnet50_b128.trace.json.gz"
SCRIPT = ROOT / "benchmarks" / "groundtruth" / "resnet50_b128.py"
REAL_MEDIAN_STEP_MS = 34.81  # shared/groundtruth/README.md: 15 timed steps after 4 warm-ups

# aten op (as both traces name it, without overload) -> family
OP_FAMILY = {
    "cudnn_convolution": "conv forward", "convolution": "conv forward",
    "convolution_backward": "conv backward (dgrad+wgrad)",
    "native_batch_norm": "batchnorm forward", "native_batch_norm_backward": "batchnorm backward",
    "relu": "relu forward", "relu_": "relu forward", "clamp_min": "relu forward", "clamp_min_": "relu forward",
    "threshold_backward": "relu backward",
    "add": "residual add (fwd + grad accumulation)", "add_": "residual add (fwd + grad accumulation)",
    "max_pool2d_with_indices": "max pool forward", "max_pool2d_with_indices_backward": "max pool backward",
    "_foreach_add_": "SGD (foreach)", "_foreach_mul_": "SGD (foreach)",
}
FAMILIES = ("conv forward", "conv backward (dgrad+wgrad)", "batchnorm forward", "batchnorm backward",
            "relu forward", "relu backward", "residual add (fwd + grad accumulation)", "max pool forward",
            "max pool backward", "SGD (foreach)", "num_batches_tracked += 1", "dtype casts and copies",
            "H2D input copy (side stream)", "other (loss, fc, avg pool, fills)")


@dataclass
class Tally:
    count: int = 0
    us: float = 0.0


def _family(op: str, kernel: str, int64: bool) -> str:
    if kernel.startswith("Memcpy HtoD"):
        return "H2D input copy (side stream)"
    if op in ("add_", "add") and int64:
        return "num_batches_tracked += 1"
    if op in ("to", "_to_copy", "copy_", "clone") and "Memcpy" not in kernel:
        return "dtype casts and copies"
    return OP_FAMILY.get(op, "other (loss, fc, avg pool, fills)")


def real_families(path: Path = REAL_TRACE) -> dict[str, Tally]:
    events = json.loads(gzip.open(path).read())["traceEvents"]
    ops = sorted((e for e in events if e.get("cat") == "cpu_op"), key=lambda e: e["ts"])
    launches = {e["args"]["correlation"]: e for e in events
                if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})}
    starts = [o["ts"] for o in ops]
    out: dict[str, Tally] = defaultdict(Tally)
    for k in (e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")):
        launch = launches[k["args"]["correlation"]]
        enclosing = [o for o in ops[: bisect.bisect_right(starts, launch["ts"])]
                     if o["tid"] == launch["tid"] and launch["ts"] <= o["ts"] + o["dur"]]
        aten = [o["name"].removeprefix("aten::") for o in enclosing if o["name"].startswith("aten::")]
        # the weight casts run under aten::conv2d / aten::linear as aten::copy_
        op = aten[-1] if aten else ""
        if op in ("fill_", "copy_") and aten and aten[0] not in ("to", "copy_"):
            op = "copy_" if op == "copy_" else aten[0]
            if op in ("batch_norm", "native_batch_norm_backward"):
                op = "native_batch_norm" if op == "batch_norm" else op
        fam = _family(op, k["name"], "<long>" in k["name"])
        out[fam].count += 1
        out[fam].us += k["dur"]
    return out


def phantora_families(trace: Path) -> dict[str, Tally]:
    """The kernels of the last ProfilerStep of a phantora trace (one event per op: args.kernels)."""
    events = json.loads(trace.read_text())["traceEvents"]
    step = max((e for e in events if e.get("ph") == "X" and e.get("name", "").startswith("ProfilerStep")),
               key=lambda e: e["ts"])
    out: dict[str, Tally] = defaultdict(Tally)
    for e in events:
        if e.get("cat") not in ("kernel", "gpu_memcpy", "gpu_memset"):
            continue
        if not step["ts"] <= e["ts"] < step["ts"] + step["dur"]:
            continue
        op = e["args"]["op"].removeprefix("aten::").split(".")[0]
        fam = _family(op, e["name"], "int64" in e["args"].get("dtypes", []))
        out[fam].count += e["args"]["kernels"]
        out[fam].us += e["dur"]
    return out


def run_phantora(out: Path) -> float:
    """Trace the program (1 warm-up, 2 timed steps); its own median step time in ms. The host is
    modelled (--host-time modelled): this compares the GPU's kernels, and a step this close to
    host-bound would move with the measured host's run-to-run noise (docs/host-time.md). Without
    start-up costs: the real run warmed up for 4 steps, this one for 1, and the second step still
    loads the kernels SGD's momentum update first uses there."""
    proc = subprocess.run([sys.executable, "-m", "phantora.cli", "trace", "--host-time", "modelled",
                           "--no-startup-costs", "-o", str(out), "--", sys.executable,
                           str(SCRIPT), "--warmup", "1", "--steps", "2"],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return float(re.search(r"median step ([\d.]+) ms", proc.stdout).group(1))


def table(real: dict[str, Tally], sim: dict[str, Tally]) -> str:
    rows = [f"| {'family':<40} | real n | real ms | phantora n | phantora ms | error |", "|---|---:|---:|---:|---:|---:|"]
    for fam in FAMILIES:
        r, s = real.get(fam, Tally()), sim.get(fam, Tally())
        err = f"{s.us / r.us - 1:+.0%}" if r.us else "-"
        rows.append(f"| {fam:<40} | {r.count:6d} | {r.us / 1e3:7.2f} | {s.count:10d} | {s.us / 1e3:11.2f} | {err:>5} |")
    rt, st = sum(t.us for t in real.values()), sum(t.us for t in sim.values())
    rows.append(f"| {'all kernels':<40} | {sum(t.count for t in real.values()):6d} | {rt / 1e3:7.2f} | "
                f"{sum(t.count for t in sim.values()):10d} | {st / 1e3:11.2f} | {st / rt - 1:+.0%} |")
    return "\n".join(rows)


# --- the test ------------------------------------------------------------------------------

# Bands. The big families are each made of 16-53 kernels of repeated shapes; the profile's own
# step-to-step noise is ~0.3% (median 34.81, min 34.72 ms), so the band is the model's
# accuracy: 15% for a family worth more than 1 ms of the 34.8 ms step, 25% for those of
# 0.2-1 ms. Families under 0.2 ms are kernels near the ~1.5-2 us floor (phantora's 2 us floor
# includes the gap between back-to-back kernels, so e.g. 53 counter increments of 1.44 us real
# come out +39%): their kernel count is checked, not their time.
BIG_FAMILY_MS, TINY_FAMILY_MS = 1.0, 0.2
BIG_BAND, SMALL_BAND = 0.15, 0.25
# The step band is wider than the kernel total's: phantora starts a stream's next kernel the
# moment the previous one ends, where the real H100 leaves a median 1.8 us between consecutive
# kernels of the main stream (960 kernels: ~1.7 ms, 5% of this step; not modelled yet).
STEP_BAND = 0.08
# Families whose kernels phantora counts one for one; conv and BatchNorm launch helpers it
# folds into their main kernels (cuDNN workspace init, memsets, split-K reductions, cuBLAS
# nvjet reductions for the 1x1 convs, BatchNorm's zero fills).
COUNTED = ("relu forward", "relu backward", "residual add (fwd + grad accumulation)", "max pool forward",
           "max pool backward", "SGD (foreach)", "num_batches_tracked += 1", "dtype casts and copies")


@pytest.fixture(scope="module")
def traced(tmp_path_factory) -> tuple[float, dict[str, Tally]]:
    out = tmp_path_factory.mktemp("resnet50") / "run.json"
    step_ms = run_phantora(out)
    return step_ms, phantora_families(out)


@pytest.fixture(scope="module")
def real() -> dict[str, Tally]:
    return real_families()


def test_step_time_within_band(traced) -> None:
    step_ms, _ = traced
    assert abs(step_ms / REAL_MEDIAN_STEP_MS - 1) <= STEP_BAND, (step_ms, REAL_MEDIAN_STEP_MS)


@pytest.mark.parametrize("family", [f for f in FAMILIES if f != "H2D input copy (side stream)"])
def test_family_within_band(traced, real, family: str) -> None:
    _, sim = traced
    r, got = real[family], sim.get(family, Tally())
    if family in COUNTED:
        assert got.count == r.count, (family, got.count, r.count)
    if r.us < TINY_FAMILY_MS * 1e3:
        return
    band = BIG_BAND if r.us >= BIG_FAMILY_MS * 1e3 else SMALL_BAND
    assert abs(got.us / r.us - 1) <= band, (family, got.us, r.us, "\n" + table(real, sim))


if __name__ == "__main__":
    trace = Path(sys.argv[1]) if len(sys.argv) > 1 else None
    if trace is None:
        trace = Path("/tmp/phantora_resnet50.json")
        print(f"phantora median step {run_phantora(trace):.2f} ms (real {REAL_MEDIAN_STEP_MS} ms)")
    print(table(real_families(), phantora_families(trace)))
