"""What the dashboard shows, as two JSON documents computed once when `phantora view` starts.

`/api/summary.json` is a `DashboardSummary`: the trace's `TraceSummary` (phantora.query.summary,
the code behind `phantora summary`) reshaped for display; no figure is computed here.
`/api/series.json` is a `DashboardSeries`: counters over time read with SQL from the loaded
trace (memory per rank and device, network link load, rollback instants), thinned out for drawing.
Times are milliseconds since simulation start; memory in bytes.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import orjson

from phantora.view.server import ViewUrls

if TYPE_CHECKING:
    from phantora.query import TraceDB
    from phantora.query.summary import TraceSummary

# A counter with more points than this is thinned for drawing (the peaks are kept; the peak
# figures themselves come from the summary, not from the thinned series).
MAX_POINTS_PER_SERIES = 2000


@dataclass
class RunInfo:
    gpu: str | None
    cluster: str | None
    nodes: int | None
    ranks: int
    command: str | None
    simulated_ms: float | None
    wall_seconds: float | None
    exit_code: int | None
    estimator: str | None


@dataclass
class StepView:
    """Overall steps: step N takes as long as the slowest rank's step N."""
    source: str  # "step markers", "nvtx ranges", "kernel periodicity" or "none"
    detail: str
    count: int  # steps found
    step_ms: list[float]
    steady_count: int  # steps the statistics cover (the first, warm-up, one left out)
    mean_ms: float | None
    median_ms: float | None
    min_ms: float | None
    max_ms: float | None


@dataclass
class RankView:
    rank: int
    label: str
    step_ms: list[float]
    mean_step_ms: float | None


@dataclass
class GpuView:
    rank: int
    device: int
    span_ms: float
    compute_ms: float
    comm_ms: float
    exposed_comm_ms: float
    idle_ms: float
    overlap_fraction: float | None
    tflops: float | None
    mfu: float | None


@dataclass
class Throughput:
    tflops: float | None  # all GPUs together
    mfu: float | None
    gpus: int
    peak: str  # which peak MFU is measured against


@dataclass
class MemoryPeakView:
    rank: int
    device: int
    allocated_bytes: float | None
    reserved_bytes: float | None


@dataclass
class KernelRow:
    name: str
    count: int
    total_ms: float
    share: float


@dataclass
class OpCount:
    name: str
    count: int


@dataclass
class Rollbacks:
    count: int
    stale_replies: int | None  # None: the trace does not record them


@dataclass
class DashboardSummary:
    file: str
    trace_url: str
    trace_bytes: int
    perfetto_deep_link: str | None
    run: RunInfo
    steps: StepView
    throughput: Throughput
    ranks: list[RankView]
    gpus: list[GpuView]
    memory: list[MemoryPeakView]
    top_kernels: list[KernelRow]
    rollbacks: Rollbacks
    unknown_ops: list[OpCount]
    warnings: list[str] = field(default_factory=list)  # e.g. the trace is truncated


@dataclass
class MemorySeries:
    rank: int
    device: int
    allocated: list[tuple[float, float]]  # (ms, bytes)
    reserved: list[tuple[float, float]]


@dataclass
class LinkSeries:
    name: str
    points: list[tuple[float, float, float]]  # (ms, utilization 0..1, GB/s)


@dataclass
class RollbackMark:
    ms: float
    name: str


@dataclass
class DashboardSeries:
    span_ms: float
    memory: list[MemorySeries] = field(default_factory=list)
    links: list[LinkSeries] = field(default_factory=list)
    rollbacks: list[RollbackMark] = field(default_factory=list)


@dataclass
class Dashboard:
    trace: Path
    summary: DashboardSummary
    series: DashboardSeries

    def api_documents(self, urls: ViewUrls) -> dict[str, bytes]:
        """Route name under /api/ -> JSON body."""
        summary = asdict(self.summary)
        summary["perfetto_deep_link"] = urls.perfetto
        return {"summary.json": orjson.dumps(summary, option=orjson.OPT_SERIALIZE_NUMPY),
                "series.json": orjson.dumps(asdict(self.series), option=orjson.OPT_SERIALIZE_NUMPY)}


def thin(points: list[tuple[float, ...]], limit: int = MAX_POINTS_PER_SERIES) -> list[tuple[float, ...]]:
    """At most about `limit` points of a step series (value held until the next point): per
    bucket of consecutive points, the first, the largest and the last, in time order, so
    peaks and the final level survive."""
    if len(points) <= limit:
        return points
    per = max(1, (len(points) * 3) // limit + 1)
    out: list[tuple[float, ...]] = []
    for i in range(0, len(points), per):
        bucket = points[i:i + per]
        keep = {0, max(range(len(bucket)), key=lambda j: bucket[j][1]), len(bucket) - 1}
        out.extend(bucket[j] for j in sorted(keep))
    return out


# Perfetto's JSON importer names a counter track "<counter name> <args key>".
_MEMORY_SQL = """
SELECT p.name AS process, t.name AS track, c.ts, c.value
FROM counter c JOIN process_counter_track t ON c.track_id = t.id JOIN process p ON t.upid = p.upid
WHERE t.name GLOB 'cuda:* memory allocated' OR t.name GLOB 'cuda:* memory reserved'
ORDER BY p.pid, t.name, c.ts
"""
_LINK_SQL = """
SELECT t.name AS track, c.ts, c.value
FROM counter c JOIN process_counter_track t ON c.track_id = t.id JOIN process p ON t.upid = p.upid
WHERE p.name = 'network' AND t.name GLOB 'link *'
ORDER BY t.name, c.ts
"""
_ROLLBACK_SQL = "SELECT ts, name FROM slice WHERE category = 'rollback' ORDER BY ts"
_SPAN_SQL = "SELECT max(ts + dur) FROM slice"

_RANK = re.compile(r"^rank (\d+)\b")
_MEMORY_TRACK = re.compile(r"^cuda:(\d+) memory (allocated|reserved)$")
_LINK_TRACK = re.compile(r"^link (.+) (utilization|GB/s)$")


def _ms(ns: float) -> float:
    return ns / 1e6


def read_series(db: TraceDB) -> DashboardSeries:
    """Counters over time, by SQL on Perfetto's tables (either query engine)."""
    simulated_ns = db.metadata.get("simulated_ns")
    span_ns = simulated_ns if isinstance(simulated_ns, (int, float)) else (db.query(_SPAN_SQL).scalar() or 0)

    memory: dict[tuple[int, int], dict[str, list[tuple[float, float]]]] = {}
    for process, track, ts, value in db.query(_MEMORY_SQL).rows:
        rank, kind = _RANK.match(process or ""), _MEMORY_TRACK.match(track)
        if rank and kind:
            key = (int(rank.group(1)), int(kind.group(1)))
            memory.setdefault(key, {"allocated": [], "reserved": []})[kind.group(2)].append((_ms(ts), value))

    links: dict[str, dict[int, list[float]]] = {}
    for track, ts, value in db.query(_LINK_SQL).rows:
        m = _LINK_TRACK.match(track)
        if m:
            point = links.setdefault(m.group(1), {}).setdefault(ts, [0.0, 0.0])
            point[0 if m.group(2) == "utilization" else 1] = value

    return DashboardSeries(
        span_ms=_ms(span_ns),
        memory=[MemorySeries(rank, device, thin(v["allocated"]), thin(v["reserved"]))
                for (rank, device), v in sorted(memory.items())],
        links=[LinkSeries(name, thin([(_ms(ts), u, gbps) for ts, (u, gbps) in sorted(points.items())]))
               for name, points in sorted(links.items())],
        rollbacks=[RollbackMark(_ms(ts), name) for ts, name in db.query(_ROLLBACK_SQL).rows],
    )


TOP_KERNELS = 15


def _opt_ms(ns: float | None) -> float | None:
    return None if ns is None else _ms(ns)


def _run_info(metadata: dict[str, Any], ranks: int) -> RunInfo:
    def pick(key: str, kind: type | tuple[type, ...]) -> Any:
        value = metadata.get(key)
        return value if isinstance(value, kind) and not isinstance(value, bool) else None

    command = metadata.get("command")
    simulated = pick("simulated_ns", (int, float))
    return RunInfo(gpu=pick("gpu", str), cluster=pick("cluster", str), nodes=pick("nodes", int), ranks=ranks,
                   command=" ".join(map(str, command)) if isinstance(command, list) else pick("command", str),
                   simulated_ms=_opt_ms(simulated), wall_seconds=pick("wall_seconds", (int, float)),
                   exit_code=pick("exit_code", int), estimator=pick("estimator", str))


def dashboard_summary(s: TraceSummary, metadata: dict[str, Any], rank_labels: dict[int, str], trace: Path,
                      warnings: list[str] | None = None) -> DashboardSummary:
    """The summary in the dashboard's units (ms), field for field: no figure is recomputed."""
    steps = s.steps
    stats = steps.stats
    by_rank = {r.rank: r for r in steps.per_rank}
    return DashboardSummary(
        file=trace.name,
        trace_url="/" + quote(trace.name),
        trace_bytes=trace.stat().st_size,
        perfetto_deep_link=None,
        run=_run_info(metadata, len(s.ranks)),
        steps=StepView(source=steps.source, detail=steps.detail, count=len(steps.overall_ns),
                       step_ms=[_ms(d) for d in steps.overall_ns], steady_count=stats.steps if stats else 0,
                       mean_ms=_opt_ms(stats.mean_ns) if stats else None,
                       median_ms=_opt_ms(stats.median_ns) if stats else None,
                       min_ms=_opt_ms(stats.min_ns) if stats else None,
                       max_ms=_opt_ms(stats.max_ns) if stats else None),
        throughput=Throughput(tflops=s.overall.tflops if s.overall else None, mfu=s.overall.mfu if s.overall else None,
                              gpus=s.overall.gpus if s.overall else 0, peak=s.peak),
        ranks=[RankView(rank=r, label=rank_labels.get(r, f"rank {r}"),
                        step_ms=[_ms(d) for d in by_rank[r].durations_ns] if r in by_rank else [],
                        mean_step_ms=_opt_ms(by_rank[r].stats.mean_ns) if r in by_rank and by_rank[r].stats else None)
               for r in s.ranks],
        gpus=[GpuView(rank=g.rank, device=g.device, span_ms=_ms(g.span_ns), compute_ms=_ms(g.compute_ns),
                      comm_ms=_ms(g.comm_ns), exposed_comm_ms=_ms(g.exposed_comm_ns), idle_ms=_ms(g.idle_ns),
                      overlap_fraction=g.overlap_fraction, tflops=g.tflops, mfu=g.mfu) for g in s.gpus],
        memory=[MemoryPeakView(m.rank, m.device, m.allocated_bytes, m.reserved_bytes) for m in s.memory],
        top_kernels=[KernelRow(k.name, k.count, _ms(k.total_ns), k.share) for k in s.top_kernels],
        rollbacks=Rollbacks(s.rollbacks, s.stale_replies),
        unknown_ops=[OpCount(name, count) for name, count in s.unknown_ops.items()],
        warnings=list(warnings or []),
    )


def _rank_labels(db: TraceDB) -> dict[int, str]:
    labels = {}
    for (name,) in db.query("SELECT name FROM process WHERE name LIKE 'rank %'").rows:
        m = _RANK.match(name or "")
        if m:
            labels[int(m.group(1))] = name
    return labels


def build_dashboard(trace: Path) -> Dashboard:
    """Load `trace` once and compute both documents (TraceFileError if it cannot be read)."""
    from phantora.query import load
    from phantora.query.summary import summarize

    with load(trace) as db:
        summary = summarize(db, top=TOP_KERNELS)
        warning = db.truncation_warning()
        return Dashboard(trace, dashboard_summary(summary, db.metadata, _rank_labels(db), trace,
                                                  [warning] if warning else []), read_series(db))
