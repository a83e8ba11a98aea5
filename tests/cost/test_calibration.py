"""The analytical estimator against real H100 kernel times (shared/calibration).

Each calibration point times one launch between two CUDA events, which adds a launch gap:
torch.profiler kernel times of the same shapes on an H100 (tests/data/groundtruth/h100_kernel_profile.json) are
12-17 us shorter for cuBLAS GEMMs (2048^3 bf16: 24.4 us profiled, 36.3 us in the calibration
file). The model targets kernel time, so tolerances are stated per family with that in mind:
- points dominated by the method's floor are left out (measurements.floor_dominated);
- large GEMMs (>= 100 us): median error under 10%, every point within 25%, except the
  KNOWN_OUTLIERS below;
- mid-size points (the floor's 2x to ~100 us) still carry the gap: only their bias is bounded;
- memory-bound families within 25-35% (no L2 effects modelled); attention within 15% above
  200 us, 30% below (gap).
"""

from __future__ import annotations

import statistics

import pytest

from phantora.cost.measurements import Measurement, floor_dominated

# Points the model cannot and should not match, with why:
KNOWN_OUTLIERS = {
    # The M=4096 bf16 row at K <= 4096 reads 1.3-4x slower than its neighbours (4096x2048x4096
    # took 259 us, 4096x2048x8192 232 us; 4096x8192x256 225 us, 8192x8192x256 84 us) and than
    # torch.profiler on an H100 (4096x4096x256: 19.6 us profiled, 79.9 us here): a clock or
    # measurement event during that part of the sweep, not a shape effect.
    "mm 4096x8192x256 bf16",
    "mm 4096x2048x4096 bf16",
    "mm 4096x8192x512 bf16",
    "mm 4096x8192x1024 bf16",
    "mm 4096x4096x2048 bf16",
    # 0.23 ms for forward + autograd.grad at 16x12x512x64: autograd's host overhead is as long
    # as the kernels, so this times the host, not the GPU.
    "sdpa_fwd_bwd B16 H12 S512 D64",
    # 16 MiB pinned h2d measured at 30 GB/s while 1 MiB and 256 MiB reach 40 and 55 GB/s.
    "h2d_pinned 16777216 B",
}


def errors(estimator, measurements: list[Measurement], family: str, min_us: float = 0.0) -> dict[str, float]:
    out = {}
    for m, at_floor in zip(measurements, floor_dominated(measurements)):
        if m.family != family or at_floor or m.measured_ns < min_us * 1e3:
            continue
        if m.kind == "host":
            est = sum(estimator.estimate(s).host_ns for s in m.signatures)
        else:
            est = sum(estimator.estimate(s).duration_ns for s in m.signatures)
        out[m.label] = est / m.measured_ns - 1.0
    return out


def check(errs: dict[str, float], every: float, median: float | None = None) -> None:
    assert errs, "no calibration points for this family"
    kept = {k: e for k, e in errs.items() if k not in KNOWN_OUTLIERS}
    bad = {k: round(e, 3) for k, e in kept.items() if abs(e) > every}
    assert not bad, f"outside +-{every:.0%}: {bad}"
    if median is not None:
        assert statistics.median(abs(e) for e in kept.values()) <= median


@pytest.mark.parametrize("family", ["mm bf16", "mm fp32"])
def test_large_gemms(estimator, measurements, family):
    check(errors(estimator, measurements, family, min_us=100), every=0.25, median=0.10)


@pytest.mark.parametrize("family", ["mm bf16", "mm fp32"])
def test_mid_size_gemms_are_not_biased_beyond_the_timing_gap(estimator, measurements, family):
    errs = [e for k, e in errors(estimator, measurements, family).items() if k not in KNOWN_OUTLIERS]
    assert -0.40 < statistics.median(errs) < 0.05


def test_true_fp32_is_not_tensor_core_fp32(estimator, measurements):
    """fp32 4096^3 measured ~51 TFLOP/s: the estimate must stay near that, not near TF32's."""
    m = next(m for m in measurements if m.label == "mm 4096x4096x4096 fp32")
    e = estimator.estimate(m.signatures[0])
    assert e.flops / e.duration_ns * 1e-3 == pytest.approx(51.4, rel=0.1)  # TFLOP/s


def test_elementwise_bandwidth(estimator, measurements):
    check(errors(estimator, measurements, "elementwise"), every=0.30, median=0.15)
    # the largest transfers sit on the measured ~3.0 TB/s (bf16 gelu is ~6% slower than a copy:
    # its erf runs in fp32)
    large = errors(estimator, measurements, "elementwise", min_us=300)
    check({k: e for k, e in large.items() if not k.startswith("gelu") or "bf16" not in k}, every=0.08)
    # bf16 GELU follows the "gelu" curve fitted to the kernel sweep (phantora/cost/sweep_fit.py),
    # where it runs at 0.89-0.91 of add's rate (profiler, 134-201 MB); this table's 1 GB point
    # has it at 0.93: the two measurements disagree by ~5%
    check({k: e for k, e in large.items() if k.startswith("gelu") and "bf16" in k}, every=0.12)


def test_reduction(estimator, measurements):
    check(errors(estimator, measurements, "reduction"), every=0.35)


@pytest.mark.parametrize("family", ["layer_norm", "softmax"])
def test_normalization(estimator, measurements, family):
    errs = errors(estimator, measurements, family, min_us=50)  # 8192x768 sits at ~30 us
    check(errs, every=0.25)


@pytest.mark.parametrize("family", ["sdpa fwd", "sdpa fwd+bwd"])
def test_attention(estimator, measurements, family):
    check(errors(estimator, measurements, family, min_us=200), every=0.15)
    check(errors(estimator, measurements, family), every=0.30)


@pytest.mark.parametrize("family", ["copy h2d", "copy d2h", "copy d2d"])
def test_copies(estimator, measurements, family):
    check(errors(estimator, measurements, family, min_us=100), every=0.10)


def test_host_launch_cost(estimator, measurements):
    check(errors(estimator, measurements, "host launch"), every=0.05)


def test_outliers_are_still_in_the_data(measurements):
    """If the calibration data is re-measured, revisit KNOWN_OUTLIERS."""
    labels = {m.label for m in measurements}
    assert KNOWN_OUTLIERS <= labels
