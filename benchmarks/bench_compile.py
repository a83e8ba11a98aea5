"""Eager vs torch.compile step time, as phantora predicts it, for the bundled GPT example and a
Llama-style model (benchmarks/_llama_steps.py, blocks compiled as TorchTitan compiles them).

    python benchmarks/bench_compile.py [--python CUDA_BUILD_PYTHON] [--quick]

Runs each script twice under `phantora trace` (eager, then --compile) with a CUDA build of torch
(its Triton generates the kernels phantora times; default: the test suite's environment under
phantora's cache dir) and prints the simulated mean step time (after the first step, which
holds the compilation), the compiled/eager speed-up and the wall time of each run.
For reference: TorchTitan publishes 5,762 tokens/s/GPU eager and 6,667 compiled for Llama 3 8B
on 8 H100s (a 1.157x speed-up).
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

STEP = re.compile(r"mean step time \(after the first\): ([\d.]+) ms")

CASES = {
    "GPT-2 124M (examples/gpt_train.py, B=8, T=1024)": (ROOT / "examples" / "gpt_train.py", ("--steps", "4")),
    "Llama-style 0.5B (8 layers, d=2048, GQA 16/4, B=4, T=2048)": (ROOT / "benchmarks" / "_llama_steps.py", ()),
}
QUICK = {
    "GPT-2 2 layers (examples/gpt_train.py, B=8, T=1024)": (ROOT / "examples" / "gpt_train.py",
                                                            ("--steps", "3", "--layers", "2")),
    "Llama-style 2 layers (d=1024, B=2, T=1024)": (ROOT / "benchmarks" / "_llama_steps.py",
                                                    ("--steps", "3", "--layers", "2", "--dim", "1024",
                                                     "--hidden", "2816", "--batch", "2", "--seq", "1024")),
}


def _default_python() -> str:
    from interpose.device.shim_build import cache_dir

    return str(cache_dir() / "test-venv-cuda-torch" / "bin" / "python")


def run(python: str, script: Path, args: tuple[str, ...], compiled: bool, out: Path) -> tuple[float, float]:
    """(simulated mean step time in ms, wall seconds) of one traced run."""
    cmd = [sys.executable, "-m", "phantora.cli", "trace", "-o", str(out), "--", python, str(script), *args]
    if compiled:
        cmd.append("--compile")
    t0 = time.monotonic()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=3600)
    wall = time.monotonic() - t0
    m = STEP.search(proc.stdout)
    if proc.returncode != 0 or m is None:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    return float(m.group(1)), wall


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--python", help="a Python with a CUDA build of torch (and its Triton)")
    ap.add_argument("--quick", action="store_true", help="2-layer models (minutes instead of tens of minutes)")
    args = ap.parse_args()
    python = args.python or _default_python()
    print(f"{'model':<62} {'eager ms':>9} {'compiled ms':>12} {'speed-up':>9} {'wall s (e/c)':>13}")
    with tempfile.TemporaryDirectory() as tmp:
        for name, (script, extra) in (QUICK if args.quick else CASES).items():
            eager, wall_e = run(python, script, extra, False, Path(tmp) / "eager.json")
            compiled, wall_c = run(python, script, extra, True, Path(tmp) / "compiled.json")
            print(f"{name:<62} {eager:>9.2f} {compiled:>12.2f} {eager / compiled:>8.3f}x "
                  f"{wall_e:>6.0f}/{wall_c:<6.0f}", flush=True)
    print("TorchTitan, Llama 3 8B on 8 H100s (published): 5,762 -> 6,667 tokens/s/GPU, 1.157x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
