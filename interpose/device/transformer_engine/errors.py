"""What the virtual `transformer_engine_torch` raises for what phantora does not model, and the
check every modelled function makes of an operand it takes in high precision only."""

from __future__ import annotations

from typing import Any

import torch

from interpose.runtime import rank_label


class NotModelledError(NotImplementedError):
    pass


def not_modelled(what: str) -> NotModelledError:
    return NotModelledError(
        f"phantora: rank {rank_label()}: Transformer Engine's {what} is not modelled by phantora's stand-in for "
        f"transformer_engine_torch (interpose/device/transformer_engine/extension.py), which models BF16/FP16, "
        f"per-tensor FP8 (delayed or current scaling) and MXFP8 GEMMs and grouped GEMMs, LayerNorm/RMSNorm, "
        f"activations, RoPE, BF16/FP16 attention and the optimizers' multi-tensor kernels. Use those "
        f"(e.g. the DelayedScaling, Float8CurrentScaling or MXFP8BlockScaling recipe), or add the kernel there "
        f"with a cost model in phantora/cost/transformer_engine.py.")


def plain(t: Any, what: str) -> torch.Tensor:
    """A high-precision tensor argument; a quantized one is not modelled here yet."""
    if type(t) is torch.Tensor or type(t) is torch.nn.Parameter or (
            isinstance(t, torch.Tensor) and not hasattr(t, "_quantizer")):
        return t
    raise not_modelled(f"{what} with a quantized ({type(t).__name__}) operand")
