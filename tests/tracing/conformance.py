"""What a viewer should show of a Chrome JSON trace, computed twice: from the file (our side)
and from what Perfetto's trace processor imported (its side), plus the import problems it saw.

Both sides produce the same `TraceContents`, so a test compares them with ==. Each slice, flow
end and counter value is identified by what a user sees (process and thread ids, time, name),
never by ids one side invents.
"""

from __future__ import annotations

import bisect
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from phantora.trace.check import load_chrome_trace

from .perfetto_wasm import TraceProcessorRun, WasmTraceProcessor

ThreadKey = tuple[int, int]  # pid, tid
SliceKey = tuple[int, int, int, int, str, str | None]  # pid, tid, ts ns, dur ns, name, category
FlowEnd = tuple[int, int, int, str]  # pid, tid, ts ns, name of the slice an arrow starts or ends at
CounterValue = tuple[int, str, int, float]  # pid, counter track name, ts ns, value

# Stats that mean the import lost or misread something. Every stat of severity "error" or
# "data_loss" (JSON tokenizer/parser failures, displayTimeUnit too late, misplaced end events,
# out-of-order slices or counters, duplicate / invalid / unbound flow ids, process tracker
# errors, ...), plus two that v20.1 files as "info" although each is an arrow dropped.
STATS_QUERY = """
select name, idx, severity, source, value from stats
where value > 0 and (severity in ('error', 'data_loss')
                     or name in ('flow_end_without_start', 'flow_step_without_start'))
order by name, idx
"""
# v20.1 never drops a partly overlapping slice nor says so in stats: it nests it under the
# slice it starts in, although it ends after it. Such a child is the sign of slices that do not
# nest (current Perfetto would move it to an overflow track instead).
NESTING_QUERY = """
select c.name, c.ts, c.dur, p.name, p.ts, p.dur, c.track_id from slice c join slice p on c.parent_id = p.id
where c.ts + c.dur > p.ts + p.dur order by c.ts
"""
_THREAD = "join thread_track tt on {s}.track_id = tt.id join thread t on tt.utid = t.utid " \
          "left join process p on t.upid = p.upid"
CONTENT_QUERIES = {
    "processes": "select pid, name from process where name is not null",
    "threads": "select p.pid, t.tid, t.name from thread t left join process p using (upid) where t.name is not null",
    "slices": f"select p.pid, t.tid, s.ts, s.dur, s.name, s.category from slice s {_THREAD.format(s='s')}",
    "all_slices": "select count(*) from slice",
    "flows": "select po.pid, tho.tid, so.ts, so.name, pi.pid, thi.tid, si.ts, si.name from flow f "
             "join slice so on f.slice_out = so.id join thread_track tto on so.track_id = tto.id "
             "join thread tho on tto.utid = tho.utid left join process po on tho.upid = po.upid "
             "join slice si on f.slice_in = si.id join thread_track tti on si.track_id = tti.id "
             "join thread thi on tti.utid = thi.utid left join process pi on thi.upid = pi.upid",
    "all_flows": "select count(*) from flow",
    "counters": "select p.pid, ct.name, c.ts, c.value from counter c "
                "join process_counter_track ct on c.track_id = ct.id left join process p on ct.upid = p.upid",
    "all_counters": "select count(*) from counter",
}


def ts_ns(us: float) -> int:
    """A JSON ts as the trace processor reads it: the decimal number of microseconds, exactly."""
    return round(us * 1000)


def dur_ns_v20(us: float) -> int:
    """A JSON dur as trace processor v20.1 reads it: the double times 1000, truncated.

    Current Perfetto rounds instead; the two differ by 1 ns on about 1% of our slices. The
    expectation follows the version we run, so that any other difference still shows.
    """
    return int(us * 1000)


@dataclass
class TraceContents:
    process_names: dict[int, str] = field(default_factory=dict)
    thread_names: dict[ThreadKey, str] = field(default_factory=dict)
    slices: Counter[SliceKey] = field(default_factory=Counter)  # X and i events
    flows: Counter[tuple[FlowEnd, FlowEnd]] = field(default_factory=Counter)  # bind_id and s/f flows
    counters: Counter[CounterValue] = field(default_factory=Counter)

    @property
    def slices_per_thread(self) -> Counter[ThreadKey]:
        per_thread: Counter[ThreadKey] = Counter()
        for (pid, tid, *_), n in self.slices.items():
            per_thread[(pid, tid)] += n
        return per_thread


@dataclass
class Imported:
    """What the trace processor made of a trace."""

    version: str
    contents: TraceContents
    problems: list[str]


def contents_of_json(path: Path) -> TraceContents:
    """What our trace says, read from the file by the rules of the Chrome JSON format."""
    out = TraceContents()
    events = load_chrome_trace(path)["traceEvents"]
    by_thread: dict[ThreadKey, list[tuple[int, int, str]]] = defaultdict(list)
    bound: dict[object, dict[str, FlowEnd]] = defaultdict(dict)
    v1_ends: dict[tuple[object, object, object], dict[str, tuple[int, int, int]]] = defaultdict(dict)
    for ev in events:
        ph, pid, tid = ev.get("ph"), ev.get("pid"), ev.get("tid")
        if ph == "M" and ev.get("name") == "process_name":
            out.process_names[pid] = ev["args"]["name"]
        elif ph == "M" and ev.get("name") == "thread_name":
            out.thread_names[(pid, tid)] = ev["args"]["name"]
        elif ph in ("X", "i"):
            if ph == "i" and ev.get("s", "t") != "t":
                raise ValueError(f"{path}: instant with scope {ev.get('s')!r}: only thread instants are compared")
            ts, dur = ts_ns(ev["ts"]), dur_ns_v20(ev["dur"]) if ph == "X" else 0
            out.slices[(pid, tid, ts, dur, ev["name"], ev.get("cat"))] += 1
            by_thread[(pid, tid)].append((ts, ts + dur, ev["name"]))
            if "bind_id" in ev:
                bound[ev["bind_id"]]["out" if ev.get("flow_out") else "in"] = (pid, tid, ts, ev["name"])
        elif ph in ("s", "f"):
            v1_ends[(ev.get("id"), ev.get("cat"), ev.get("name"))][ph] = (pid, tid, ts_ns(ev["ts"]))
        elif ph == "C":
            for key, value in ev["args"].items():
                out.counters[(pid, f"{ev['name']} {key}", ts_ns(ev["ts"]), float(value))] += 1
    for ends in bound.values():
        if set(ends) == {"out", "in"}:
            out.flows[(ends["out"], ends["in"])] += 1
    for thread in by_thread.values():
        thread.sort()
    for ends in v1_ends.values():
        if set(ends) == {"s", "f"}:
            src, dst = (_enclosing(by_thread, *ends[k]) for k in ("s", "f"))
            if src and dst:
                out.flows[(src, dst)] += 1
    return out


def _enclosing(by_thread: dict[ThreadKey, list[tuple[int, int, str]]], pid: int, tid: int, ts: int) -> FlowEnd | None:
    """The innermost slice of (pid, tid) open at ts: what a flow event with "bp": "e" binds to."""
    slices = by_thread.get((pid, tid), [])
    candidates = [s for s in slices[:bisect.bisect_right(slices, (ts, 1 << 62, "\uffff"))]
                  if s[0] <= ts < s[1] or s[0] == ts == s[1]]
    if not candidates:
        return None
    start, _, name = max(candidates, key=lambda s: (s[0], -s[1]))
    return (pid, tid, start, name)


def import_with_trace_processor(tp: WasmTraceProcessor, path: Path) -> Imported:
    """Loads `path` into the trace processor once; its contents and the problems it reports."""
    queries = [STATS_QUERY, NESTING_QUERY, *CONTENT_QUERIES.values()]
    run = tp.query(path, queries)
    failed = [r for r in run.results if r.error]
    if failed:
        raise AssertionError(f"query failed on {run.version}: {failed[0].error}\n{failed[0].sql}")
    return Imported(run.version, _contents(run), import_problems(run))


def import_problems(run: TraceProcessorRun) -> list[str]:
    """Import errors (from the stats table) and slices that do not nest, one line each."""
    stats, nesting = run.results[0], run.results[1]
    problems = [f"stat {name}{'' if idx is None else f'[{idx}]'} = {value} ({severity}, {source})"
                for name, idx, severity, source, value in stats.rows]
    problems += [f"track {track}: slice {name!r} [{ts}, {ts + dur}] ns ends after its parent {pname!r} "
                 f"[{pts}, {pts + pdur}] ns" for name, ts, dur, pname, pts, pdur, track in nesting.rows]
    return problems


def _contents(run: TraceProcessorRun) -> TraceContents:
    r = dict(zip(CONTENT_QUERIES, run.results[2:]))
    out = TraceContents(
        process_names={pid: name for pid, name in r["processes"].rows},
        thread_names={(pid, tid): name for pid, tid, name in r["threads"].rows},
        slices=Counter(tuple(row) for row in r["slices"].rows),
        flows=Counter(((po, to, tso, so), (pi, ti, tsi, si)) for po, to, tso, so, pi, ti, tsi, si in r["flows"].rows),
        counters=Counter((pid, name, ts, float(value)) for pid, name, ts, value in r["counters"].rows),
    )
    # Everything must be reachable through a thread of a process: a slice, flow or counter
    # anywhere else is one the layout above does not account for.
    for what, total in (("slices", "all_slices"), ("flows", "all_flows"), ("counters", "all_counters")):
        n = r[total].rows[0][0]
        if n != sum(getattr(out, what).values()):
            raise AssertionError(f"{n} {what} in the trace processor, {sum(getattr(out, what).values())} "
                                 "of them on thread or process tracks")
    return out
