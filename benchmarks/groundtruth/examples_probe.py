"""Run the bundled examples on a real GPU: step times, peak memory, and per-op GPU time.

    python benchmarks/groundtruth/examples_probe.py OUT_DIR

For each configuration, the example runs twice: once plainly (its own printed step times and
peak memory are the ground truth phantora is compared with) and once under torch.profiler
(record_shapes) to get, per aten op and input shapes, the calls and the GPU (self device)
time, which calibrates and checks the kernel-time model at real training shapes.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

CONFIGS = {
    "gpt_124m_b8": ["examples/gpt_train.py", "--steps", "8"],
    "gpt_124m_b4_ckpt": ["examples/gpt_train.py", "--steps", "8", "--batch", "4", "--checkpoint"],
    "gpt_small_b8_t512": ["examples/gpt_train.py", "--steps", "8", "--layers", "4", "--embd", "512",
                          "--heads", "8", "--seq", "512"],
    "gpt_350m_b8": ["examples/gpt_train.py", "--steps", "8", "--layers", "24", "--embd", "1024", "--heads", "16"],
    "cnn_b64_img64": ["examples/cnn_train.py", "--steps", "8"],
    "cnn_b128_img128": ["examples/cnn_train.py", "--steps", "8", "--batch", "128", "--image", "128"],
}
# bench_llama_families.py's Llama 3 shapes (4 layers, 128k vocabulary), named as its --real reads
# their profiles: real steps and kernels
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench_llama_families import COMMON, CONFIGS as LLAMA_CONFIGS, REAL_PROFILES  # noqa: E402

CONFIGS.update({profile: ["benchmarks/_llama_steps.py", *COMMON.split(), *LLAMA_CONFIGS[name].split()]
                for name, profile in REAL_PROFILES.items()})

PROFILE_WRAPPER = r"""
import json, runpy, sys, torch
from torch.profiler import profile, ProfilerActivity
out, script, args = sys.argv[1], sys.argv[2], sys.argv[3:]
sys.argv = [script] + args
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True) as prof:
    runpy.run_path(script, run_name="__main__")
rows = []
for e in prof.key_averages(group_by_input_shape=True):
    dev = getattr(e, "self_device_time_total", None)
    if dev is None:
        dev = e.self_cuda_time_total
    rows.append({"op": e.key, "shapes": str(e.input_shapes), "count": e.count,
                 "self_device_us": dev, "self_cpu_us": e.self_cpu_time_total})
kernels = {}
for e in prof.events():
    if e.device_type == torch.autograd.DeviceType.CUDA:
        k = kernels.setdefault(e.name, [0, 0.0])
        k[0] += 1
        k[1] += e.device_time_total if hasattr(e, "device_time_total") else e.cuda_time_total
json.dump({"ops": rows, "kernels": [{"name": n, "count": c, "us": us} for n, (c, us) in kernels.items()]},
          open(out, "w"))
"""


def main() -> None:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "examples_out")
    out.mkdir(parents=True, exist_ok=True)
    only = sys.argv[2].split(",") if len(sys.argv) > 2 else list(CONFIGS)
    wrapper = out / "_profile_wrapper.py"
    wrapper.write_text(PROFILE_WRAPPER)
    results = {}
    for name in only:
        cmd = CONFIGS[name]
        t0 = time.time()
        plain = subprocess.run([sys.executable, *cmd], capture_output=True, text=True, timeout=600)
        prof_file = out / f"profile_{name}.json"
        prof = subprocess.run([sys.executable, str(wrapper), str(prof_file), *cmd], capture_output=True,
                              text=True, timeout=600)
        mean = re.search(r"mean step time \(after the first\): ([\d.]+) ms", plain.stdout)
        peak = re.search(r"peak memory allocated: ([\d.]+) GiB", plain.stdout)
        results[name] = {
            "command": cmd, "returncode": plain.returncode, "stdout": plain.stdout, "stderr": plain.stderr[-3000:],
            "mean_step_ms": float(mean.group(1)) if mean else None,
            "peak_allocated_gib": float(peak.group(1)) if peak else None,
            "profile_returncode": prof.returncode, "profile_stderr": prof.stderr[-2000:],
        }
        print(f"{name}: {time.time() - t0:.1f}s rc={plain.returncode} mean={results[name]['mean_step_ms']} ms "
              f"peak={results[name]['peak_allocated_gib']} GiB profile rc={prof.returncode}", flush=True)
    import torch

    payload = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "data": results}
    (out / "examples.json").write_text(json.dumps(payload, indent=1))
    wrapper.unlink()


if __name__ == "__main__":
    main()
