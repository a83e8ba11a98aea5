"""`phantora trace --kernel-times/--calibration` and `phantora calibrate` from the command line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from interpose.device.shim_build import cache_dir as shim_cache_dir
from phantora.cli import main
from phantora.cost import choose_estimator
from phantora.cost.measurements import mm_signature, read_calibration
from phantora.hardware import lookup_gpu
from phantora.trace.check import load_chrome_trace

ROOT = Path(__file__).resolve().parents[2]
# A script small enough to time on a CPU: GEMMs the tiny calibration grid measures, and an add.
SCRIPT = """
import torch
a = torch.randn(256, 256, device="cuda")
b = torch.randn(256, 256, device="cuda")
for _ in range(3):
    c = a @ b
    d = c + a
torch.cuda.synchronize()
print("done", float(d.sum()))
"""


def invoke(*args: str):  # type: ignore[no-untyped-def]
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def trace_args(tmp_path: Path, *options: str) -> list[str]:
    return ["trace", *options, "-o", str(tmp_path / "run.json"), "--", sys.executable, "-c", "pass"]


def test_missing_calibration_file(tmp_path):
    r = invoke(*trace_args(tmp_path, "--calibration", str(tmp_path / "none.jsonl")))
    assert r.exit_code == 2
    assert "calibration file" in r.output and "none.jsonl does not exist" in r.output
    assert "Traceback" not in r.output and not (tmp_path / "run.json").exists()


def test_malformed_calibration_file_names_file_and_line(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"op": "device", "name": "NVIDIA H100 80GB HBM3"}\n{"op": "mm", "M": 256, "dtype": "bf16"}\n')
    r = invoke(*trace_args(tmp_path, "--calibration", str(bad)))
    assert r.exit_code == 2
    assert f"{bad}:2:" in r.output and "missing N, K, us" in r.output and "'--calibration'" in r.output


def test_calibrated_for_a_gpu_without_a_table(tmp_path):
    r = invoke(*trace_args(tmp_path, "--gpu", "a100", "--kernel-times", "calibrated"))
    assert r.exit_code == 2 and "no calibration table for the simulated a100-sxm-80gb" in r.output


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA GPU is visible: calibrate would run on it")
def test_calibrate_refuses_without_a_gpu(tmp_path):
    r = invoke("calibrate", "-o", str(tmp_path / "t.jsonl"))
    assert r.exit_code == 2
    assert "none is visible" in r.output and "--device cpu" in r.output
    assert not (tmp_path / "t.jsonl").exists()


@pytest.fixture(scope="module")
def cpu_table(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("calibrate") / "cpu.jsonl"
    r = invoke("calibrate", "--device", "cpu", "-o", str(out))
    assert r.exit_code == 0, r.output
    return out


def test_calibrate_on_cpu_writes_a_table_that_loads(cpu_table):
    cal = read_calibration(cpu_table)
    assert cal.device_name.startswith("cpu") and cal.floor_us > 0
    rows = [json.loads(line) for line in cpu_table.read_text().splitlines()]
    assert rows[0]["op"] == "device" and {r["op"] for r in rows[1:]} >= {"mm", "add", "layer_norm", "d2d"}
    # the host's cost of one small op: a CPU add_ of one element takes a fraction of a microsecond
    # to a few microseconds of host time, nowhere near a GPU launch's floor or zero
    (host,) = [r for r in rows if r["op"] == "tiny_launch_host_us"]
    assert 0.05 < host["us"] < 50
    # the calibrated estimator built on it gives back a measured row at its shape (no per-launch gap)
    est = choose_estimator("calibrated", lookup_gpu("h100"), calibration=cpu_table, cuda_probe=lambda: None).estimator
    row = next(r for r in rows if r["op"] == "mm" and r["M"] == r["N"] == r["K"] == 256 and r["dtype"] == "fp32")
    e = est.estimate(mm_signature(256, 256, 256, "float32"))
    assert e.estimator == "calibrated"
    assert e.duration_ns == pytest.approx(row["us"] * 1e3, abs=1)


def run_trace(tmp_path: Path, *options: str, env: dict | None = None) -> tuple[subprocess.CompletedProcess, dict]:
    script = tmp_path / "tiny.py"
    script.write_text(SCRIPT)
    out = tmp_path / "run.json"
    proc = subprocess.run([sys.executable, "-m", "phantora.cli", "trace", *options, "-o", str(out), "--",
                           sys.executable, str(script)], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, **(env or {})})
    assert proc.returncode == 0, proc.stderr
    return proc, load_chrome_trace(out)


def kernel_labels(trace: dict, op: str) -> set[str]:
    return {e["args"]["estimator"] for e in trace["traceEvents"]
            if e.get("ph") == "X" and e.get("cat") == "kernel" and e["args"]["op"] == op}


@pytest.mark.slow
def test_trace_with_a_calibration_file(tmp_path, cpu_table):
    proc, trace = run_trace(tmp_path, "--kernel-times", "calibrated", "--calibration", str(cpu_table))
    assert kernel_labels(trace, "aten::mm.default") == {"calibrated"}
    meta = trace["metadata"]
    assert meta["estimator"] == "calibrated"
    assert meta["kernel_times"]["calibration"] == str(cpu_table) and meta["kernel_times"]["requested"] == "calibrated"
    assert "kernel times: calibrated from cpu.jsonl" in proc.stderr
    assert "not on the simulated NVIDIA H100 80GB HBM3" in proc.stderr  # a CPU table for an H100


@pytest.mark.slow
def test_trace_measured_on_the_cpu(tmp_path):
    env = {"PHANTORA_MEASURE_DEVICE": "cpu", "PHANTORA_CACHE_DIR": str(tmp_path / "cache")}
    shim = shim_cache_dir() / "shim"  # the compiled native shim lives there too: reuse it, do not rebuild
    if shim.exists():
        (tmp_path / "cache").mkdir()
        (tmp_path / "cache" / "shim").symlink_to(shim)
    proc, trace = run_trace(tmp_path, "--kernel-times", "measured", env=env)
    assert kernel_labels(trace, "aten::mm.default") == {"measured"}
    assert trace["metadata"]["kernel_times"]["measured_on"].startswith("cpu")
    assert "they come from a different device" in proc.stderr
    assert "distinct ops:" in proc.stderr and " measured" in proc.stderr
    assert (tmp_path / "cache" / "kernel_times.sqlite").exists()


@pytest.mark.slow
def test_default_on_h100_is_the_shipped_table(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("a CUDA GPU is visible: auto measures on it")
    proc, trace = run_trace(tmp_path)
    assert trace["metadata"]["estimator"] == "calibrated"
    assert "auto: no CUDA GPU visible" in proc.stderr
    # 256x256x256 GEMMs sit at the shipped table's floor: the analytical model times them, and says why
    assert kernel_labels(trace, "aten::mm.default") == {"analytical (outside calibrated range)"}
