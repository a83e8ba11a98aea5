"""The convolution model against torch.profiler times of examples/cnn_train.py on a real H100
(cuDNN 9, torch 2.11, fp16 autocast, channels_last): batch 128 x 128^2 and batch 64 x 64^2 images,
tests/data/groundtruth/examples/profile_cnn_*.json (self device time per aten op and input shapes,
summed over the run's 8 steps). Every expected time is read from those files.

What was fitted on what (phantora/cost/conv.py): CUDNN_KERNEL_FIXED_NS on the batch-64 convs,
UNALIGNED_CONV_BANDWIDTH_FRACTION on the batch-128 stem forward; the no-penalty main loop is the
ceiling the large batch-128 convs reach. Each test says which data it holds out.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from pathlib import Path

import pytest

from phantora.cost.conv import ConvShape, sampled_input_fraction
from phantora.ops import OpSignature, TensorMeta

DATA = Path(__file__).parents[1] / "data" / "groundtruth" / "examples"
TAGS = frozenset({"core"})


def _load(name: str) -> dict[tuple[str, str], float]:
    rows: dict[tuple[str, str], list[float]] = {}
    for r in json.loads((DATA / f"profile_{name}.json").read_text())["ops"]:
        acc = rows.setdefault((r["op"], r["shapes"]), [0, 0.0])
        acc[0] += r["count"]
        acc[1] += r["self_device_us"]
    return {k: us / n for k, (n, us) in rows.items() if n}


PROFILES = {"b128": _load("cnn_b128_img128"), "b64": _load("cnn_b64_img64")}
IMAGE = {"b128": (128, 128), "b64": (64, 64)}


def channels_last(shape: tuple[int, ...], dtype: str = "float16") -> TensorMeta:
    n, c, h, w = shape
    return TensorMeta(shape, dtype, (c * h * w, 1, w * c, c), "cuda:0")


@dataclass(frozen=True)
class Conv:
    """One conv of the example's ResNet-18: c_in -> c_out, k x k, stride, on an h x h input."""

    c_in: int
    c_out: int
    k: int
    stride: int
    h: int
    batch: int

    @property
    def pad(self) -> int:
        return self.k // 2

    @property
    def out_h(self) -> int:
        return (self.h + 2 * self.pad - self.k) // self.stride + 1

    @property
    def x(self) -> TensorMeta:
        return channels_last((self.batch, self.c_in, self.h, self.h))

    @property
    def w(self) -> TensorMeta:
        return channels_last((self.c_out, self.c_in, self.k, self.k))

    @property
    def y(self) -> TensorMeta:
        return channels_last((self.batch, self.c_out, self.out_h, self.out_h))

    def forward(self) -> OpSignature:
        s, p = (self.stride,) * 2, (self.pad,) * 2
        return OpSignature("aten::convolution", "default", (self.x, self.w, None, s, p, (1, 1), False, (0, 0), 1),
                           (self.y,), TAGS)

    def backward(self) -> OpSignature:
        s, p = (self.stride,) * 2, (self.pad,) * 2
        grad_input = self.c_in != 3  # the stem's input (the images) needs no gradient
        mask = (grad_input, True, False)
        return OpSignature("aten::convolution_backward", "default",
                           (self.y, self.x, self.w, (0,), s, p, (1, 1), False, (0, 0), 1, mask),
                           (self.x if grad_input else None, self.w, None), TAGS)

    def measured_forward_us(self, profile: str) -> float:
        shapes = [list(self.x.shape), list(self.w.shape)] + [[]] * 7
        return PROFILES[profile][("aten::cudnn_convolution", str(shapes))]

    def measured_backward_us(self, profile: str) -> float:
        shapes = [list(self.y.shape), list(self.x.shape), list(self.w.shape)] + [[]] * 8
        return PROFILES[profile][("aten::convolution_backward", str(shapes))]


def resnet_convs(profile: str) -> list[Conv]:
    batch, h = IMAGE[profile][0], IMAGE[profile][1]
    convs = [Conv(3, 64, 3, 1, h, batch), Conv(64, 64, 3, 1, h, batch)]
    c, size = 64, h
    for width in (128, 256, 512):
        convs += [Conv(c, width, 3, 2, size, batch), Conv(width, width, 3, 1, size // 2, batch),
                  Conv(c, width, 1, 2, size, batch)]
        c, size = width, size // 2
    return convs


def is_stem(c: Conv) -> bool:
    return c.c_in == 3


# cuDNN's heuristics pick algorithms the model does not know for these two (documented in
# conv.py's notes): the 1x1 stride-2 conv from 64 channels runs forward as an NCHW transpose plus
# a CUTLASS wgrad-style kernel (722.9 us at batch 128, ~80 modelled), and the stem's weight
# gradient an NCHW SIMT sgemm or CUTLASS kernel (502.7 / 297.6 us).
def known_difference(c: Conv, direction: str) -> bool:
    return (direction == "forward" and (c.c_in, c.c_out, c.k, c.stride) == (64, 128, 1, 2)) or \
        (direction == "backward" and is_stem(c))


def cases(profile: str, regular_only: bool = True) -> list[tuple[Conv, str, float, float]]:
    """(conv, direction, predicted us, measured us) for every conv of the step."""
    from phantora.cost.analytical import AnalyticalEstimator
    from phantora.hardware import lookup_gpu

    est = AnalyticalEstimator(lookup_gpu("h100"))
    out = []
    for c in resnet_convs(profile):
        for direction in ("forward", "backward"):
            if regular_only and (known_difference(c, direction) or is_stem(c)):
                continue
            sig = c.forward() if direction == "forward" else c.backward()
            real = c.measured_forward_us(profile) if direction == "forward" else c.measured_backward_us(profile)
            out.append((c, direction, est.estimate(sig).duration_ns / 1e3, real))
    return out


def test_every_conv_of_the_step_is_in_the_profiles():
    for profile in PROFILES:
        assert len(cases(profile, regular_only=False)) == 2 * 11


def test_large_convs_run_their_main_loop_at_the_gemm_rate():
    """Batch 128, 3x3 stride-1 convs with 128-512 channels: 690-790 TFLOP/s measured, as fast as
    the best GEMMs. The old 15% im2col penalty put them 21-29% (forward) above the profile."""
    for c, direction, pred, real in cases("b128"):
        if c.k == 3 and c.stride == 1 and c.c_in >= 128:
            assert 0.9 < pred / real < 1.15, (c, direction, pred, real)


@pytest.mark.parametrize("profile,total_bound,median_bound", [
    ("b128", 0.03, 0.08),  # held out: CUDNN_KERNEL_FIXED_NS was fitted on batch 64 (-0.7%, 5.7%)
    ("b64", 0.10, 0.15),  # the fit set (-7.5%, 13.1%)
])
def test_regular_convs_of_a_resnet_step(profile, total_bound, median_bound):
    """Forward and backward of every distinct conv of the step but the stem and the known cuDNN
    choices (19 ops): the error of their summed time and the median per-op error."""
    rows = cases(profile)
    total_pred, total_real = sum(p for *_, p, _ in rows), sum(r for *_, r in rows)
    median = statistics.median(abs(p / r - 1) for *_, p, r in rows)
    assert abs(total_pred / total_real - 1) < total_bound, (total_pred, total_real)
    assert median < median_bound, median


def test_stem_conv_with_three_channels_is_a_slow_gather():
    """3 fp16 channels (6 bytes per pixel) do not fill the 16-byte vectors of the tensor-core
    kernels: the forward runs at ~1 TB/s. Fitted at batch 128, held out at batch 64."""
    from phantora.cost.analytical import AnalyticalEstimator
    from phantora.hardware import lookup_gpu

    est = AnalyticalEstimator(lookup_gpu("h100"))
    for profile, bound in (("b128", 0.05), ("b64", 0.2)):
        stem = resnet_convs(profile)[0]
        ratio = est.estimate(stem.forward()).duration_ns / 1e3 / stem.measured_forward_us(profile)
        assert abs(ratio - 1) < bound, (profile, ratio)


def test_known_differences_are_still_underestimated():
    """If a model change starts to cover these cuDNN choices, move them out of known_difference."""
    for profile in PROFILES:
        for c, direction, pred, real in cases(profile, regular_only=False):
            if known_difference(c, direction):
                assert pred < 0.7 * real, (profile, c, direction, pred, real)


def test_strided_backward():
    """Backward of the six stride-2 convs, both configurations: within -30%..+10%. With one GEMM
    per input phase (cuDNN's strided dgrad) the 3x3 ones went from -9..-36% to -6..-27%; the 1x1
    ones read their whole input in the weight gradient (-20..+8%). The rest of the 3x3 gap is not
    explained yet."""
    for profile in PROFILES:
        for c, direction, pred, real in cases(profile):
            if direction == "backward" and c.stride == 2:
                assert 0.7 < pred / real < 1.1, (profile, c, pred, real)


def test_strided_dgrad_phases():
    """A 3x3 stride-2 conv's data gradient: four input phases reached by 4, 2, 2 and 1 taps; a 1x1
    stride-2 conv's: one phase with its tap, three that only get zeros. FLOPs are unchanged."""
    three = ConvShape(8, 64, 128, 1, (32, 32), (16, 16), (3, 3), False)
    phases = three.grad_input_phase_gemms((2, 2))
    assert sorted(g.k // 128 for g in phases) == [1, 2, 2, 4]
    assert all(g.m == 8 * 16 * 16 and g.n == 64 for g in phases)
    assert sum(g.flops for g in phases) == three.grad_input_gemm().flops
    one = ConvShape(8, 64, 128, 1, (32, 32), (16, 16), (1, 1), False)
    assert sorted(g.k for g in one.grad_input_phase_gemms((2, 2))) == [0, 0, 0, 128]


def test_a_kernel_smaller_than_its_stride_reads_a_fraction_of_the_input():
    assert sampled_input_fraction(ConvShape(8, 64, 128, 1, (32, 32), (16, 16), (1, 1), False)) == 0.25
    assert sampled_input_fraction(ConvShape(8, 64, 128, 1, (32, 32), (16, 16), (3, 3), False)) == 1.0


def test_channels_last_elementwise_ops_use_the_vectorized_kernel():
    """The profile runs the NHWC relu / add / threshold_backward in vectorized_elementwise_kernel."""
    from phantora.cost.analytical import AnalyticalEstimator
    from phantora.hardware import lookup_gpu

    kernels = json.loads((DATA / "profile_cnn_b128_img128.json").read_text())["kernels"]
    assert any(k["name"].startswith("void at::native::vectorized_elementwise_kernel<8, at::native::CUDAFunctor_add")
               for k in kernels)
    x = channels_last((128, 64, 128, 128))
    add = OpSignature("aten::add", "Tensor", (x, x), (x,), frozenset({"core", "pointwise"}))
    assert AnalyticalEstimator(lookup_gpu("h100")).estimate(add).kernel_name == "vectorized_elementwise_kernel"
