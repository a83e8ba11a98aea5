"""The fraction of elements a comparison selects on data phantora knows nothing about.

A virtual GPU holds no data. For tensors phantora saw drawn (randn, rand, normal_, uniform_,
randint, bernoulli_, dropout) the fraction a comparison with a constant selects follows from the
distribution (interpose/values/masks.py); for other data (activations, weights after an update)
it is this default, set with `phantora trace --mask-fraction F` (or PHANTORA_MASK_FRACTION), 0.5
unless set: `x[x > 0]` over activations selects half the rows. docs/moe.md explains where it
applies. This module must not import torch.
"""

from __future__ import annotations

import math

ENV = "PHANTORA_MASK_FRACTION"  # the fraction, in the rank processes' environment
DEFAULT = 0.5


class MaskFractionError(ValueError):
    """A --mask-fraction / PHANTORA_MASK_FRACTION value that is not a number in [0, 1]."""


def parse_mask_fraction(text: str | float | None) -> float:
    """The fraction text names (None or empty: DEFAULT)."""
    if text is None or (isinstance(text, str) and not text.strip()):
        return DEFAULT
    try:
        f = float(text)
    except ValueError:
        raise MaskFractionError(f"mask fraction {text!r} is not a number (give one in [0, 1], e.g. 0.5)") from None
    if not (0.0 <= f <= 1.0) or math.isnan(f):
        raise MaskFractionError(f"mask fraction {text!r} is outside [0, 1]")
    return f
