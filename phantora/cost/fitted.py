"""The efficiency curves fitted to the H100 kernel sweep, as the family models use them.

sweep_fit.py fits them (`python -m phantora.cost.sweep_fit`; its docstring says what each form
means and how the curves carry over to other GPUs) and writes data/h100_sweep_fit.json; this
module reads that file once and times a kernel of one class:

    kernel_ns("bn_nchw_backward", nbytes, channels, gpu)

Every parameter is a fraction of one of the GPU's peaks or a fixed time, so the same curves serve
every GPU in phantora/hardware.py. How they scale from the H100 they were fitted on:
- `e` (stream, stream_l2, fixed, channel forms): a fraction of the GPU's achieved HBM bandwidth
  (GPUSpec.achieved_memory_bandwidth = datasheet HBM x memory_efficiency); where e < SM_BOUND_BELOW
  the kernel did not saturate the H100's DRAM, so it is a fraction of the SMs' streaming rate
  instead (sm_stream_bandwidth = SMs x boost clock x hardware.SM_BOUND_BYTES_PER_CLK): H200 (same
  132 SMs and clock, 4.8 TB/s) runs the bandwidth-bound kernels 1.43x faster (4.32 / 3.015 TB/s
  achieved: the same 0.90 of the datasheet, each measured with a large copy) and the SM-bound
  ones (depthwise NHWC, BatchNorm statistics, index_add) at the H100's speed; B200 (148 SMs,
  8 TB/s) runs the bandwidth-bound ones 2.26x faster and the SM-bound ones 148/132 = 1.12x;
- `b` (channel form): a fraction of one SM's streaming rate per channel block;
- "simt" `e`: a fraction of the fp32 SIMT peak (SMs x clock x 256 FLOP/clk for Hopper);
- "sm" `e`: a fraction of the SMs' streaming rate (sm_stream_bandwidth) whatever its value: for
  sizes that count operand bytes the SMs load (broadcast operands at the output's size), not
  DRAM bytes; such a kernel runs as fast on the H200 as on the H100;
- ramps, fixed costs and per-channel block costs (`c_ns` / SMs) in ns, the L2 term by the GPU's
  L2 size. Nothing here is measured on an H200 or B200: the scaling is the model's assumption.
The hand-set efficiencies of the other families go through the same rule (roofline.memory_ns
calls streaming_rate), and per-SM rates measured in items per ns are stated per clock
(roofline.sm_rate_per_ns). Which side of SM_BOUND_BELOW the families with the most bytes fall on,
from the sweep (tests/cost/test_sweep_fit.py checks it):
- multi-tensor-apply optimizers (optimizers.py): foreach AdamW over 148 x 1M and 30 x 16M fp32
  tensors ran 4,560 and 14,683 us against 4,420 and 14,311 at the full streaming rate (0.97 of
  it), SGD 0.93: DRAM-bound, so they scale with HBM. Fused AdamW (0.88 of it on the H100) is
  timed by its DRAM and SM terms together (optimizers.ADAM_CLK_PER_ELEMENT): the lent H200 ran it
  1.33x faster than the H100 in fp32, and SM-bound with bf16 states. Many tensors cost launches
  (launch_element_counts), not SM-bound bandwidth;
- casts and copies (copies.py, pointwise.cast, movement.py): same-dtype copies and the fp32 -> bf16
  casts (torch's vectorized bfloat16_copy_kernel: the RMSNorm cases' two per case, 135 us against
  136 at the full rate for 8192 x 4096) are DRAM-bound; every other dtype change runs torch's
  dynamic-casting unrolled kernel (class unrolled_cast: the two bf16 -> fp32 casts per case, 211 us
  against 136 at the full rate, e 0.66) and is SM-bound (an earlier reading of these figures
  compared all four casts' modelled time with the unrolled kernels' alone);
- torch's generic elementwise_kernel (a broadcast or non-dense operand; class elementwise_strided,
  "sm" form): SM-bound by construction, as fast on the H200 as on the H100;
- from the fit (data/h100_sweep_fit.json): the elementwise curve (e 0.99), GELU, BatchNorm's NCHW
  backward and NHWC elementwise passes, histc are DRAM-bound; BatchNorm's NCHW statistics and
  transform and NHWC statistics and backward reduction, depthwise NHWC, cuDNN's layout
  conversions, index_add, scatter_add, the embedding segments and MoE routing are SM-bound.
`using(classes)` swaps the parameters for a block (leave-one-out in benchmarks/bench_sweep_fit.py).
"""

from __future__ import annotations

import json
import math
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

FIT_FILE = Path(__file__).with_name("data") / "h100_sweep_fit.json"

# A kernel fitted at less than this fraction of the streaming rate does not saturate DRAM on the
# GPU it was fitted on (the H100): its limit is on the SM side, so its rate is that fraction of
# the SMs' streaming rate (GPUSpec.sm_stream_bandwidth), which more HBM bandwidth does not raise.
# (roofline.memory_ns calls streaming_rate: the same rule for the hand-set efficiencies.)
SM_BOUND_BELOW = 0.8


def streaming_rate(gpu, e: float) -> float:
    """Bytes/s of a kernel fitted at fraction `e` of the H100's streaming rate, on `gpu`."""
    if e < SM_BOUND_BELOW:
        return min(gpu.achieved_memory_bandwidth, gpu.sm_stream_bandwidth * e)
    return gpu.achieved_memory_bandwidth * e

# Each form's parameters; a class fits the ones it names in CLASSES, the rest keep DEFAULTS
# (ramp: the GPU's kernel_ramp_ns; no per-channel limit; no per-channel fixed cost).
FORMS = {"stream": ("ramp_ns", "e"), "stream_l2": ("ramp_ns", "e", "h"), "channel": ("ramp_ns", "e", "b", "c_ns"),
         "simt": ("ramp_ns", "e", "c_ns"), "fixed": ("fixed_ns", "e"), "sm": ("ramp_ns", "e")}
DEFAULTS = {"b": 1e9, "c_ns": 0.0, "h": 0.0}


def param(p: dict, name: str, gpu) -> float:
    if name in p:
        return p[name]
    if name == "ramp_ns":
        return float(gpu.kernel_ramp_ns)
    return DEFAULTS[name]


def curve_ns(form: str, p: dict, size: float, channels: int, gpu) -> float:
    """The time a class's curve gives for a kernel of `size` (bytes; FLOPs for "simt") over
    `channels` on `gpu`."""
    rate = streaming_rate(gpu, p["e"])
    ramp = param(p, "ramp_ns", gpu)
    if form == "stream":
        return ramp + size / rate * 1e9
    if form == "stream_l2":
        # a working set well inside L2 is partly served from it (the sweep's back-to-back
        # elementwise kernels read what the previous one wrote): a fraction h of the bytes of a
        # small set move at no HBM cost, fading as exp(-bytes / L2 size) as the set outgrows L2
        l2 = float(gpu.l2_cache_bytes)
        return ramp + size * (1 - min(param(p, "h", gpu), 0.95) * math.exp(-size / l2)) / rate * 1e9
    if form == "fixed":
        return p["fixed_ns"] + size / rate * 1e9
    if form == "sm":
        # SM-side work whatever e is: operand elements each loaded through the offset calculator
        # (broadcast reads are served from cache, so they cost issue slots, not DRAM bytes)
        return ramp + size / (gpu.sm_stream_bandwidth * p["e"]) * 1e9
    c = max(channels, 1)
    per_channel = c * param(p, "c_ns", gpu) / gpu.sm_count
    if form == "channel":
        per_sm = gpu.sm_stream_bandwidth / gpu.sm_count
        return ramp + size * (1 / rate + 1 / (c * param(p, "b", gpu) * per_sm)) * 1e9 + per_channel
    if form == "simt":
        return ramp + size / (gpu.peak_flops.get("fp32", 1e12) * p["e"]) * 1e9 + per_channel
    raise ValueError(form)



_classes: dict[str, dict] | None = None


def classes() -> dict[str, dict]:
    global _classes
    if _classes is None:
        _classes = json.loads(FIT_FILE.read_text())["classes"]
    return _classes


def kernel_ns(cls: str, size: float, channels: int, gpu) -> float:
    """Time of one kernel of class `cls` (size: bytes read + written, FLOPs for "simt" classes)."""
    p = classes()[cls]
    return curve_ns(p["form"], p, size, channels, gpu)


def efficiency(cls: str) -> float:
    """A class's fitted fraction `e` (of the GPU's streaming bandwidth, or fp32 rate for "simt")."""
    return classes()[cls]["e"]


@contextmanager
def using(fitted: dict[str, dict]) -> Iterator[None]:
    """Use these fitted classes (over the shipped ones) inside the block."""
    global _classes
    before = classes()
    _classes = {**before, **fitted}
    try:
        yield
    finally:
        _classes = before
