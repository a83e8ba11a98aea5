"""Each GPU model is derived from its own published figures (phantora/hardware.py)."""

from __future__ import annotations

import dataclasses

import pytest

from phantora.hardware import GPUS, HOPPER_SM, TENSOR_TYPES, lookup_gpu

# Dense datasheet peaks in TFLOP/s (vendor datasheets named in each entry's sources), typed here
# independently of the table so a wrong clock or per-SM rate shows.
DATASHEET_TFLOPS = {
    "h100-sxm-80gb": {"bf16": 989.4, "tf32": 494.7, "fp32": 66.9, "fp8": 1978.9},
    "h200-sxm-141gb": {"bf16": 989.4, "tf32": 494.7, "fp32": 66.9, "fp8": 1978.9},
    # TorchTitan's 500 W H100s: the SXM die's datasheet peaks; its power limit is in the efficiency
    "h100-sxm-96gb-500w": {"bf16": 989.4, "tf32": 494.7, "fp32": 66.9, "fp8": 1978.9},
    "a100-sxm-80gb": {"bf16": 312.0, "tf32": 156.0, "fp32": 19.5, "int8": 624.0},
    "b200-sxm-180gb": {"bf16": 2250.0, "fp8": 4500.0, "fp32": 75.0},
}
DATASHEET_HBM_TBPS = {"h100-sxm-80gb": 3.35, "h100-sxm-96gb-500w": 2.4, "h200-sxm-141gb": 4.8, "a100-sxm-80gb": 2.039, "b200-sxm-180gb": 8.0}


@pytest.mark.parametrize("gpu", GPUS, ids=[g.key for g in GPUS])
def test_peaks_are_sms_times_clock_times_per_sm_rate_and_match_the_datasheet(gpu):
    for ct, tflops in DATASHEET_TFLOPS[gpu.key].items():
        clock = gpu.tensor_clock_mhz if ct in TENSOR_TYPES else gpu.boost_clock_mhz
        assert gpu.peak_flops[ct] == gpu.sm_count * gpu.flops_per_clk_per_sm[ct] * clock * 1e6
        assert gpu.peak_flops[ct] / 1e12 == pytest.approx(tflops, rel=0.005), (gpu.key, ct)
    assert gpu.hbm_bandwidth / 1e12 == pytest.approx(DATASHEET_HBM_TBPS[gpu.key])


@pytest.mark.parametrize("gpu", GPUS, ids=[g.key for g in GPUS])
def test_every_entry_states_its_sources_and_published_figures(gpu):
    assert gpu.sources and all(s.strip() for s in gpu.sources)
    assert gpu.sm_count > 0 and gpu.l2_cache_bytes > 0 and gpu.power_limit_w > 0
    assert 0 < gpu.tensor_clock_mhz <= gpu.boost_clock_mhz
    assert 0 < gpu.memory_efficiency <= 1 and 0 < gpu.gemm_efficiency <= 1


def test_h100_and_h200_share_one_hopper_sm_and_differ_in_memory():
    h100, h200 = lookup_gpu("h100"), lookup_gpu("h200")
    assert h100.flops_per_clk_per_sm is HOPPER_SM and h200.flops_per_clk_per_sm is HOPPER_SM
    assert h100.peak_flops == h200.peak_flops
    assert h200.hbm_bandwidth / h100.hbm_bandwidth == pytest.approx(4.8 / 3.35)
    assert h200.l2_cache_bytes > h100.l2_cache_bytes


def test_a_power_limited_variant_is_one_replace_of_its_base():
    h100 = lookup_gpu("h100")
    variant = dataclasses.replace(h100, key="h100-test-500w", aliases=(), power_limit_w=500, tensor_clock_mhz=1600)
    assert variant.peak_flops["bf16"] == pytest.approx(h100.peak_flops["bf16"] * 1600 / 1830)
    assert variant.peak_flops["fp32"] == h100.peak_flops["fp32"]  # SIMT peaks at the boost clock
    assert h100.peak_flops["bf16"] / 1e12 == pytest.approx(989.4, rel=1e-3)  # the base is untouched


def test_the_500w_h100_sustains_the_power_interpolated_peak():
    """TorchTitan's published H100s (96 GB, 500 W): BF16 dense interpolated in power between the
    SXM (989.4 TFLOP/s at 700 W) and the NVL (835 at 400 W) datasheets: 835 + 154.4 / 3 = 886.5."""
    h100, h500 = lookup_gpu("h100"), lookup_gpu("h100-96gb")
    sustained = h500.peak_flops["bf16"] * h500.gemm_efficiency / h100.gemm_efficiency
    assert sustained / 1e12 == pytest.approx(886.5, rel=1e-3)
    assert h500.total_memory > 95 * 1024**3 and h500.hbm_bandwidth == 2.4e12
