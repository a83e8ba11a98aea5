"""One-off start-up costs on a rank's host (phantora/cost/startup.py), most paid once per key:
charged to the host clock and drawn as a "start-up: ..." slice naming its source."""

from __future__ import annotations

from typing import Any

from phantora.cost.startup import StartupCost
from phantora.engine.ranks import RankState
from phantora.engine.trace_events import TraceEvents


def pay_once(st: RankState, trace: TraceEvents, key: tuple[Any, ...], cost: StartupCost, ns: int | None = None,
             args: dict[str, Any] | None = None) -> None:
    """Charge `cost` (or `ns` of it) the first time this rank meets `key`."""
    if key in st.startup_paid or not st.timeline.config.startup_costs:
        return
    st.startup_paid.add(key)
    pay(st, trace, cost, ns, args)


def pay(st: RankState, trace: TraceEvents, cost: StartupCost, ns: int | None = None,
        args: dict[str, Any] | None = None) -> None:
    """Charge `cost` (or `ns` of it) now, if start-up costs are charged at all."""
    if not st.timeline.config.startup_costs:
        return
    tl = st.timeline
    begin = tl.host_ns
    tl.charge_host(cost.ns if ns is None else ns, "start-up")
    trace.host_slice(st.info.trace_pid, f"start-up: {cost.name}", begin, tl.host_ns, "startup",
                     {**(args or {}), "when": cost.when, "source": cost.source})
