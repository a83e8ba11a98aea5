"""Device-only script (not collected by pytest): time the PROFILE_CASES and a GPT training step
with torch.profiler on a real GPU and print them next to the analytical estimates.

    PYTHONPATH=. python3 benchmarks/groundtruth/kernel_profile_probe.py [--json OUT.json]

The numbers it printed on an H100 are in tests/data/groundtruth/h100_kernel_profile.json, which
test_profile.py checks the estimator against on machines without a GPU.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, "tests")
from cost.workloads import PROFILE_CASES, SignatureRecorder, TinyGPT  # noqa: E402

from phantora.cost.analytical import AnalyticalEstimator  # noqa: E402
from phantora.hardware import lookup_gpu  # noqa: E402

est = AnalyticalEstimator(lookup_gpu("h100"))


def kernel_us(prof) -> float:
    return sum(e.device_time_total for e in prof.events() if str(e.device_type).endswith("CUDA"))


def profile_call(call, reps: int = 10) -> float:
    """Median over reps of the summed GPU kernel time of one call."""
    for _ in range(3):
        call()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            call()
            torch.cuda.synchronize()
        times.append(kernel_us(prof))
    return sorted(times)[len(times) // 2]


def estimated_us(sigs) -> float:
    return sum(est.estimate(s).duration_ns for s in sigs) / 1e3


def gpt_step() -> dict:
    """Kernel time of one TinyGPT training step (bf16 autocast, fused AdamW), per op name."""
    torch.manual_seed(0)
    model = TinyGPT().cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=True)
    idx = torch.randint(0, 8192, (8, 1024), device="cuda")

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(idx)
        F.cross_entropy(logits.float().view(-1, logits.shape[-1]), idx.view(-1)).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(3):
        step()
    torch.cuda.synchronize()
    rec = SignatureRecorder()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        with rec:
            step()
        torch.cuda.synchronize()
    per_op: dict[str, float] = defaultdict(float)
    for s in rec.signatures:
        per_op[s.name] += est.estimate(s).duration_ns / 1e3
    return {"measured_kernel_us": kernel_us(prof), "estimated_us": sum(per_op.values()),
            "estimated_us_by_op": dict(sorted(per_op.items(), key=lambda kv: -kv[1])),
            "unknown_ops": sorted({s.full_name for s in rec.signatures if not est.estimate(s).known})}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--json")
    args = p.parse_args()
    out = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "cases_us": {}}
    print(f"{out['device']}, torch {out['torch']}\n{'case':<46}{'profiled us':>12}{'est us':>10}{'ratio':>7}")
    for name, build in PROFILE_CASES.items():
        call = build("cuda")
        measured = profile_call(call)
        rec = SignatureRecorder()
        with rec:
            call()
        e = estimated_us(rec.signatures)
        out["cases_us"][name] = round(measured, 1)
        print(f"{name:<46}{measured:>12.1f}{e:>10.1f}{e / measured:>7.2f}")
    step = gpt_step()
    out["gpt_step"] = {k: step[k] for k in ("measured_kernel_us", "estimated_us")}
    print(f"\nGPT step (TinyGPT d=1024 L=2, 8x1024 tokens): profiled {step['measured_kernel_us']:.0f} us of kernels, "
          f"estimated {step['estimated_us']:.0f} us; unknown ops: {step['unknown_ops']}")
    for op, us in list(step["estimated_us_by_op"].items())[:15]:
        print(f"  {op:<56}{us:>10.1f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
