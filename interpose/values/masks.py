"""Masks over data phantora does not hold: what fraction a comparison selects (docs/moe.md).

A virtual GPU holds no data, but phantora sees how some tensors were made. A `Draw` describes
every element of such memory as an independent draw from one distribution: randn and normal_
(normal), rand and uniform_ (uniform), randint and random_ (integers), and what negation,
scaling, shifting and abs make of them. Other data nothing is known about (activations) is
`Unknown`. A comparison with a constant makes a `Mask`: memory whose elements take one of two
values, `inside` on a set of cells of [0, 1) and `outside` elsewhere; which elements are inside
is a pure function of the mask's seed (from the generator's Philox offset at the draw) and each
element's index in its memory (`uniforms`, a counter-based hash, as the GPU's Philox draws are
a function of seed, offset and index). So a
mask holds a definite pattern without storing it: every op that reads the mask (nonzero, x[m],
masked_select, torch.where(m), sum, .tolist()) reads the same elements, from run to run, and
the pattern is materialized only when one does.

The selected fraction is the distribution's: `randn > 0` selects 1/2, `rand < p` p,
`normal_(m, s) > m + s` 1 - Phi(1), `bernoulli_(p)` and dropout's mask p and 1 - p. On Unknown
data a comparison the placeholder value passes (interpose/values/policy.py: activations read 1,
so `x > 0` passes and `x < 0` does not) selects the default fraction (phantora/mask_fraction.py,
`phantora trace --mask-fraction`), one it fails selects nothing: range checks and rejection
samplers (`while ((r < a) | (r > b)).any()`) see a healthy run, as before. Every test the value
passes selects the same elements of one tensor, so `(x > a) & (x < b)` selects the default too.

Comparisons of one tensor share its seed: `x > 1` lies inside `x > 0`, and `(r < a) | (r > b)`
is one mask of two cells. A pointwise op of masks with one seed and constants is again a mask
(`~m`, `m & n`, `m.float() * 2`, `torch.where(m, 1.0, 0.0)`) where it takes at most two values.

This module describes and evaluates; interpose/values/policy.py decides which ops make what.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Callable

import numpy as np

from phantora.mask_fraction import ENV, parse_mask_fraction

Number = bool | int | float | complex
Cells = tuple[tuple[float, float], ...]  # disjoint [lo, hi) intervals of [0, 1), sorted

STEPS_MAX = 8  # transforms kept on a draw; beyond, its data is unknown (a long chain is not a stand-in)


@dataclass(frozen=True)
class Draw:
    """Every element an independent draw: kind "normal" (a standard normal Z), "uniform"
    (U on [0, 1)) or "randint" (integers low <= X < high); then `steps`, applied in order:
    ("affine", scale, shift) is scale * x + shift, ("abs",) is |x| (normal and uniform only)."""

    kind: str
    seed: int
    steps: tuple[tuple, ...] = ()
    low: int = 0
    high: int = 0

    def then(self, step: tuple) -> Draw | None:
        if self.kind == "randint":
            return None
        steps = self.steps
        if step[0] == "affine" and steps and steps[-1][0] == "affine":  # fold a x + b into the last one
            _, a0, b0 = steps[-1]
            step, steps = ("affine", step[1] * a0, step[1] * b0 + step[2]), steps[:-1]
        if len(steps) >= STEPS_MAX:
            return None
        return Draw(self.kind, self.seed, (*steps, step))


@dataclass(frozen=True)
class Unknown:
    """Data nothing is known about; `seed` is fixed at its first comparison, so comparing the
    same memory again selects the same elements."""

    seed: int


@dataclass(frozen=True)
class Mask:
    """Elements read `inside` where their uniform (uniforms(seed, index)) falls in `cells`,
    `outside` elsewhere."""

    seed: int
    cells: Cells
    inside: Number
    outside: Number

    def fraction(self) -> float:
        return sum(hi - lo for lo, hi in self.cells)


# --- the default for unknown data -----------------------------------------------------------------
_default: tuple[str | None, float] | None = None


def unknown_fraction() -> float:
    """The fraction a passed comparison selects on unknown data (PHANTORA_MASK_FRACTION)."""
    global _default
    text = os.environ.get(ENV)
    if _default is None or _default[0] != text:
        _default = (text, parse_mask_fraction(text))
    return _default[1]


# --- seeds and the pattern -------------------------------------------------------------------------
_M64 = (1 << 64) - 1
_GAMMA = 0x9E3779B97F4A7C15


def _splitmix(z: int) -> int:
    z = (z + _GAMMA) & _M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    return z ^ (z >> 31)


def mix(*parts: int) -> int:
    """One 64-bit seed from several integers (order matters)."""
    z = 0
    for p in parts:
        z = _splitmix(z ^ (int(p) & _M64))
    return z


_CHUNK = 1 << 22


def uniforms(seed: int, index: np.ndarray) -> np.ndarray:
    """A uniform number in [0, 1) for each element index (int64), a pure function of (seed,
    index): splitmix64 of seed + (index + 1) * gamma, its top 53 bits."""
    out = np.empty(index.shape, dtype=np.float64)
    flat_in, flat_out = index.reshape(-1), out.reshape(-1)
    s, g = np.uint64(seed & _M64), np.uint64(_GAMMA)
    with np.errstate(over="ignore"):
        for start in range(0, flat_in.size, _CHUNK):
            z = flat_in[start:start + _CHUNK].astype(np.uint64)
            z += np.uint64(1)
            z *= g
            z += s
            z ^= z >> np.uint64(30)
            z *= np.uint64(0xBF58476D1CE4E5B9)
            z ^= z >> np.uint64(27)
            z *= np.uint64(0x94D049BB133111EB)
            z ^= z >> np.uint64(31)
            z >>= np.uint64(11)
            flat_out[start:start + _CHUNK] = z * (1.0 / (1 << 53))
    return out


def inside(mask: Mask, index: np.ndarray) -> np.ndarray:
    """Which elements (by index in the mask's memory) read `inside`."""
    sel = np.zeros(index.shape, dtype=bool)
    if not mask.cells or index.size == 0:
        return sel
    if mask.cells == ((0.0, 1.0),):
        sel[...] = True
        return sel
    u = uniforms(mask.seed, index)
    for lo, hi in mask.cells:
        sel |= (u >= lo) & (u < hi)
    return sel


# --- cells -----------------------------------------------------------------------------------------
def normalize(cells: list[tuple[float, float]]) -> Cells:
    """Clip to [0, 1), drop empty cells, merge overlapping and touching ones."""
    out: list[list[float]] = []
    for lo, hi in sorted((max(0.0, lo), min(1.0, hi)) for lo, hi in cells):
        if hi <= lo:
            continue
        if out and lo <= out[-1][1]:
            out[-1][1] = max(out[-1][1], hi)
        else:
            out.append([lo, hi])
    return tuple((lo, hi) for lo, hi in out)


def complement(cells: Cells) -> Cells:
    out, at = [], 0.0
    for lo, hi in cells:
        out.append((at, lo))
        at = hi
    out.append((at, 1.0))
    return normalize(out)


# --- comparisons -----------------------------------------------------------------------------------
COMPARISONS = ("gt", "ge", "lt", "le", "eq", "ne")
FLIPPED = {"gt": "lt", "ge": "le", "lt": "gt", "le": "ge", "eq": "eq", "ne": "ne"}
_INF = math.inf


def _line_set(op: str, c: float) -> list[tuple[float, float]]:
    """{x : x op c} as intervals of the real line (ends open or closed alike: the draws they
    are pulled back through are continuous, where a single point has no mass)."""
    if op in ("gt", "ge"):
        return [(c, _INF)]
    if op in ("lt", "le"):
        return [(-_INF, c)]
    if op == "eq":
        return []
    return [(-_INF, _INF)]  # ne


def _pull_back(intervals: list[tuple[float, float]], step: tuple) -> list[tuple[float, float]]:
    """{y : step(y) in intervals}."""
    out: list[tuple[float, float]] = []
    if step[0] == "affine":
        _, a, b = step
        for lo, hi in intervals:
            if a == 0:
                if lo <= b <= hi:
                    return [(-_INF, _INF)]
                continue
            y0, y1 = (lo - b) / a, (hi - b) / a
            out.append((min(y0, y1), max(y0, y1)))
        return out
    for lo, hi in intervals:  # abs
        if hi < 0:
            continue
        lo = max(lo, 0.0)
        out.extend([(lo, hi), (-hi, -lo)])
    return out


def _phi(z: float) -> float:
    if z == _INF:
        return 1.0
    if z == -_INF:
        return 0.0
    return 0.5 * (1.0 + math.erf(z / math.sqrt(2.0)))


def draw_cells(draw: Draw, op: str, c: float) -> Cells:
    """The cells of the draw's uniform in which `x op c` holds."""
    if draw.kind == "randint":
        n = draw.high - draw.low
        if n <= 0:
            return ()
        below = lambda k: min(max((k - draw.low) / n, 0.0), 1.0)  # P(X < k) for an integer k
        lt, le = below(math.ceil(c)), below(math.floor(c) + 1)  # P(X < c), P(X <= c)
        return normalize({"gt": [(le, 1.0)], "ge": [(lt, 1.0)], "lt": [(0.0, lt)], "le": [(0.0, le)],
                          "eq": [(lt, le)], "ne": [(0.0, lt), (le, 1.0)]}[op])
    intervals = _line_set(op, c)
    for step in reversed(draw.steps):
        intervals = _pull_back(intervals, step)
    cdf: Callable[[float], float] = _phi if draw.kind == "normal" else (lambda u: min(max(u, 0.0), 1.0))
    return normalize([(cdf(lo), cdf(hi)) for lo, hi in intervals])


def unknown_cells(passed: bool) -> Cells:
    """The cells a comparison on unknown data selects: the default fraction where the
    placeholder value passes it, none where it does not. Every passed test selects the same
    cells (the typical elements), so `(x > a) & (x < b)` selects the default fraction too."""
    return normalize([(0.0, unknown_fraction() if passed else 0.0)])


def pointwise(masks: list[Mask], evaluate: Callable[[list[Number]], Number]) -> Mask | None:
    """A pointwise op of masks with one seed (and constants): `evaluate` maps each mask's value
    in a cell to the op's value there. A mask again where the result takes at most two values."""
    seed = masks[0].seed
    edges = sorted({0.0, 1.0, *(e for m in masks for cell in m.cells for e in cell)})
    by_value: dict[Number, list[tuple[float, float]]] = {}
    order: list[Number] = []
    for lo, hi in zip(edges, edges[1:]):
        if hi <= lo:
            continue
        mid = (lo + hi) / 2
        v = evaluate([m.inside if any(a <= mid < b for a, b in m.cells) else m.outside for m in masks])
        if v not in by_value:
            if len(by_value) == 2:
                return None
            by_value[v] = []
            order.append(v)
        by_value[v].append((lo, hi))
    if len(order) == 1:
        return Mask(seed, ((0.0, 1.0),), order[0], order[0])
    first, second = order
    if first is True or (isinstance(first, (int, float)) and not isinstance(second, bool) and first != 0 and second == 0):
        first, second = second, first  # read True / the nonzero value as inside
    return Mask(seed, normalize(by_value[second]), second, first)
