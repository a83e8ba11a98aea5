"""Masks over data phantora does not hold (interpose/values/masks.py; issue 40, item 3).

In-process tests drive the value model the way the observer does (test_values._ValueMode) and
compare the fraction a comparison selects with what real torch draws select on the CPU (a
million elements, so its own error is ~0.0005). One traced script checks the whole path on a
virtual GPU with `--mask-fraction 0.25`: the option reaches the rank, draws keep their
distribution, every way of counting a mask agrees, masks follow the CUDA generator's state, and
the trace records the fraction."""

from __future__ import annotations

import json
import sys
from typing import Any, Callable

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from interpose.values import masks
from interpose.values import policy as values
from phantora.mask_fraction import ENV, MaskFractionError, parse_mask_fraction
from tests.virtual_gpu.harness import assert_ran, run_traced
from tests.virtual_gpu.test_values import _virtual

F = torch.nn.functional
N = 1 << 16  # elements per virtual mask: binomial error ~0.002 at p = 1/2
REAL_N = 1 << 20
TOLERANCE = 0.01


def _selected(m: torch.Tensor) -> float:
    """The fraction of a virtual mask's elements that read True (its pattern)."""
    data = values.host_data(m)
    assert data is not None, "the mask holds no pattern"
    return float(data.float().mean())


# (name, mask from a tensor factory `make(shape)` on the current device); run on virtual tensors and
# on real ones with the same code.
CASES: list[tuple[str, Callable[[], torch.Tensor]]] = [
    ("randn > 0", lambda n: torch.randn(n) > 0),
    ("randn > 1", lambda n: torch.randn(n) > 1),
    ("randn >= -0.5", lambda n: torch.randn(n) >= -0.5),
    ("randn_like < 2", lambda n: torch.randn_like(torch.empty(n)) < 2),
    ("normal_(2, 0.5) > 2.5", lambda n: torch.empty(n).normal_(2.0, 0.5) > 2.5),
    ("normal(3, 2) <= 0", lambda n: torch.normal(3.0, 2.0, (n,)) <= 0),
    ("rand < 0.3", lambda n: torch.rand(n) < 0.3),
    ("rand_like > 0.9", lambda n: torch.rand_like(torch.empty(n)) > 0.9),
    ("uniform_(-1, 3) < 0", lambda n: torch.empty(n).uniform_(-1.0, 3.0) < 0),
    ("randint(0, 10) < 3", lambda n: torch.randint(0, 10, (n,)) < 3),
    ("randint(10) <= 3", lambda n: torch.randint(10, (n,)) <= 3),
    ("randint(-5, 5) == 0", lambda n: torch.randint(-5, 5, (n,)) == 0),
    ("random_(0, 4) != 1", lambda n: torch.empty(n, dtype=torch.int64).random_(0, 4) != 1),
    ("bernoulli_(0.2) > 0", lambda n: torch.empty(n).bernoulli_(0.2) > 0),
    ("bernoulli(full(0.7))", lambda n: torch.bernoulli(torch.full((n,), 0.7)).bool()),
    ("dropout(ones, 0.1) > 0", lambda n: F.dropout(torch.ones(n), 0.1) > 0),
    ("-randn > 1", lambda n: -torch.randn(n) > 1),
    ("abs(randn) > 1", lambda n: torch.randn(n).abs() > 1),
    ("2 * randn + 1 <= 0", lambda n: 2 * torch.randn(n) + 1 <= 0),
    ("randn / 4 - 1 < -1.25", lambda n: torch.randn(n) / 4 - 1 < -1.25),
    ("1 - rand > 0.8", lambda n: 1 - torch.rand(n) > 0.8),
    ("randn[:, 0] > 0.5", lambda n: torch.randn(n, 4)[:, 0] > 0.5),
]


@pytest.mark.parametrize("name,make", CASES, ids=[c[0] for c in CASES])
def test_a_comparison_on_a_draw_selects_what_the_distribution_implies(name: str, make: Callable) -> None:
    torch.manual_seed(0)
    real = float(make(REAL_N).float().mean())
    got = _virtual(lambda: _selected(make(N)))
    assert abs(got - real) < TOLERANCE, f"{name}: phantora selects {got:.4f}, real draws {real:.4f}"


def test_randn_above_0_selects_half_and_rand_below_p_selects_p() -> None:
    assert abs(_virtual(lambda: _selected(torch.randn(N, 16) > 0)) - 0.5) < TOLERANCE
    for p in (0.01, 0.1, 0.25, 0.5, 0.9):
        assert abs(_virtual(lambda: _selected(torch.rand(N) < p)) - p) < TOLERANCE, p


@settings(max_examples=25, deadline=None)
@given(p=st.floats(0.0, 1.0), rows=st.integers(65, 3000), cols=st.integers(1, 8))
def test_every_way_of_counting_one_mask_agrees(p: float, rows: int, cols: int) -> None:
    """sum, count_nonzero, nonzero rows, x[m] rows, .tolist(), the complement: one pattern."""
    def run() -> dict[str, int]:
        x = torch.rand(rows, cols)
        m = x < p
        data = values.host_data(m)
        return {"sum": int(m.sum()), "count_nonzero": int(torch.count_nonzero(m)),
                "pattern": int(data.sum()), "tolist": sum(v for row in values.tolist_value(m) for v in row),
                "complement": rows * cols - int((~m).sum()), "or_not": int((m | ~m).sum()) - rows * cols +
                int(data.sum()), "float_mean": round(float(m.float().mean()) * rows * cols)}
    counts = _virtual(run)
    assert len(set(counts.values())) == 1, counts


def test_comparisons_of_one_draw_nest_and_views_are_independent() -> None:
    def run() -> tuple[torch.Tensor, ...]:
        x = torch.randn(N, 2)
        r = torch.empty(N).normal_(0.0, 0.02)
        return (values.host_data(x > 0), values.host_data(x > 1), values.host_data(x[:, 0] > 0),
                values.host_data(x[:, 1] > 0), values.host_data(x[:, 0] * 2 > 0), values.host_data(-x[:, 0] >= 0),
                values.host_data((r < -0.04) | (r > 0.04)))

    above0, above1, c0, c1, scaled, negated, outside = _virtual(run)
    assert int((above1 & ~above0).sum()) == 0, "x > 1 selected an element x > 0 did not"
    assert torch.equal(scaled, c0) and torch.equal(negated, ~c0), "2x > 0 / -x >= 0 select other elements than x > 0"
    both, one, out_of_range = float((c0 & c1).float().mean()), float(c0.float().mean()), float(outside.float().mean())
    assert abs(both - one * one) < TOLERANCE, (both, one)  # columns drawn independently
    assert abs(out_of_range - 0.0455) < TOLERANCE  # P(|Z| > 2)


def test_the_same_program_selects_the_same_elements() -> None:
    def run() -> torch.Tensor:
        values._fallback_draws = 0  # a fresh process (off CUDA, draws are counted)
        x = torch.randn(4096, 4)
        return values.host_data(x[:, 1] > 0.3)

    first, again = _virtual(run), _virtual(run)
    assert torch.equal(first, again) and 0 < int(first.sum()) < 4096


def test_unknown_data_selects_the_default_fraction_where_its_value_passes(monkeypatch: Any) -> None:
    def run() -> list[Any]:
        h = F.linear(torch.randn(N, 8), torch.ones(8, 8))  # activations: nothing known, value 1
        small = h[:8, 0]  # a few numbers a script steers by keep their value
        return [_selected(h > 0), _selected((h > 0) & (h < 2)), values.host_data(h < 0),
                values.host_data(h <= 0.5), bool((small > 0).all()), int((h[:, 0] > 0).sum())]

    above, band, fails, fails_too, small_all, rows = _virtual(run)
    assert abs(above - 0.5) < TOLERANCE and band == above, (above, band)
    assert fails is None and fails_too is None and small_all
    monkeypatch.setenv(ENV, "0.25")
    above, band, _, _, _, rows = _virtual(run)
    assert abs(above - 0.25) < TOLERANCE and band == above and abs(rows / N - 0.25) < 3 * TOLERANCE


def test_a_rejection_sampler_ends_without_making_its_masks() -> None:
    """nn.init.trunc_normal_ loops while any element is out of range: the first draw has some,
    the redraws read as the mean; any() of a large mask is answered without its pattern."""
    made: list[int] = []
    original = masks.inside

    def counting(mask: masks.Mask, index: np.ndarray) -> np.ndarray:
        made.append(index.size)
        return original(mask, index)

    def run() -> float:
        w = torch.empty(4096, 1024)
        torch.nn.init.trunc_normal_(w, std=0.02, a=-0.04, b=0.04)
        return float(w.abs().amax())

    masks.inside = counting
    try:
        assert _virtual(run) <= 0.04
    finally:
        masks.inside = original
    assert not made, f"patterns made: {made}"


def test_the_fraction_option_is_checked() -> None:
    assert parse_mask_fraction(None) == 0.5 and parse_mask_fraction("0.25") == 0.25
    for bad in ("half", "1.5", "-0.1", "nan"):
        with pytest.raises(MaskFractionError):
            parse_mask_fraction(bad)


def test_traced_masks_follow_the_option_the_generator_and_agree(tmp_path: Any) -> None:
    proc, out = run_traced(tmp_path, sys.executable, "values_masks.py", options=("--mask-fraction", "0.25"))
    assert_ran(proc, "option_reached_the_rank", "draws_keep_their_distribution", "counts_agree",
               "same_generator_state_same_mask", "next_draw_another_mask", "masks_do_not_follow_the_seed",
               "dropout_mask", "checkpoint_replays_masks")
    with open(out, "rb") as f:
        metadata = json.load(f)["metadata"]
    assert metadata["unknown_mask_fraction"] == 0.25
