"""MoE routing decisions the ranks report (R_ROUTING, interpose/values/routing.py): kept per rank
(RankState.routing) for the summary and the trace's metadata (summary.routing_layers), and drawn
as one counter per MoE layer in the rank's process (tokens routed to each expert, a series per
expert). Plain data and how to read it: imports no engine module."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from phantora.routing import imbalance

# A layer's counter has one series per expert up to this many experts; beyond, max/mean/min only
# (a counter with thousands of series is unreadable and large). The ranks report decisions over
# at most 4,096 choices (interpose/values/routing.py), whose counts the metadata lists in full.
COUNTER_SERIES_MAX = 256


@dataclass(frozen=True)
class RoutingDecision:
    """One router's choice in one rank: `counts[e]` of the tokens' k choices went to expert e."""

    layer: int
    sub: int  # 0, or the n-th other decision over as many experts in the same layer
    label: str
    experts: int
    k: int
    counts: tuple[int, ...]

    @property
    def name(self) -> str:
        return f"L{self.layer}" + (f".{self.sub}" if self.sub else "")

    @property
    def imbalance(self) -> float:
        return imbalance(self.counts)


def decision_from_record(rec: list[Any]) -> RoutingDecision:
    return RoutingDecision(int(rec[1]), int(rec[2]), str(rec[3]), int(rec[4]), int(rec[5]),
                           tuple(int(c) for c in rec[6]))


def counter_values(d: RoutingDecision) -> dict[str, float]:
    if d.experts <= COUNTER_SERIES_MAX:
        return {f"expert {e}": float(c) for e, c in enumerate(d.counts)}
    mean = sum(d.counts) / len(d.counts)
    return {"max": float(max(d.counts)), "mean": mean, "min": float(min(d.counts))}
