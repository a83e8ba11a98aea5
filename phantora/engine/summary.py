"""EngineSummary: the run's totals, as `phantora trace` prints them and writes to the trace's
metadata (phantora/simulator/launch.py)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from phantora.engine.ranks import RankState
from phantora.engine.routing_log import RoutingDecision
from phantora.routing import imbalance


@dataclass
class EngineSummary:
    simulated_ns: int
    ranks: int
    ops: int
    kernels: int
    gpu_busy_ns: int
    flops: float
    peak_allocated: dict[tuple[int, int], int]  # (rank, device) -> bytes
    peak_reserved: dict[tuple[int, int], int]
    unknown_ops: dict[str, int]
    warnings: list[str]
    ooms: int = 0
    collectives: int = 0
    comm_busy_ns: int = 0
    rollbacks: int = 0
    stale_replies: int = 0
    largest_stale_error_ns: int = 0
    early_reads: int = 0  # collective ends a host waited for before they were final
    kernels_by_estimator: dict[str, int] = field(default_factory=dict)  # args.estimator label -> kernels
    mirrored: int = 0  # ranks mirrored from a representative (--ranks), not counted in `ranks`
    representatives: tuple[int, ...] = ()
    mirror_lag_ns: int = 0  # largest (a mirrored rank's collective end - its representative's end of it)
    mirror_lag_rank: int | None = None
    routing: list[dict] = field(default_factory=list)  # MoE layers' decisions (routing_layers)
    # this machine's Python benchmark (ms) as each rank measured it, in order (cost/host_bench.py)
    speed_probes: dict[int, list[float]] = field(default_factory=dict)


def simulated_end_ns(ranks: Iterable[RankState]) -> int:
    """When the last rank's host or GPU work ends."""
    return max((max(st.timeline.host_ns, st.timeline.gpu_end_ns()) for st in ranks), default=0)


def summarize(ranks: dict[int, RankState], unknown_ops: dict[str, int], warnings: list[str],
              kernels_by_estimator: dict[str, int], comm_busy_ns: int, rollbacks: int, stale_replies: int,
              largest_stale_error_ns: int, early_reads: int) -> EngineSummary:
    """Totals over ranks, with the engine-wide counts passed in."""
    peak_alloc, peak_res = {}, {}
    for r, st in ranks.items():
        for d, m in st.memory.items():
            peak_alloc[(r, d)] = m.peak_allocated
            peak_res[(r, d)] = m.peak_reserved
    states = ranks.values()
    return EngineSummary(
        simulated_ns=simulated_end_ns(states),
        ranks=len(ranks),
        ops=sum(st.ops for st in states),
        kernels=sum(st.kernels for st in states),
        gpu_busy_ns=sum(st.gpu_busy_ns for st in states),
        flops=sum(st.flops for st in states),
        peak_allocated=peak_alloc,
        peak_reserved=peak_res,
        unknown_ops=dict(unknown_ops),
        warnings=list(warnings),
        ooms=sum(len(st.ooms) for st in states),
        collectives=sum(st.collectives for st in states),
        comm_busy_ns=comm_busy_ns,
        rollbacks=rollbacks,
        stale_replies=stale_replies,
        largest_stale_error_ns=largest_stale_error_ns,
        early_reads=early_reads,
        kernels_by_estimator=dict(kernels_by_estimator),
        routing=routing_layers(ranks),
        speed_probes={r: list(st.timeline.speed_probes) for r, st in ranks.items() if st.timeline.speed_probes},
    )


def routing_layers(ranks: dict[int, RankState]) -> list[dict[str, Any]]:
    """Every layer's decisions, over the ranks that reported them (the latest counts of each):
    counts summed over those ranks, and the worst rank's imbalance (max/mean)."""
    merged: dict[tuple[int, int, int], list[RoutingDecision]] = {}
    for st in ranks.values():
        for key, d in st.routing.items():
            merged.setdefault(key, []).append(d)
    out = []
    for key in sorted(merged):
        ds = merged[key]
        total = [sum(c) for c in zip(*(d.counts for d in ds))]
        first = ds[0]
        entry: dict[str, Any] = {
            "layer": first.layer, "sub": first.sub, "name": first.name, "router": first.label,
            "experts": first.experts, "top_k": first.k, "ranks": len(ds),
            "tokens": sum(total) // max(first.k, 1),
            "max_over_mean": round(imbalance(total), 4),
            "worst_rank_max_over_mean": round(max(d.imbalance for d in ds), 4),
            "tokens_per_expert": total,
        }
        out.append(entry)
    return out
