"""Cost of the whole phantora pipeline against plain FakeTensorMode, on the GPT example.

    python benchmarks/bench_pipeline.py [--rounds 3] [--steps 5]

Each round runs GPT-124M training steps (batch 8 x 1024, bf16 autocast, fused AdamW) twice,
alternating: under shim + FakeTensorMode alone, and under `phantora trace` (interposition +
simulator + Chrome JSON trace). Both report real wall time per step after warm-up; the ratio
within a round is the figure of merit (target <= 1.5x). Alternating keeps the shared machine's
noise from favouring one side. us/op divides each side's step by the ops phantora counted in it
(the same program, so the same ops). The driver reads wall time with datetime.now(), which phantora
leaves real (benchmarks/_gpt_steps.py says why time.* cannot be used).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
DRIVER = HERE / "_gpt_steps.py"


def run(cmd: list[str]) -> dict:
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=HERE.parent, timeout=900)
    for line in proc.stdout.splitlines():
        if line.startswith("{"):
            return json.loads(line)
    raise RuntimeError(f"benchmark run failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=5)
    args = ap.parse_args()
    steps = ["--steps", str(args.steps)]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            fake = run([sys.executable, str(DRIVER), "--fake-only", *steps])
            trace = Path(tmp) / f"bench{r}.json"
            full = run([sys.executable, "-m", "phantora.cli", "trace", "-o", str(trace), "--",
                        sys.executable, str(DRIVER), *steps])
            if abs(full["wall_s_per_step"] - full["simulated_s_per_step"]) < 1e-9:
                raise RuntimeError("the driver's wall time equals the simulated step: it read a virtual clock")
            ratio = full["wall_s_per_step"] / fake["wall_s_per_step"]
            rows.append((fake["wall_s_per_step"], full["wall_s_per_step"], full["ops_per_step"], ratio,
                         trace.stat().st_size))
    print(f"{'round':>5} {'FakeTensorMode s/step':>22} {'phantora s/step':>16} {'ops/step':>9} "
          f"{'us/op (Fake)':>13} {'us/op (phantora)':>17} {'ratio':>6} {'trace MB':>9}")
    for i, (fake, full, ops, ratio, size) in enumerate(rows):
        print(f"{i:>5} {fake:>22.3f} {full:>16.3f} {ops:>9.0f} {fake / ops * 1e6:>13.1f} {full / ops * 1e6:>17.1f} "
              f"{ratio:>6.2f} {size / 1e6:>9.1f}")
    ratios = [r[3] for r in rows]
    print(f"median ratio phantora / FakeTensorMode: {statistics.median(ratios):.2f}x (target <= 1.5x)")


if __name__ == "__main__":
    main()
