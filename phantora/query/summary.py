"""`phantora summary`: what a trace says about a training run, computed with SQL on a TraceDB
(only tables and functions trace_processor has too, so either engine answers).

- Step times per rank, from the first source that has them: step markers ("ProfilerStep#N"
  slices on each rank's "steps (optimizer.step)" thread); else nvtx ranges that repeat (the
  most frequent name at the outermost nvtx depth, each range's duration); else the kernel
  sequence's period (the rarest kernel name that recurs at a constant kernel-count spacing;
  time between its occurrences). Statistics leave out the first step, which also holds the
  program's setup (model construction, the copy to the GPU) and warm-up. Overall step N is the
  slowest rank's step N.
- The steady state: when a rank has two steps or more, everything below is measured over its
  steps after the first (the GPU work launched from the end of its first step to the end of its
  last: a step's kernels run after its host has moved on), so MFU, the
  GPU time breakdown and kernel shares agree with the step times the script prints; otherwise
  over the rank's whole active span. `TraceSummary.window` states which.
- Per GPU, over the ops of that window (the ops launched in it; else all), first to last: compute = union of non-NCCL kernels
  and copies; comm = union of NCCL kernels (names starting "ncclDevKernel", or kernels on an
  "nccl" stream); exposed comm = comm not overlapped by compute; idle = the rest of the span;
  overlap = the fraction of comm that compute overlaps.
- Top kernels by total GPU time; achieved TFLOP/s (kernel args.flops over the span) and MFU
  against the GPU's dense bf16 peak from phantora/hardware.py; peak memory from the
  "cuda:D memory" counters; rollbacks (simulator instants), stale replies (metadata), and
  kernels whose estimator says "unknown op".
"""

from __future__ import annotations

import re
import statistics
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from phantora.hardware import GPUSpec, UnknownGPUError, lookup_gpu
from phantora.query.db import TraceDB

STEP_THREAD = "steps (optimizer.step)"
STEP_PREFIX = "ProfilerStep#"
GPU_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")
NCCL_PREFIX = "ncclDevKernel"
PEAK_DTYPE = "bf16"

_RANK_NAME = re.compile(r"^rank (\d+)\b")
_DEVICE = re.compile(r"^cuda:(\d+)\b")
_MEMORY_TRACK = re.compile(r"^cuda:(\d+) memory (allocated|reserved)$")
_GPU_IN_NAME = re.compile(r"·\s*([^·]+?)\s*$")


@dataclass
class StepStats:
    """Over the steps after the first (all of them when there is only one)."""

    steps: int
    mean_ns: float
    median_ns: float
    min_ns: int
    max_ns: int

    @classmethod
    def of(cls, durations: list[int]) -> StepStats | None:
        steady = durations[1:] or durations
        if not steady:
            return None
        return cls(len(steady), statistics.fmean(steady), statistics.median(steady), min(steady), max(steady))


@dataclass
class RankSteps:
    rank: int
    durations_ns: list[int]
    stats: StepStats | None


@dataclass
class StepTimes:
    source: str  # "step markers", "nvtx ranges", "kernel periodicity" or "none"
    detail: str  # what exactly: the nvtx range's or anchor kernel's name
    per_rank: list[RankSteps] = field(default_factory=list)
    overall_ns: list[int] = field(default_factory=list)
    stats: StepStats | None = None
    # rank -> (start, end) of its steps after the first: the steady state the other figures use
    windows: dict[int, tuple[int, int]] = field(default_factory=dict)


@dataclass
class GpuBreakdown:
    rank: int
    device: int
    span_start_ns: int
    span_end_ns: int
    span_ns: int
    compute_ns: int
    comm_ns: int
    exposed_comm_ns: int
    idle_ns: int
    overlap_fraction: float | None  # of comm time, the part compute overlaps
    flops: float
    tflops: float | None  # achieved, over the span
    mfu: float | None


@dataclass
class OverallBreakdown:
    gpus: int
    window_ns: int  # earliest GPU op start to latest end, any GPU
    span_ns: int  # GPU time: the sum of the GPUs' spans, = compute + exposed comm + idle
    compute_ns: int  # sums over GPUs
    comm_ns: int
    exposed_comm_ns: int
    idle_ns: int
    overlap_fraction: float | None
    flops: float
    tflops: float | None  # all GPUs together, over the window
    mfu: float | None  # tflops / (gpus x peak)


@dataclass
class KernelStat:
    name: str
    count: int
    total_ns: int
    share: float  # of all GPU op time


@dataclass
class MemoryPeak:
    rank: int
    device: int
    allocated_bytes: float | None
    reserved_bytes: float | None


@dataclass
class RoutingLayer:
    """One MoE layer's routing decision, as the trace's metadata (moe_routing) records it."""
    name: str  # "L3", or "L3.1" for a layer's second decision over the same experts
    router: str
    experts: int
    top_k: int
    tokens: int  # tokens routed, summed over the ranks that reported the layer
    ranks: int
    max_over_mean: float  # tokens per expert summed over ranks: max / mean
    worst_rank_max_over_mean: float


def _routing(db: TraceDB) -> tuple[str | None, list[RoutingLayer]]:
    meta = db.metadata.get("moe_routing")
    if not isinstance(meta, dict):
        return None, []
    layers = []
    for d in meta.get("layers") or []:
        try:
            layers.append(RoutingLayer(str(d["name"]), str(d["router"]), int(d["experts"]), int(d["top_k"]),
                                       int(d["tokens"]), int(d["ranks"]), float(d["max_over_mean"]),
                                       float(d["worst_rank_max_over_mean"])))
        except (KeyError, TypeError, ValueError):
            continue  # a field this version does not know how to read: the layer is left out
    model = meta.get("model")
    return (model if isinstance(model, str) else None), layers


# How a rank's host spent its time (phantora/engine/timeline.py RankTimeline.spent), in the
# ProfilerStep slices' args as "host <use> ns"; the uses that are waits, not host work:
HOST_WAITS = {"wait": "waiting for the GPU", "data loading": "waiting for DataLoader workers"}
HOST_USES = {"python": "Python (measured)", "python (modelled)": "Python (modelled)",
             "op C++": "ops' C++: bindings, autograd (modelled)", "launch": "dispatch and launches (modelled)",
             "start-up": "start-up costs", "compile": "compiling (torch.compile, Triton)", "sleep": "sleeps"}
# the program's Python as each --host-time mode charges it ("python" above is the measured one's)
PYTHON_USE = {"counted": "Python (counted)", "measured": "Python (measured)"}


@dataclass
class HostTime:
    """How the slowest rank's host spent the steps after the first (the first when it is the only
    one), and the start-up costs of its first step, largest first."""
    rank: int
    steps: int
    per_step_ns: dict[str, float]  # use (HOST_USES, HOST_WAITS keys) -> mean ns per step
    bound: str  # "host-bound", "GPU-bound" or "loading-bound"
    first_step_startup: list[tuple[str, int, int]]  # (what, how many, ns), largest first
    mode: str | None  # phantora trace --host-time (None: not recorded)


def _host_time(db: TraceDB, ranks: dict[int, int], steps: StepTimes) -> HostTime | None:
    rows = db.query(f"SELECT th.upid, s.ts, s.dur, a.key, a.int_value {_THREAD_SLICES} JOIN args a USING(arg_set_id) "
                    f"WHERE th.name = '{STEP_THREAD}' AND s.name LIKE '{STEP_PREFIX}%' AND a.key LIKE '%host % ns' "
                    "ORDER BY s.ts").rows
    per: dict[int, dict[int, dict[str, int]]] = defaultdict(lambda: defaultdict(dict))  # rank -> ts -> use -> ns
    first_step: dict[int, tuple[int, int]] = {}  # rank -> (start, end) of its first step
    for upid, ts, dur, key, value in rows:
        if upid not in ranks or value is None:
            continue
        r = ranks[upid]
        use = str(key).rsplit("host ", 1)[1][:-3]
        per[r][ts][use] = int(value)
        if r not in first_step or ts < first_step[r][0]:
            first_step[r] = (ts, ts + dur)
    if not per:
        return None
    slowest = max(per, key=lambda r: next((x.stats.mean_ns for x in steps.per_rank if x.rank == r and x.stats), 0))
    by_step = [per[slowest][ts] for ts in sorted(per[slowest])]
    steady = by_step[1:] or by_step
    uses = sorted({u for st in steady for u in st})
    mean = {u: sum(st.get(u, 0) for st in steady) / len(steady) for u in uses}
    total_ns = sum(mean.values()) or 1
    waits = {u: mean.get(u, 0) for u in HOST_WAITS}
    bound = "host-bound"
    if max(waits.values()) > 0.05 * total_ns:
        bound = "loading-bound" if waits["data loading"] >= waits["wait"] else "GPU-bound"
    end = first_step[slowest][1]
    upid = next(u for u, r in ranks.items() if r == slowest)
    startup = db.query(f"SELECT s.name, COUNT(*), SUM(s.dur) {_THREAD_SLICES} WHERE th.upid = {upid} "
                       f"AND s.category = 'startup' AND s.ts < {end} GROUP BY s.name ORDER BY 3 DESC").rows
    meta = db.metadata.get("host_time")
    mode = meta.get("mode") if isinstance(meta, dict) else None
    return HostTime(slowest, len(steady), mean, bound,
                    [(str(n).removeprefix("start-up: "), int(c), int(d)) for n, c, d in startup], mode)


@dataclass
class TraceSummary:
    trace: str
    engine: str
    gpu: str | None  # hardware.py key of the simulated GPU
    peak_flops: float | None
    peak: str  # which peak MFU is against, in words
    simulated_ns: int | None
    ranks: list[int]
    steps: StepTimes
    gpus: list[GpuBreakdown]
    overall: OverallBreakdown | None
    top_kernels: list[KernelStat]
    memory: list[MemoryPeak]
    rollbacks: int
    stale_replies: int | None  # None: not recorded in this trace
    unknown_ops: dict[str, int]
    sync: str | None = None  # phantora trace --sync (None: not recorded)
    window: str = "each GPU's active span"  # what GPU time, MFU and kernel shares are measured over
    window_steps: int = 0  # steps inside that window (0: the whole span, not steps)
    routing_model: str | None = None  # phantora trace --routing, in words (None: not recorded)
    routing: list[RoutingLayer] = field(default_factory=list)  # MoE layers' decisions (docs/moe.md)
    host: HostTime | None = None  # how the host spent the steps (None: the trace does not say)


# --- intervals ------------------------------------------------------------------------------
def merge(intervals: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The union of [start, end) intervals as sorted, disjoint intervals."""
    out: list[tuple[int, int]] = []
    for s, e in sorted(intervals):
        if e <= s:
            continue
        if out and s <= out[-1][1]:
            if e > out[-1][1]:
                out[-1] = (out[-1][0], e)
        else:
            out.append((s, e))
    return out


def total(merged: list[tuple[int, int]]) -> int:
    return sum(e - s for s, e in merged)


def overlap(a: list[tuple[int, int]], b: list[tuple[int, int]]) -> int:
    """Length of the intersection of two merged interval lists."""
    i = j = 0
    n = 0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if hi > lo:
            n += hi - lo
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return n


# --- the analyses -------------------------------------------------------------------------------
_THREAD_SLICES = ("FROM slice s JOIN thread_track tt ON s.track_id = tt.id "
                  "JOIN thread th ON th.utid = tt.utid")


def _ranks(db: TraceDB) -> dict[int, int]:
    """upid -> rank, from the rank processes phantora names "rank R · node N · GPU G · ..."."""
    ranks = {}
    for upid, name in db.query("SELECT upid, name FROM process WHERE name IS NOT NULL").rows:
        m = _RANK_NAME.match(name)
        if m:
            ranks[upid] = int(m.group(1))
    if ranks:
        return ranks
    # Not a phantora trace: each process with CUDA stream threads is a rank, in pid order.
    rows = db.query("SELECT DISTINCT p.upid, p.pid FROM process p JOIN thread th ON th.upid = p.upid "
                    "WHERE th.name LIKE 'cuda:%' ORDER BY p.pid").rows
    return {upid: i for i, (upid, _pid) in enumerate(rows)}


def _gpu(db: TraceDB) -> GPUSpec | None:
    names = [str(db.metadata.get("gpu") or "")]
    names += [m.group(1) for (n,) in db.query("SELECT name FROM process WHERE name LIKE 'rank %'").rows
              if (m := _GPU_IN_NAME.search(n or ""))]
    for name in names:
        if name:
            try:
                return lookup_gpu(name)
            except UnknownGPUError:
                continue
    return None


def _steps(db: TraceDB, ranks: dict[int, int], gpu_ops: list[tuple[Any, ...]]) -> StepTimes:
    per_rank: dict[int, list[int]] = defaultdict(list)
    spans: dict[int, list[tuple[int, int]]] = defaultdict(list)
    rows = db.query(f"SELECT th.upid, s.ts, s.dur {_THREAD_SLICES} WHERE th.name = '{STEP_THREAD}' "
                    f"AND s.name LIKE '{STEP_PREFIX}%' ORDER BY th.upid, s.ts").rows
    for upid, ts, dur in rows:
        if upid in ranks:
            per_rank[ranks[upid]].append(dur)
            spans[ranks[upid]].append((ts, ts + dur))
    if per_rank:
        return _step_times("step markers", f"{STEP_PREFIX}N slices on '{STEP_THREAD}'", per_rank, spans)

    rows = db.query(f"SELECT th.upid, s.name, s.depth, s.ts, s.dur {_THREAD_SLICES} WHERE s.category = 'nvtx' "
                    "ORDER BY s.ts").rows
    counts: dict[tuple[str, int], list[int]] = defaultdict(lambda: [0, 0])
    for _upid, name, depth, _ts, dur in rows:
        counts[(name, depth)][0] += 1
        counts[(name, depth)][1] += dur
    repeating = [(depth, -c[1], name) for (name, depth), c in counts.items() if c[0] >= 2 * max(1, len(ranks))]
    if repeating:
        depth, _, name = min(repeating)  # the outermost, then the longest in total
        for upid, n, d, ts, dur in rows:
            if n == name and d == depth and upid in ranks:
                per_rank[ranks[upid]].append(dur)
                spans[ranks[upid]].append((ts, ts + dur))
        return _step_times("nvtx ranges", f"nvtx range '{name}'", per_rank, spans)

    anchors = []
    by_rank: dict[int, list[tuple[int, str]]] = defaultdict(list)
    for rank, _dev, ts, _dur, name, _cat, nccl, *_ in gpu_ops:
        if not nccl:
            by_rank[rank].append((ts, name))
    for rank, ops in by_rank.items():
        ops.sort()
        anchor = _periodic_anchor([name for _, name in ops])
        if anchor is None:
            continue
        times = [ts for ts, name in ops if name == anchor]
        per_rank[rank] = [b - a for a, b in zip(times, times[1:])]
        anchors.append(anchor)
    if per_rank:
        return _step_times("kernel periodicity", f"period of kernel '{anchors[0]}'", per_rank)
    return StepTimes("none", "no step markers, repeating nvtx ranges or periodic kernels")


def _periodic_anchor(names: list[str]) -> str | None:
    """The rarest name (at least 3 occurrences) whose occurrences are evenly spaced in the
    sequence, the first gap excepted (warm-up): it marks one period each."""
    positions: dict[str, list[int]] = defaultdict(list)
    for i, name in enumerate(names):
        positions[name].append(i)
    best = None
    for name, pos in positions.items():
        if len(pos) < 3:
            continue
        gaps = {b - a for a, b in zip(pos[1:], pos[2:])}
        if len(gaps) == 1 and (best is None or len(pos) < len(positions[best])):
            best = name
    return best


def _step_times(source: str, detail: str, per_rank: dict[int, list[int]],
                spans: dict[int, list[tuple[int, int]]] | None = None) -> StepTimes:
    ranked = [RankSteps(r, d, StepStats.of(d)) for r, d in sorted(per_rank.items())]
    n = min(len(d) for d in per_rank.values())
    overall = [max(d[i] for d in per_rank.values()) for i in range(n)]
    windows = {}
    if spans and n >= 2:  # the steady state: after the first step, to the end of the last one
        windows = {r: (sp[0][1], sp[-1][1]) for r, sp in spans.items()}
    return StepTimes(source, detail, ranked, overall, StepStats.of(overall), windows)


def _in_window(ops: list[tuple[Any, ...]], windows: dict[int, tuple[int, int]]) -> list[tuple[Any, ...]]:
    """The GPU ops their rank's host launched inside its window (a step's kernels run after the
    host has moved on, so GPU work belongs to the step that launched it, as a profiler's step
    annotation counts it); ops of ranks without a window all pass."""
    return [op for op in ops if op[0] not in windows or windows[op[0]][0] <= op[10] < windows[op[0]][1]]


def _gpu_ops(db: TraceDB, ranks: dict[int, int], with_launch: bool) -> list[tuple[Any, ...]]:
    """(rank, device, ts, dur, name, category, is_nccl, flops, estimator, op, launched) of every GPU
    op; `launched` is the host time of the call that launched it (the start of its launch flow's
    host slice; its own start where it has none, or when not `with_launch`)."""
    cats = ", ".join(f"'{c}'" for c in GPU_CATEGORIES)
    rows = db.query(f"SELECT s.id, th.upid, th.name, s.ts, s.dur, s.name, s.category, "
                    f"EXTRACT_ARG(s.arg_set_id, 'args.flops'), EXTRACT_ARG(s.arg_set_id, 'args.estimator'), "
                    f"EXTRACT_ARG(s.arg_set_id, 'args.op') {_THREAD_SLICES} WHERE s.category IN ({cats})").rows
    launched: dict[int, int] = {}
    if with_launch:
        launched = dict(db.query(f"SELECT f.slice_in, MIN(h.ts) FROM flow f JOIN slice h ON h.id = f.slice_out "
                                 f"WHERE h.category NOT IN ({cats}) GROUP BY f.slice_in").rows)
    ops = []
    for sid, upid, thread, ts, dur, name, cat, flops, estimator, op in rows:
        if upid not in ranks:
            continue
        m = _DEVICE.match(thread or "")
        nccl = name.startswith(NCCL_PREFIX) or (cat == "kernel" and "nccl" in (thread or ""))
        ops.append((ranks[upid], int(m.group(1)) if m else 0, ts, dur, name, cat, nccl,
                    float(flops) if isinstance(flops, (int, float)) else 0.0, estimator, op, launched.get(sid, ts)))
    return ops


def _breakdowns(ops: list[tuple[Any, ...]], peak: float | None) -> tuple[list[GpuBreakdown], OverallBreakdown | None]:
    by_gpu: dict[tuple[int, int], list[tuple[Any, ...]]] = defaultdict(list)
    for op in ops:
        by_gpu[(op[0], op[1])].append(op)
    gpus = []
    for (rank, device), gops in sorted(by_gpu.items()):
        compute = merge([(ts, ts + dur) for _, _, ts, dur, _, _, nccl, *_ in gops if not nccl])
        comm = merge([(ts, ts + dur) for _, _, ts, dur, _, _, nccl, *_ in gops if nccl])
        start = min(op[2] for op in gops)
        end = max(op[2] + op[3] for op in gops)
        span = end - start
        compute_ns, comm_ns = total(compute), total(comm)
        covered = overlap(compute, comm)
        exposed = comm_ns - covered
        flops = sum(op[7] for op in gops)
        tflops = flops / span / 1e3 if span > 0 else None  # FLOP/ns = 1e9 FLOP/s
        gpus.append(GpuBreakdown(rank, device, start, end, span, compute_ns, comm_ns, exposed,
                                 span - compute_ns - exposed, covered / comm_ns if comm_ns else None, flops,
                                 tflops, tflops * 1e12 / peak if tflops is not None and peak else None))
    if not gpus:
        return gpus, None
    window = max(g.span_end_ns for g in gpus) - min(g.span_start_ns for g in gpus)
    comm_ns = sum(g.comm_ns for g in gpus)
    exposed = sum(g.exposed_comm_ns for g in gpus)
    flops = sum(g.flops for g in gpus)
    tflops = flops / window / 1e3 if window > 0 else None
    overall = OverallBreakdown(len(gpus), window, sum(g.span_ns for g in gpus), sum(g.compute_ns for g in gpus),
                               comm_ns, exposed, sum(g.idle_ns for g in gpus),
                               (comm_ns - exposed) / comm_ns if comm_ns else None, flops, tflops,
                               tflops * 1e12 / (peak * len(gpus)) if tflops is not None and peak else None)
    return gpus, overall


def _top_kernels(ops: list[tuple[Any, ...]], top: int | None) -> list[KernelStat]:
    count: dict[str, int] = defaultdict(int)
    time: dict[str, int] = defaultdict(int)
    for op in ops:
        count[op[4]] += 1
        time[op[4]] += op[3]
    all_ns = sum(time.values())
    ranked = sorted(time, key=lambda n: (-time[n], n))
    return [KernelStat(n, count[n], time[n], time[n] / all_ns if all_ns else 0.0) for n in ranked[:top]]


def _memory(db: TraceDB, ranks: dict[int, int]) -> list[MemoryPeak]:
    rows = db.query("SELECT t.upid, t.name, MAX(c.value) FROM counter c JOIN process_counter_track t "
                    "ON c.track_id = t.id WHERE t.name LIKE 'cuda:% memory %' GROUP BY t.id").rows
    peaks: dict[tuple[int, int], MemoryPeak] = {}
    for upid, name, value in rows:
        m = _MEMORY_TRACK.match(name or "")
        if not m or upid not in ranks:
            continue
        key = (ranks[upid], int(m.group(1)))
        peak = peaks.setdefault(key, MemoryPeak(key[0], key[1], None, None))
        setattr(peak, f"{m.group(2)}_bytes", value)
    return [peaks[k] for k in sorted(peaks)]


def summarize(db: TraceDB, top: int | None = 10, steady: bool = True) -> TraceSummary:
    """The summary of the trace in `db`; `top` kernels by total time (None: all). `steady`:
    GPU time, MFU and kernels over the steps after the first where there are two or more;
    otherwise (and when False) over each GPU's whole active span."""
    ranks = _ranks(db)
    gpu = _gpu(db)
    peak = gpu.peak_flops.get(PEAK_DTYPE) if gpu else None
    peak_label = (f"{gpu.key} dense {PEAK_DTYPE} {peak / 1e12:.1f} TFLOP/s" if gpu and peak
                  else "unknown (the trace names no GPU phantora knows)")
    all_ops = _gpu_ops(db, ranks, with_launch=False)
    steps = _steps(db, ranks, all_ops)
    ops = all_ops
    window, window_steps = "each GPU's active span (first to last GPU op)", 0
    if steady and steps.windows:
        ops = _in_window(_gpu_ops(db, ranks, with_launch=True), steps.windows)
        window_steps = len(steps.overall_ns) - 1
        window = (f"steps 2-{len(steps.overall_ns)}: the GPU work each rank launched from the end of its first step "
                  "to the end of its last (the first step also holds setup and warm-up), first to last such op")
    gpus, overall = _breakdowns(ops, peak)
    unknown: dict[str, int] = defaultdict(int)
    for op in all_ops:
        if isinstance(op[8], str) and "unknown op" in op[8]:
            unknown[str(op[9] or op[4])] += 1
    rollbacks = db.query("SELECT COUNT(*) FROM slice WHERE category = 'rollback'").scalar() or 0
    routing_model, routing = _routing(db)
    stale = db.metadata.get("stale_replies")
    simulated = db.metadata.get("simulated_ns")
    return TraceSummary(
        trace=str(db.path), engine=db.engine, gpu=gpu.key if gpu else None, peak_flops=peak, peak=peak_label,
        simulated_ns=simulated if isinstance(simulated, int) else None, ranks=sorted(set(ranks.values())),
        steps=steps, gpus=gpus, overall=overall, top_kernels=_top_kernels(ops, top),
        memory=_memory(db, ranks), rollbacks=int(rollbacks), stale_replies=stale if isinstance(stale, int) else None,
        unknown_ops=dict(sorted(unknown.items(), key=lambda kv: -kv[1])),
        sync=db.metadata.get("sync") if isinstance(db.metadata.get("sync"), str) else None,
        window=window, window_steps=window_steps, routing_model=routing_model, routing=routing,
        host=_host_time(db, ranks, steps),
    )
