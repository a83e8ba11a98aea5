"""Which experts a Mixture-of-Experts router picks when the scores it picks from hold no data.

A virtual GPU has no values, so a router's `topk(scores, k)` cannot know which experts win. The
routing model decides it instead, from the command line (`phantora trace --routing ...`):

    balanced        every expert gets the same number of token choices; a remainder goes one
                    each to experts spread evenly over the expert numbers (the default)
    zipf:S          expert popularity p_e ~ 1 / rank^S (S > 0), a seeded shuffle of the ranks
                    per MoE layer
    dirichlet:A     p ~ Dirichlet(A, ..., A) (A > 0), drawn per MoE layer from the seed
    PATH.json       measured fractions per layer and expert (format below)

From the fractions a layer gets whole counts (`expert_counts`: N tokens x k choices, each expert
at most N since a token picks an expert once) and a token -> experts table (`assign_experts`)
in which every token has k distinct experts. The model is a pure function of (layer, N, E, k):
it does not depend on the rank or the step, so a recomputed forward (activation checkpointing)
routes as the first one did and ranks mirrored under `--ranks auto` route as their
representative. Routing does not change from step to step.

The file of measured fractions (JSON):

    {"layers": [[0.20, 0.05, ...], [...], ...],     one list of E fractions per MoE layer, in
                                                     the order the program's routers first run
     "default": [0.125, ...]}                        optional: layers past the end of "layers"

Each list is normalised to sum to 1 (its sum must be within 1% of 1). A program with more MoE
layers than the file lists and no "default" is an error. A decision over another number of
experts than its layer's list (a group-limited router first picks groups) is balanced, with a
warning. This module must not import torch.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

KINDS = ("balanced", "zipf", "dirichlet", "file")
ENV = "PHANTORA_ROUTING"  # the model's spec() in the rank processes' environment


class RoutingModelError(ValueError):
    """A --routing value or routing file that cannot be used; the message names the field."""


class ExpertCountMismatch(RoutingModelError):
    """A routing file's list for a layer has another length than the router's expert count (a
    group-limited router's choice of groups, say): that decision is balanced instead."""


@dataclass(frozen=True)
class RoutingModel:
    kind: str = "balanced"
    param: float | None = None  # zipf's exponent S or dirichlet's concentration A
    seed: int = 0
    path: str = ""  # the file's path (kind "file")
    layers: tuple[tuple[float, ...], ...] = ()  # per-layer fractions (kind "file"), normalised
    default: tuple[float, ...] | None = None  # fractions for layers past `layers` (kind "file")

    def describe(self) -> str:
        """One line for the summary and the trace's metadata."""
        if self.kind == "balanced":
            return "balanced (equal tokens per expert)"
        if self.kind == "zipf":
            return f"zipf:{self.param:g} (seed {self.seed}; popularity ~ 1/rank^{self.param:g}, shuffled per layer)"
        if self.kind == "dirichlet":
            return f"dirichlet:{self.param:g} (seed {self.seed}; per-layer fractions ~ Dirichlet({self.param:g}))"
        extra = " + default" if self.default is not None else ""
        return f"file {self.path} ({len(self.layers)} layers{extra})"

    def spec(self) -> str:
        """The text parse_routing reads back (how the rank processes receive the model)."""
        if self.kind == "balanced":
            return "balanced"
        if self.kind == "file":
            return f"{self.path}#seed={self.seed}"
        return f"{self.kind}:{self.param!r}#seed={self.seed}"

    def fractions(self, layer: int, experts: int) -> np.ndarray:
        """The share of token choices each of `experts` experts receives in MoE layer `layer`."""
        if experts < 1:
            raise RoutingModelError(f"a router over {experts} experts")
        if self.kind == "balanced":
            return np.full(experts, 1.0 / experts)
        if self.kind == "file":
            if layer < len(self.layers):
                p, where = self.layers[layer], f"layers[{layer}]"
            elif self.default is not None:
                p, where = self.default, "default"
            else:
                raise RoutingModelError(
                    f"routing file {self.path} lists {len(self.layers)} MoE layers and no \"default\"; the program "
                    f"routed tokens in MoE layer {layer} (counting from 0). Add fractions for it, or a \"default\" list.")
            if len(p) != experts:
                raise ExpertCountMismatch(
                    f"routing file {self.path}: {where} has {len(p)} fractions, but MoE layer {layer} of the program "
                    f"routes over {experts} experts")
            return np.asarray(p, dtype=np.float64)
        rng = np.random.default_rng([self.seed, layer, experts])
        if self.kind == "zipf":
            weights = 1.0 / np.arange(1, experts + 1, dtype=np.float64) ** float(self.param or 0.0)
            p = weights[rng.permutation(experts)]
        else:
            p = rng.dirichlet(np.full(experts, float(self.param or 1.0)))
        return p / p.sum()


def parse_routing(text: str, seed: int = 0) -> RoutingModel:
    """--routing's value: balanced, zipf:S, dirichlet:A or the path of a fractions file. A
    '#seed=N' suffix (from RoutingModel.spec) overrides `seed`."""
    text = text.strip()
    base, sep, tail = text.partition("#seed=")
    if sep:
        try:
            seed = int(tail)
        except ValueError:
            raise RoutingModelError(f"seed {tail!r} is not an integer") from None
        text = base
    if text in ("", "balanced"):
        return RoutingModel()
    name, colon, value = text.partition(":")
    if name in ("zipf", "dirichlet"):
        try:
            param = float(value) if colon else math.nan
        except ValueError:
            param = math.nan
        if not (param > 0 and math.isfinite(param)):
            example = "zipf:1.2" if name == "zipf" else "dirichlet:0.5"
            raise RoutingModelError(f"{name} needs a positive number after the colon, e.g. {example} (got {text!r})")
        return RoutingModel(name, param, seed)
    path = Path(text)
    if path.suffix.lower() != ".json" and not path.exists():
        raise RoutingModelError(f"{text!r} is not a routing model: use balanced, zipf:S, dirichlet:A or the path of "
                                "a .json file of per-layer expert fractions (docs/moe.md)")
    return load_routing_file(path, seed)


def load_routing_file(path: Path, seed: int = 0) -> RoutingModel:
    try:
        doc = json.loads(Path(path).read_text())
    except OSError as e:
        raise RoutingModelError(f"cannot read routing file {path}: {e.strerror or e}") from None
    except json.JSONDecodeError as e:
        raise RoutingModelError(f"routing file {path} is not valid JSON: {e}") from None
    if not isinstance(doc, dict):
        raise RoutingModelError(f"routing file {path}: expected an object with a \"layers\" list, got "
                                f"{type(doc).__name__}")
    unknown = sorted(set(doc) - {"layers", "default", "comment", "source"})
    if unknown:
        raise RoutingModelError(f"routing file {path}: unknown field {unknown[0]!r} (fields: layers, default, "
                                "comment, source)")
    layers = doc.get("layers")
    if not isinstance(layers, list) or not layers:
        raise RoutingModelError(f"routing file {path}: \"layers\" must be a non-empty list of per-layer lists of "
                                "expert fractions")
    parsed = tuple(_fractions(path, f"layers[{i}]", row) for i, row in enumerate(layers))
    default = _fractions(path, "default", doc["default"]) if "default" in doc else None
    return RoutingModel("file", None, seed, str(path), parsed, default)


def _fractions(path: Path, where: str, row: object) -> tuple[float, ...]:
    if not isinstance(row, list) or not row:
        raise RoutingModelError(f"routing file {path}: {where} must be a non-empty list of numbers")
    out = []
    for j, x in enumerate(row):
        if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x) or x < 0:
            raise RoutingModelError(f"routing file {path}: {where}[{j}] is {x!r}; fractions are numbers >= 0")
        out.append(float(x))
    total = sum(out)
    if not 0.99 <= total <= 1.01:
        raise RoutingModelError(f"routing file {path}: {where} sums to {total:.6g}; the fractions of a layer sum to 1")
    return tuple(x / total for x in out)


def expert_counts(fractions: np.ndarray, tokens: int, k: int) -> np.ndarray:
    """Whole token counts per expert: tokens * k in all, each at most `tokens` (a token picks an
    expert once), as close to fractions * tokens * k as that allows (largest remainders; ties to
    the lower expert number). Uniform fractions give the balanced split, whose remainder goes
    to experts spread evenly over the expert numbers."""
    p = np.asarray(fractions, dtype=np.float64)
    experts = len(p)
    if not 0 <= k <= experts:
        raise RoutingModelError(f"top-{k} routing over {experts} experts")
    total = tokens * k
    if total == 0:
        return np.zeros(experts, dtype=np.int64)
    if np.ptp(p) == 0:  # balanced: exact, without float rounding
        base, extra = divmod(total, experts)
        counts = np.full(experts, base, dtype=np.int64)
        counts[(np.arange(extra) * experts) // extra if extra else []] += 1
        return counts
    # Water-filling: experts whose share would exceed `tokens` are capped, the rest shared
    # among the others in proportion to their fractions.
    ideal = np.zeros(experts)
    capped = np.zeros(experts, dtype=bool)
    while True:
        free = ~capped
        left = total - tokens * capped.sum()
        weight = p[free].sum()
        ideal[capped] = tokens
        ideal[free] = p[free] / weight * left if weight > 0 else left / free.sum()
        over = free & (ideal > tokens)
        if not over.any():
            break
        capped |= over
    counts = np.floor(ideal).astype(np.int64)
    short = total - int(counts.sum())
    if short:
        room = counts < tokens
        order = np.lexsort((np.arange(experts), -(ideal - counts)))
        order = [e for e in order if room[e]]
        counts[order[:short]] += 1
    return counts


def assign_experts(counts: np.ndarray, tokens: int, k: int) -> np.ndarray:
    """A [tokens, k] table of expert ids with exactly counts[e] entries e and k distinct experts
    per token: choice j of token t is entry t + j * tokens of the experts listed in order, each
    repeated counts[e] times. An expert occupies at most `tokens` consecutive entries, so the
    k entries of one token (`tokens` apart) fall on k different experts."""
    counts = np.asarray(counts, dtype=np.int64)
    if int(counts.sum()) != tokens * k or (counts > tokens).any() or (counts < 0).any():
        raise RoutingModelError(f"counts {counts.tolist()} do not fit {tokens} tokens x top-{k}")
    listed = np.repeat(np.arange(len(counts), dtype=np.int64), counts)
    return listed.reshape(k, tokens).T.copy()


def imbalance(counts: list[int] | np.ndarray) -> float:
    """max / mean of per-expert token counts (1.0: perfectly balanced)."""
    c = np.asarray(counts, dtype=np.float64)
    mean = c.mean() if c.size else 0.0
    return float(c.max() / mean) if mean > 0 else 1.0
