"""`phantora calibrate --grid sweep`: the H100 kernel sweep's cases on the local device.

The case list is checked against the lines of the H100 sweep file itself (phantora/cost/data/
h100_sxm_sweep.jsonl, a copy of shared/calibration/h100_sxm_sweep.jsonl), not against output of
the same code. No GPU here: the profiler path runs on the CPU stand-in (`--device cpu`, whose
'kernels' are CPU self times per profiler event, as its device row says); the GPU test is marked.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from phantora.cli import main
from phantora.cost.kernel_sweep import extra_cases, SweepCase, run_case, select, sweep_cases

SWEEP_FILE = Path(__file__).resolve().parents[2] / "phantora" / "cost" / "data" / "h100_sxm_sweep.jsonl"


def file_keys() -> list[str]:
    """Each line of the H100 sweep without its measurements, serialized (field order kept)."""
    out = []
    for line in SWEEP_FILE.read_text().splitlines():
        d = json.loads(line)
        out.append(json.dumps({k: v for k, v in d.items() if k not in ("kernels", "total_us")}))
    return out


def test_the_cases_include_every_line_of_the_h100_sweep_in_its_order():
    keys = [json.dumps(c.key) for c in sweep_cases("cuda")]  # listing allocates nothing: no GPU needed
    lines = file_keys()
    assert len(lines) == 132 and len(keys) == 168 and len(set(keys)) == 168
    assert keys[152:] == [json.dumps(k) for k, _, _ in extra_cases()]  # phantora's 16 come after the script's
    keys = keys[:152]
    missing = [k for k in lines if k not in keys]
    assert not missing, missing  # same op, sizes, dtype, layout, field order
    at = [keys.index(k) for k in lines]
    assert at == sorted(at)  # the file's order
    # the 20 the file lacks: the bf16 layer_norm cases (they failed on the H100 run) and the
    # ViT-sized ones (12608 = 197 x 64 rows or M, S = 197, the 16 x 16 patch convolution)
    extra = [json.loads(k) for k in keys if k not in lines]
    vit = [e for e in extra if e.get("rows") == 12608 or e.get("M") in (12608, 197) or e.get("S") == 197
           or e.get("K") == 16]
    bf16_ln = [e for e in extra if e["op"] == "layer_norm_fwd_bwd" and e["dtype"] == "bf16"]
    assert len(extra) == 20 and len(vit) == 16 and len(bf16_ln) == 5
    assert all(e in vit or e in bf16_ln for e in extra)


def test_the_cpu_variant_is_the_scripts():
    """SWEEP_DEVICE=cpu in the script: batch-like sizes / 16, no grouped_mm."""
    gpu, cpu = sweep_cases("cuda"), sweep_cases("cpu")
    assert len(cpu) == len(gpu) - 3 and not [c for c in cpu if c.key["op"] == "grouped_mm"]
    mm = [c.key for c in cpu if c.key["op"] == "mm"]
    assert {"op": "mm", "M": 8192 // 16, "N": 14336, "K": 4096, "dtype": "bf16"} in mm
    assert {"op": "topk", "tokens": 8192 // 16, "experts": 8, "k": 2} in [c.key for c in cpu]


def test_select_by_op():
    cases = sweep_cases("cpu")
    assert {c.key["op"] for c in select(cases, ["mm", "bmm"])} == {"mm", "bmm"}
    assert select(cases, None) == cases
    with pytest.raises(ValueError, match="no sweep case has op conv3d"):
        select(cases, ["conv3d"])


def test_a_failing_case_writes_its_error_and_no_kernels():
    def build():
        raise RuntimeError("expected scalar type BFloat16 but found Float")

    line = run_case(SweepCase({"op": "layer_norm_fwd_bwd", "rows": 8, "cols": 4, "dtype": "bf16"}, build), "cpu")
    assert line == {"op": "layer_norm_fwd_bwd", "rows": 8, "cols": 4, "dtype": "bf16",
                    "error": "RuntimeError: expected scalar type BFloat16 but found Float"}


def invoke(*args: str):  # type: ignore[no-untyped-def]
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


@pytest.fixture(scope="module")
def cpu_sweep(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("sweep") / "cpu_sweep.jsonl"
    r = invoke("calibrate", "--grid", "sweep", "--device", "cpu", "--only", "bmm,topk,silu_fwd_bwd", "-o", str(out))
    assert r.exit_code == 0, r.output
    assert "CPU self times per profiler event" in r.output and "wrote 16 cases (0 failed" in r.output
    return out


def test_cpu_sweep_writes_the_sweep_format(cpu_sweep):
    rows = [json.loads(line) for line in cpu_sweep.read_text().splitlines()]
    device, lines = rows[0], rows[1:]
    assert device["op"] == "device" and device["name"].startswith("cpu") and device["grid"] == "sweep"
    assert "cpu self time" in device["kernels_are"] and "not for fitting" in device["kernels_are"]
    want = [c.key for c in select(sweep_cases("cpu"), ["bmm", "topk", "silu_fwd_bwd"])]
    assert [{k: v for k, v in r.items() if k not in ("kernels", "total_us")} for r in lines] == want
    for r in lines:
        assert list(r)[-2:] == ["kernels", "total_us"]  # the H100 file's layout: key, kernels, total
        us = [k["us"] for k in r["kernels"]]
        assert us == sorted(us, reverse=True) and all(len(k["name"]) <= 120 for k in r["kernels"])
        assert r["total_us"] > 0 and r["total_us"] == pytest.approx(sum(us), abs=0.01 * len(us))
    names = {r["op"]: {k["name"] for k in r["kernels"]} for r in lines}
    assert "aten::bmm" in names["bmm"] and "aten::topk" in names["topk"] and "aten::_softmax" in names["topk"]
    assert {"aten::silu", "aten::silu_backward"} <= names["silu_fwd_bwd"]  # forward and backward


def test_cpu_sweep_lines_read_like_the_h100_file(cpu_sweep):
    """The per-family fit's reader takes the lines (the device row belongs to no class)."""
    from phantora.cost.sweep_fit import load_rows, observations

    rows = load_rows(cpu_sweep)
    assert rows[0]["op"] == "device"
    observations(rows)  # no error; a CPU run has no CUDA kernel names for the classes to match


@pytest.mark.parametrize("args, says", [
    (["--grid", "sweep", "--device", "cpu", "--only", "conv3d"], "no sweep case has op conv3d"),
    (["--grid", "tiny", "--device", "cpu", "--only", "mm"], "--only selects cases of --grid sweep"),
    (["--quick", "--grid", "sweep", "--device", "cpu"], "--quick is --grid quick"),
    (["--grid", "full", "--device", "cpu"], "on --device cpu use --grid tiny or sweep"),
])
def test_calibrate_sweep_usage_errors(tmp_path, args, says):
    r = invoke("calibrate", *args, "-o", str(tmp_path / "t.jsonl"))
    assert r.exit_code == 2 and says in r.output and "Traceback" not in r.output
    assert not (tmp_path / "t.jsonl").exists()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (torch.cuda.is_available() is False)")
def test_sweep_on_a_real_gpu(tmp_path):
    """CUDA kernels with their device times, the way the H100 file lists them."""
    out = tmp_path / "gpu_sweep.jsonl"
    r = invoke("calibrate", "--grid", "sweep", "--only", "mm,silu_fwd_bwd,adamw_fused", "-o", str(out))
    assert r.exit_code == 0, r.output
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert rows[0]["op"] == "device" and rows[0]["name"] == torch.cuda.get_device_name() and rows[0]["sms"] > 0
    assert rows[0]["memory_bytes"] == torch.cuda.get_device_properties(0).total_memory and rows[0]["capability"]
    for line in rows[1:]:
        assert "error" not in line, line
        assert not any(k["name"].startswith("aten::") for k in line["kernels"])  # kernels, not CPU ops
    big = next(line for line in rows if line["op"] == "mm" and line["N"] == 14336)
    assert 2 * 8192 * 14336 * 4096 / (big["total_us"] * 1e-6) / 1e12 > 100  # bf16 GEMM on tensor cores (TFLOP/s)


def test_phantoras_own_cases_replay_as_the_ops_the_models_distinguish():
    """The 16 cases after the script's (kernel_sweep.extra_cases), rebuilt on fake tensors as the
    per-family figures rebuild measured cases (tests/cost/sweep_cases.py): strided ones reach
    torch's generic elementwise kernel, the misaligned GEMMs the alignments gemm.py tells apart."""
    from phantora.cost.gemm import gemm_alignment
    from phantora.cost.pointwise import elementwise_kernel_name

    from .sweep_cases import signatures

    for key, _, _ in extra_cases():
        (sig,) = [s for s in signatures(key) if s.short_name not in ("ones_like", "add_")][:1] or [None]
        if key["op"] == "strided_elementwise":
            name = sig.name
            if key["kind"] == "transpose_copy":
                assert name in ("aten::clone", "aten::copy_"), name
            else:
                assert elementwise_kernel_name(sig) == "elementwise_kernel", (key, name)
        elif key["op"] in ("mm", "mm_nt"):
            a, b = sig.args[0], sig.args[1]
            want = {50257: 2, 30522: 4}[key["K"] if key["op"] == "mm" else key["N"]]
            if key["op"] == "mm":
                assert gemm_alignment(a, b) == want  # the gradient's operand
            else:
                assert gemm_alignment(a, b) == 16 and gemm_alignment(sig.tensors_out()[0]) == want  # logits alone
