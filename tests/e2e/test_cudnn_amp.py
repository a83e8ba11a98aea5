"""An fp16 channels_last CNN step under `phantora trace`: the layouts and the optimizer step a real
GPU gives (interpose/device/fake.py: cuDNN's conv memory format; interpose/values/policy.py: GradScaler's
found_inf), seen from inside the script and in the trace."""

from __future__ import annotations

import sys
from pathlib import Path

from phantora.trace.check import load_chrome_trace

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).resolve().parent / "scripts" / "cudnn_amp.py"


def test_channels_last_convs_and_grad_scaler_step(tmp_path):
    import subprocess

    out = tmp_path / "run.json"
    proc = subprocess.run([sys.executable, "-m", "phantora.cli", "trace", "-o", str(out), "--", sys.executable,
                           str(SCRIPT)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "CUDNN_AMP_OK" in proc.stdout
    ks = [e for e in load_chrome_trace(out)["traceEvents"] if e.get("ph") == "X" and e.get("cat") == "kernel"]
    convs = [k for k in ks if k["args"]["op"] == "aten::convolution.default" and k["args"]["dtypes"][0] == "float16"]
    # channels_last activations need no NCHW<->NHWC transposes around the implicit GEMM
    assert convs and all(k["args"]["kernels"] == 1 for k in convs), [k["name"] for k in convs]
    steps = [k for k in ks if k["args"]["op"].startswith("aten::_foreach_add")]
    assert len(steps) >= 2, "an optimizer step per iteration"
