"""Issue 14, cause 8: single-process multi-GPU. A plain `python train.py` on an 8-GPU node sees 8
GPUs, so the HF Trainer wraps the model in nn.DataParallel: torch.cuda.comm's scatter / gather /
broadcast_coalesced / reduce_add, replicate and parallel_apply (one thread per GPU) must work, and
the simulator must place each GPU's work on that GPU's timeline."""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path

import pytest

from tests.virtual_gpu.harness import BUILDS, assert_ran, run_traced


def _gpu_work(trace: Path) -> tuple[Counter, Counter]:
    """Kernels per device, and peer copies per source device."""
    events = json.loads(trace.read_text())
    events = events["traceEvents"] if isinstance(events, dict) else events
    kernels, peer = Counter(), Counter()
    for e in events:
        if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy"):
            kernels[e["args"]["device"]] += 1
            if e["name"].startswith("Memcpy PtoP"):
                peer[e["args"]["device"]] += 1
    return kernels, peer


@BUILDS
@pytest.mark.parametrize("visible, gpus", [(None, 8), ("0,1", 2)])
def test_data_parallel_training(tmp_path: Path, user_python: str, visible: str | None, gpus: int) -> None:
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    if visible is not None:
        env["CUDA_VISIBLE_DEVICES"] = visible
    proc, trace = run_traced(tmp_path, user_python, "launchdp_data_parallel.py", str(gpus), env=env)
    assert_ran(proc, "device_count", "comm", "peer copy waits", "train", "step time")
    kernels, peer = _gpu_work(trace)
    assert sorted(kernels) == list(range(gpus)), kernels  # one process, a timeline per GPU it drives
    assert all(kernels[d] >= 20 for d in range(gpus)), kernels  # each replica's forward and backward
    # weights are broadcast from cuda:0 and outputs/gradients come back: peer copies both ways
    assert peer[0] > 0 and all(peer[d] > 0 for d in range(1, gpus)), peer
