"""The calibrated estimator on the shipped H100 table: held-out points, fallbacks, the auto choice,
and the checks on calibration files.

Held-out figures (leave-one-out over every usable point: each point predicted from the table
without it, plus the measuring method's gap, against its measurement) measured on the shipped
table: median 2.0%, p90 7.8% (analytical model on the same points: 4.2%, 13.1%). The bounds
below leave room for small model changes but stay under what the analytical model alone gets,
and under the table's own jitter between neighbouring shapes (~5-10% on mid-size GEMMs, e.g.
256x256x512 bf16 31.8 us vs 256x256x1024 30.7 us), which is what interpolation cannot beat.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from phantora.cost import KernelTimesError, choose_estimator
from phantora.cost.analytical import AnalyticalEstimator
from phantora.cost.calibrated import (
    NOT_CALIBRATED,
    OUTSIDE_RANGE,
    CalibratedEstimator,
    CalibrationTable,
    build_table,
    table_key,
)
from phantora.cost.measurements import (
    H100_CALIBRATION,
    CalibrationFileError,
    Measurement,
    mm_signature,
    read_calibration,
)
from phantora.hardware import lookup_gpu
from phantora.ops import OpSignature, TensorMeta

PROFILE = Path(__file__).parents[1] / "data" / "groundtruth" / "h100_kernel_profile.json"
EXAMPLE_PROFILES = sorted((Path(__file__).parents[1] / "data" / "groundtruth" / "examples").glob("profile_gpt*.json"))
NO_GPU = lambda: None  # noqa: E731  (the auto choice must not depend on the test machine)


@pytest.fixture(scope="module")
def calibration():
    return read_calibration(H100_CALIBRATION)


@pytest.fixture(scope="module")
def table(calibration, estimator) -> CalibrationTable:
    return build_table(calibration, estimator)


@pytest.fixture(scope="module")
def calibrated(table, estimator) -> CalibratedEstimator:
    return CalibratedEstimator(table, estimator)


def percentile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(q * (len(xs) - 1)))]


def held_out_errors(table: CalibrationTable, analytical: AnalyticalEstimator,
                    measurements: list[Measurement]) -> dict[str, tuple[str, float, float]]:
    """label -> (family, calibrated |error| with the point held out, analytical |error|)."""
    by_label = {m.label: m for m in measurements}
    out = {}
    for points in table.points.values():
        for p in points:
            m = by_label[p.label]
            loo = CalibratedEstimator(table.without(p.label), analytical).measured_equivalent_ns(m)
            ana = sum(analytical.estimate(s).duration_ns for s in m.signatures) + table.gap_ns[m.family]
            out[p.label] = (m.family, abs(loo / m.measured_ns - 1), abs(ana / m.measured_ns - 1))
    return out


@pytest.fixture(scope="module")
def loo(table, estimator, calibration):
    return held_out_errors(table, estimator, calibration.measurements)


def test_held_out_points_are_reproduced(loo):
    cal = [c for _f, c, _a in loo.values()]
    ana = [a for _f, _c, a in loo.values()]
    assert len(cal) > 250  # every family, floor-dominated points excluded
    assert statistics.median(cal) < 0.03 and percentile(cal, 0.9) < 0.10, \
        (statistics.median(cal), percentile(cal, 0.9))
    assert statistics.median(cal) < statistics.median(ana) and percentile(cal, 0.9) < percentile(ana, 0.9)


@pytest.mark.parametrize("family", ["mm bf16", "mm fp32"])
def test_held_out_gemms(loo, family):
    cal = [c for f, c, _a in loo.values() if f == family]
    assert len(cal) > 50
    assert statistics.median(cal) < 0.04


def test_a_measured_shape_is_reproduced_exactly(calibrated, table, calibration):
    m = next(m for m in calibration.measurements if m.label == "mm 8192x8192x8192 bf16")
    assert calibrated.estimate(m.signatures[0]).estimator == "calibrated"
    assert calibrated.measured_equivalent_ns(m) == pytest.approx(m.measured_ns, abs=1.0)


def test_method_gap_agrees_with_the_profiler(table):
    """The gap is estimated from the table's floor-dominated GEMMs alone. torch.profiler times
    of the same shapes on the same H100 (no gap) say what it really is: calibration minus
    profile for the shapes both have."""
    profile = json.loads(PROFILE.read_text())["cases_us"]
    rows = [json.loads(line) for line in H100_CALIBRATION.read_text().splitlines()]
    calib = {f"mm {r['M']}x{r['N']}x{r['K']} {r['dtype']}": r["us"] for r in rows if r["op"] == "mm"}
    diffs = [calib[case] - us for case, us in profile.items() if case in calib and case != "mm 4096x4096x256 bf16"]
    assert len(diffs) >= 3  # 4096x4096x256 is a known measurement event (test_calibration.KNOWN_OUTLIERS)
    assert min(diffs) <= table.gap_ns["mm bf16"] / 1e3 <= max(diffs), (diffs, table.gap_ns["mm bf16"])


def test_measurement_events_are_not_points(table):
    # the M=4096 bf16 row read 1.3-4x slow: each is slower than a GEMM at least as large everywhere
    for label in ("mm 4096x8192x256 bf16", "mm 4096x2048x4096 bf16"):
        assert "slower than a measured shape" in table.excluded[label]
        assert table.point(label) is None
    # 111 us, while 8192x4096x512 (the same work with M and N swapped) took 73 us
    assert "M and N swapped" in table.excluded["mm 4096x8192x512 bf16"]
    assert table.point("mm 8192x4096x512 bf16") is not None
    assert table.excluded["mm 256x256x256 bf16"] == "at the measuring method's floor"


def test_outside_the_measured_range_is_analytical(calibrated, estimator):
    for sig in (mm_signature(16384, 16384, 16384, "bfloat16"),  # beyond the largest measured size
                mm_signature(64, 64, 64, "bfloat16"),  # below it
                mm_signature(256, 256, 256, "bfloat16")):  # inside the grid, but floor-dominated
        e = calibrated.estimate(sig)
        assert e.estimator == OUTSIDE_RANGE
        assert e.duration_ns == estimator.estimate(sig).duration_ns


def test_ops_without_calibration_data_are_analytical(calibrated, estimator):
    x = TensorMeta((8, 512, 512), "bfloat16", (512 * 512, 512, 1), "cuda:0")
    bmm = OpSignature("aten::bmm", "default", (x, x), (x,), frozenset({"core"}))
    fp16 = mm_signature(4096, 4096, 4096, "float16")
    for sig in (bmm, fp16):
        e = calibrated.estimate(sig)
        assert e.estimator == NOT_CALIBRATED
        assert e.duration_ns == estimator.estimate(sig).duration_ns


def test_calibrated_between_measured_shapes(calibrated, estimator):
    """A shape between grid points is calibrated and lies between its measured neighbours."""
    mid = calibrated.estimate(mm_signature(6144, 6144, 6144, "bfloat16"))
    lo = calibrated.estimate(mm_signature(4096, 4096, 4096, "bfloat16"))
    hi = calibrated.estimate(mm_signature(8192, 8192, 8192, "bfloat16"))
    assert mid.estimator == "calibrated"
    assert lo.duration_ns < mid.duration_ns < hi.duration_ns


def test_keys_follow_the_measured_op():
    # addmm shares the mm rows (same cuBLAS GEMM, bias in the epilogue); a transposed operand too
    a = TensorMeta((1024, 768), "bfloat16", (768, 1), "cuda:0")
    bt = TensorMeta((768, 3072), "bfloat16", (1, 768), "cuda:0")
    out = TensorMeta((1024, 3072), "bfloat16", (3072, 1), "cuda:0")
    bias = TensorMeta((3072,), "bfloat16", (1,), "cuda:0")
    addmm = OpSignature("aten::addmm", "default", (bias, a, bt, 1, 1), (out,))
    assert table_key(addmm) == (("mm", "bfloat16"), (1024, 3072, 768))
    # a broadcasting add is not the measured same-shape add
    row = TensorMeta((768,), "bfloat16", (1,), "cuda:0")
    add = OpSignature("aten::add", "Tensor", (a, row, 1), (a,), frozenset({"pointwise"}))
    assert table_key(add) is None


def test_in_training_gemms_in_range(calibrated):
    """GEMMs of the GPT examples as torch.profiler timed them in real training steps on the H100
    (tests/data/groundtruth/examples; not used to build anything here): the calibrated ones
    within 10% at the median. (The analytical model scores 5.8% on the same shapes, having been
    tuned on profiles of this kind; the table's own gap estimate makes calibrated ~4% fast.)"""
    errs = []
    for path in EXAMPLE_PROFILES:
        for o in json.loads(path.read_text())["ops"]:
            if o["op"] != "aten::mm" or o["self_device_us"] <= 0:
                continue
            (m, k), (_k, n) = json.loads(o["shapes"])[:2]
            e = calibrated.estimate(mm_signature(m, n, k, "bfloat16"))
            if e.estimator == "calibrated":
                errs.append(abs(e.duration_ns / 1e3 / (o["self_device_us"] / o["count"]) - 1))
    assert len(errs) >= 20
    assert statistics.median(errs) < 0.10


# --- which estimator auto picks ---------------------------------------------------------------

def test_auto_uses_the_shipped_table_for_h100_only():
    assert choose_estimator("auto", lookup_gpu("h100"), cuda_probe=NO_GPU).estimator.name == "calibrated"
    for gpu in ("a100", "h200", "b200"):
        choice = choose_estimator("auto", lookup_gpu(gpu), cuda_probe=NO_GPU)
        assert choice.estimator.name == "analytical", gpu
        assert "no calibration table" in choice.description


def write_table(path: Path, device: str, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in [{"op": "device", "name": device}, *rows]))
    return path


A100_ROWS = [{"op": "mm", "M": s, "N": s, "K": s, "dtype": "bf16", "us": us}
             for s, us in ((2048, 40.0), (4096, 260.0), (8192, 2000.0))]


def test_a_calibration_file_serves_the_gpu_its_device_row_names(tmp_path):
    path = write_table(tmp_path / "a100.jsonl", "NVIDIA A100-SXM4-80GB", A100_ROWS)
    a100 = choose_estimator("auto", lookup_gpu("a100"), calibration=path, cuda_probe=NO_GPU)
    assert a100.estimator.name == "calibrated" and a100.calibration == path and not a100.notes
    e = a100.estimator.estimate(mm_signature(4096, 4096, 4096, "bfloat16"))
    assert e.estimator == "calibrated" and e.duration_ns == pytest.approx(260e3, abs=1)  # no floor: no gap
    # simulating an H100 with it: auto keeps the H100 table and says the file was not used
    h100 = choose_estimator("auto", lookup_gpu("h100"), calibration=path, cuda_probe=NO_GPU)
    assert h100.calibration == H100_CALIBRATION
    assert any("not used" in n for n in h100.notes)
    # asked for explicitly, it is used, and the note says the times come from another GPU
    forced = choose_estimator("calibrated", lookup_gpu("h100"), calibration=path, cuda_probe=NO_GPU)
    assert forced.calibration == path and any("not on the simulated" in n for n in forced.notes)


def test_choices_that_cannot_be_made():
    with pytest.raises(KernelTimesError, match="--calibration FILE"):
        choose_estimator("calibrated", lookup_gpu("a100"), cuda_probe=NO_GPU)
    with pytest.raises(KernelTimesError, match="needs a CUDA GPU"):
        choose_estimator("measured", lookup_gpu("h100"), cuda_probe=NO_GPU)
    with pytest.raises(KernelTimesError, match="use cpu, cuda or cuda:N"):
        choose_estimator("measured", lookup_gpu("h100"), measure_device="tpu", cuda_probe=NO_GPU)
    with pytest.raises(KernelTimesError, match="not used by --kernel-times analytical"):
        choose_estimator("analytical", lookup_gpu("h100"), calibration=H100_CALIBRATION, cuda_probe=NO_GPU)


# --- calibration files users hand in ----------------------------------------------------------

@pytest.mark.parametrize("lines, message", [
    (['{"op": "device", "name": "X"}', '{"op": "mm", "M": 1, "N": 1, "K": 1, "dtype": "bf16", "us": 1}', "{oops"],
     r"bad\.jsonl:3: not valid JSON"),
    (['{"op": "device", "name": "X"}', '{"op": "mm", "M": 64, "N": 64, "dtype": "bf16", "us": 3.0}'],
     r"bad\.jsonl:2: a \"mm\" row needs M, N, K, dtype, us; missing K"),
    (['{"op": "device", "name": "X"}', '{"op": "add", "n": 64, "dtype": "bf16", "us": -1}'],
     r"bad\.jsonl:2: \"us\" must be a positive number"),
    (['{"op": "device", "name": "X"}', '{"op": "add", "n": 64, "dtype": "int4", "us": 2}'],
     r"bad\.jsonl:2: dtype 'int4' is not one of bf16, fp16, fp32"),
    (['[1, 2]'], r"bad\.jsonl:1: expected a JSON object"),
    (['{"op": "mm", "M": 64, "N": 64, "K": 64, "dtype": "bf16", "us": 3.0}'], r"bad\.jsonl: no device row"),
    (['{"op": "device", "name": "X"}', '{"op": "conv", "us": 3.0}'], r"bad\.jsonl: no kernel measurements"),
])
def test_malformed_files_name_the_file_and_line(tmp_path, lines, message):
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(CalibrationFileError, match=message):
        read_calibration(path)


def test_missing_file(tmp_path):
    with pytest.raises(CalibrationFileError, match=r"calibration file .*nope\.jsonl does not exist"):
        read_calibration(tmp_path / "nope.jsonl")


def test_unknown_rows_are_skipped_and_counted(tmp_path):
    path = write_table(tmp_path / "t.jsonl", "X", [*A100_ROWS, {"op": "conv2d", "us": 5.0}])
    cal = read_calibration(path)
    assert cal.unknown_ops == {"conv2d": 1} and len(cal.measurements) == 3 and cal.lines == [2, 3, 4]


def test_a_tables_host_row_scales_the_host_cost_of_ops_not_their_kernels(tmp_path):
    """tiny_launch_host_us is what one small op costs the measured host; the host model's
    reference is the H100 host's 6.4 us (dispatch + launch). A host twice as slow doubles it."""
    from phantora.cost.host import HOST_COSTS

    reference_us = (HOST_COSTS.dispatch_ns + HOST_COSTS.launch_ns) / 1e3
    plain = write_table(tmp_path / "plain.jsonl", "NVIDIA A100-SXM4-80GB", A100_ROWS)
    slow = write_table(tmp_path / "slow.jsonl", "NVIDIA A100-SXM4-80GB",
                       [*A100_ROWS, {"op": "tiny_launch_host_us", "us": 2 * reference_us}])
    sig = mm_signature(4096, 4096, 4096, "bfloat16")
    a = choose_estimator("calibrated", lookup_gpu("a100"), calibration=plain, cuda_probe=NO_GPU)
    b = choose_estimator("calibrated", lookup_gpu("a100"), calibration=slow, cuda_probe=NO_GPU)
    ea, eb = a.estimator.estimate(sig), b.estimator.estimate(sig)
    assert eb.host_ns == 2 * ea.host_ns and eb.duration_ns == ea.duration_ns
    assert any("host costs of ops scaled x2.00" in n for n in b.notes) and not a.notes
    # the shipped H100 table measured its own host: the scale is that host's, within 1%
    h100 = choose_estimator("calibrated", lookup_gpu("h100"), cuda_probe=NO_GPU).estimator
    assert h100.host_scale == pytest.approx(1.0, abs=0.01)
