"""Chrome JSON events -> rows of Perfetto's tables, built the way Perfetto's JSON importer
builds them (src/trace_processor/importers/json/json_trace_parser_impl.cc, SliceTracker,
FlowTracker, TraceSorter), so that queries written against trace_processor give the same
answers here.

What that means, rule by rule:
- Events are processed in Perfetto's sort order: by timestamp; at equal timestamps an end
  ('E') comes first, then complete slices ('X') longest first, then everything else in file
  order. Timestamps are microseconds in the file and integer nanoseconds in the tables.
- Each thread (pid, tid) has one thread track; every event with a pid also creates its
  thread (tid defaults to pid) and process, as Perfetto's UpdateThread does.
- Slices nest per track with a stack: a slice open on the stack is closed when the next one
  starts at or after its end (at exactly its end only if not both are instants, which stack
  on each other). depth = stack height, parent_id = the slice below. A complete slice that
  starts inside an open one but ends after it is dropped (counted in stats as
  slice_drop_overlapping_complete_event). 'B' without 'E' keeps dur -1, as in Perfetto.
- Instants ('i'/'I'): scope 't' (default) are dur-0 slices on the thread track, 'p' on a
  process track, 'g' on one global track.
- Counters ('C'): one process counter track per (process, "<name> <key>") (with " id: <id>"
  after the name when the event has an id); values are doubles.
- Flows v2: 'bind_id' with 'flow_out' / 'flow_in' on X/B events bind to that slice; ids
  written as strings are hex. Flows v1 's'/'t'/'f' (keyed by id, cat and name) bind to the
  slice open on their thread's track ('f' with "bp": "e"), else 'f' binds to the next slice
  that begins there. Each step or end makes a flow row from the earlier slice to the later.
- Args: under "args.<key>", nested objects "args.a.b", list items "args.a[0]" (flat_key
  without the indices), nulls skipped; v1 flows carry args "name" and "cat".

Arg sets are kept as the events' raw args JSON (or dicts) here: the args table is flattened
from them only when a query needs it (sqlite_engine.py), because it is ~10 rows per kernel
slice.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import Any

import orjson

from phantora.query.source import ChromeEvent, events_from_dicts

PENDING_DUR = -1  # a 'B' slice whose 'E' never came (Perfetto's kPendingDuration)
NO_NAME = "[No name]"  # the name Perfetto gives slices without one
UINT32 = 1 << 32
UINT64 = 1 << 64
INT63 = 1 << 63

# Sort classes at equal timestamps (Perfetto's TraceSorter "slow" comparator for JSON).
_END_KEY = -(1 << 64)  # 'E' / 'e' before everything; 'X' sort as -dur; all else 0

# Kinds of timeline entries processed in sort order.
_SLICE, _INSTANT, _BEGIN, _END, _FLOW_V1 = range(5)

# Track types, as the subtables of Perfetto's track table are named.
THREAD_TRACK, PROCESS_TRACK, PROCESS_COUNTER_TRACK, GLOBAL_TRACK = (
    "thread_track", "process_track", "process_counter_track", "track")

# Stats Perfetto keeps for what an import dropped or could not read (stats table).
STAT_DESCRIPTIONS = {
    "json_tokenizer_failure": "events without a usable timestamp, skipped",
    "json_parser_failure": "events with an unusable field (counter args, instant scope, async id), skipped",
    "slice_drop_overlapping_complete_event": "complete slices that start inside an open slice of their "
                                             "track and end after it, dropped",
    "misplaced_end_event": "slices left open under a slice that ended, truncated at its end",
    "flow_no_enclosing_slice": "flow events with no open slice on their track",
    "flow_duplicate_id": "flow starts whose id was already started",
    "flow_end_without_start": "flow ends whose id never started",
    "flow_step_without_start": "flow steps whose id never started",
    "flow_invalid_id": "flow events without a usable id",
    "flow_without_direction": "events with a bind_id but neither flow_in nor flow_out",
    "json_truncated_file": "the file ends mid-event (its writer was stopped): read up to the last complete event",
}
_DATA_LOSS = {"slice_drop_overlapping_complete_event", "misplaced_end_event", "json_tokenizer_failure",
              "json_parser_failure", "json_truncated_file"}


def stat_severity(name: str) -> str:
    return "data_loss" if name in _DATA_LOSS else "info"


@dataclass
class ImportedTrace:
    """Rows of each table, in column order (see sqlite_engine.SCHEMA)."""

    processes: list[list[Any]]  # upid, pid, name
    threads: list[list[Any]]  # utid, tid, name, upid
    tracks: list[tuple[Any, ...]]  # id, name, type, utid, upid
    slices: list[list[Any]]  # id, ts, dur, track_id, category, name, depth, parent_id, arg_set_id, thread_ts, thread_dur
    counters: list[tuple[Any, ...]]  # id, ts, track_id, value
    flows: list[tuple[Any, ...]]  # id, slice_out, slice_in, trace_id, arg_set_id
    # arg_set_id -> (key prefix, values): ("args", the event's args as raw JSON or a dict)
    # for events, (None, {"name": ..., "cat": ...}) for v1 flows. See arg_values().
    arg_sets: list[tuple[str | None, Any]]
    stats: dict[str, int] = field(default_factory=dict)


def arg_values(payload: Any) -> dict[str, Any]:
    """An arg set's values as a dict, decoding raw JSON args on demand."""
    if type(payload) is dict:
        return payload
    value = orjson.loads(memoryview(payload))
    return value if type(value) is dict else {}


def _has_args(payload: Any) -> bool:
    """args present and a non-empty object (Perfetto makes no arg set otherwise)."""
    if payload is None:
        return False
    if type(payload) is dict:
        return bool(payload)
    view = memoryview(payload)
    return len(view) > 2 and view[0] == 0x7B  # '{', and not '{}'


def _ns(value: Any) -> int | None:
    """A JSON microsecond timestamp as integer ns (to the nearest ns for floats)."""
    t = type(value)
    if t is float:
        return round(value * 1000)
    if t is int:
        return value * 1000
    if t is str:
        try:
            return int(Decimal(value) * 1000)
        except (InvalidOperation, ValueError):
            return None
    return None


def _uint32(value: Any) -> int | None:
    t = type(value)
    if t is float:
        value = int(value)
    elif t is str:
        try:
            value = int(value)
        except ValueError:
            return None
    elif t is not int:
        return None
    return value if 0 <= value < UINT32 else None


def _flow_id(value: Any) -> int | None:
    """A flow id as Perfetto reads it: numbers as uint64, strings as hex."""
    t = type(value)
    if t is int:
        return value % UINT64
    if t is float:
        return int(value) % UINT64
    if t is str:
        try:
            return int(value, 16) % UINT64
        except ValueError:
            return None
    return None


def _int64(value: int) -> int:
    """A uint64 id as SQLite's signed 64-bit integer (the bits Perfetto stores)."""
    return value - UINT64 if value >= 1 << 63 else value


def _truthy(value: Any) -> bool:
    return bool(value) if isinstance(value, (bool, int, float)) else False


def _text(value: Any) -> str | None:
    """cat: missing or empty is NULL (Perfetto interns "" as the null string)."""
    return value if type(value) is str and value else None


class _Importer:
    def __init__(self) -> None:
        # upid 0 and utid 0 are Perfetto's placeholders (the idle process and thread, pid and tid
        # 0, the thread in no process); a trace's own pid 0 is a process of its own.
        self.processes: list[list[Any]] = [[0, 0, None]]
        self.upid_of: dict[int, int] = {}
        self.threads: list[list[Any]] = [[0, 0, None, None]]
        self.utid_of: dict[tuple[int, int], int] = {}
        self.tracks: list[tuple[Any, ...]] = []
        self.track_of: dict[Any, int] = {}  # utid / ("p", pid) / ("c", upid, name) / ("a", ...) / ("g",)
        self.entries: list[tuple[Any, ...]] = []  # (ts, sort key, file index, kind, track, event)
        self.counter_points: list[tuple[int, int, int, float]] = []  # ts, file index, track, value
        self.string_ids: dict[str, int] = {}
        self.stats: dict[str, int] = dict.fromkeys(STAT_DESCRIPTIONS, 0)

    # --- processes, threads, tracks ------------------------------------------------------
    def upid(self, pid: int) -> int:
        upid = self.upid_of.get(pid)
        if upid is None:
            upid = self.upid_of[pid] = len(self.processes)
            self.processes.append([upid, pid, None])
            self.utid(pid, pid)  # a new process gets its main thread, as in Perfetto
        return upid

    def utid(self, pid: int, tid: int) -> int:
        utid = self.utid_of.get((pid, tid))
        if utid is None:
            upid = self.upid(pid)  # first: a new process adds its main thread
            utid = self.utid_of.get((pid, tid))
            if utid is None:
                utid = self.utid_of[(pid, tid)] = len(self.threads)
                self.threads.append([utid, tid, None, upid])
        return utid

    def track(self, key: Any, name: str | None, kind: str, upid: int | None = None) -> int:
        tid = self.track_of.get(key)
        if tid is None:
            tid = self.track_of[key] = len(self.tracks)
            self.tracks.append((tid, name, kind, None, upid))
        return tid

    def thread_track(self, utid: int) -> int:
        tid = self.track_of.get(utid)  # utids are the only int keys
        if tid is None:
            tid = self.track_of[utid] = len(self.tracks)
            self.tracks.append((tid, None, THREAD_TRACK, utid, None))
        return tid

    def string_pid(self, name: str) -> int:
        """Perfetto's quick-and-dirty mode: a string pid/tid is an id of its own, and a name."""
        n = self.string_ids.get(name)
        if n is None:
            n = self.string_ids[name] = UINT32 + len(self.string_ids)
        return n

    # --- pass 1: classify every event, in file order ----------------------------------------
    def scan(self, events: Iterable[ChromeEvent]) -> None:
        entries = self.entries
        append = entries.append
        stats = self.stats
        utid_of = self.utid_of
        track_of = self.track_of
        for idx, e in enumerate(events):
            ph = e.ph
            if type(ph) is not str or not ph:
                continue
            ph = ph[0]
            raw_pid, raw_tid = e.pid, e.tid
            # Fast path: integer pid and tid (everything phantora writes).
            if type(raw_pid) is int and type(raw_tid) is int and 0 <= raw_pid < UINT32 and 0 <= raw_tid < UINT32:
                pid, tid, has_pid, has_tid = raw_pid, raw_tid, True, True
            else:
                pid, tid, has_pid, has_tid = self._ids(raw_pid, raw_tid)
            utid = utid_of.get((pid, tid))
            if utid is None:
                utid = self.utid(pid, tid)

            if ph == "M":
                self._metadata_event(e, pid, utid)
                continue
            ts = e.ts
            ts = round(ts * 1000) if type(ts) is float else _ns(ts)
            if ts is None:
                stats["json_tokenizer_failure"] += 1
                continue

            if ph == "X":
                dur = e.dur
                dur = round(dur * 1000) if type(dur) is float else _ns(dur)
                if dur is None:
                    continue
                track = track_of.get(utid)
                if track is None:
                    track = self.thread_track(utid)
                append((ts, -dur, idx, _SLICE, track, e))
            elif ph == "C":
                self._counter(e, ts, idx, pid)
            elif ph == "B":
                append((ts, 0, idx, _BEGIN, self.thread_track(utid), e))
            elif ph == "E":
                append((ts, _END_KEY, idx, _END, self.thread_track(utid), e))
            elif ph in "iIR":
                scope = e.s
                if scope == "g":
                    track = self.track(("g",), None, GLOBAL_TRACK)
                elif scope == "p":
                    if not has_pid:
                        stats["json_parser_failure"] += 1
                        continue
                    track = self.track(("p", pid), None, PROCESS_TRACK, upid=self.upid(pid))
                elif scope is None or scope == "t":
                    if not has_tid:
                        stats["json_parser_failure"] += 1
                        continue
                    track = self.thread_track(utid)
                else:
                    stats["json_parser_failure"] += 1
                    continue
                append((ts, 0, idx, _INSTANT, track, e))
            elif ph in "stf":
                append((ts, 0, idx, _FLOW_V1, self.thread_track(utid), e))
            elif ph in "ben":
                track = self._async_track(e, pid, has_pid)
                if track is None:
                    continue
                kind = _BEGIN if ph == "b" else _END if ph == "e" else _SLICE
                append((ts, _END_KEY if ph == "e" else 0, idx, kind, track, e))
            # other phases (samples, object snapshots, ...) are not imported, as in Perfetto

    def _ids(self, raw_pid: Any, raw_tid: Any) -> tuple[int, int, bool, bool]:
        pid: int | None
        tid: int | None
        if type(raw_pid) is str:
            pid = self.string_pid(raw_pid)
            self.processes[self.upid(pid)][2] = raw_pid
        else:
            pid = _uint32(raw_pid)
        tid = self.string_pid(raw_tid) if type(raw_tid) is str else _uint32(raw_tid)
        has_pid, has_tid = pid is not None, tid is not None
        pid = pid if pid is not None else 0
        tid = tid if tid is not None else pid
        if type(raw_tid) is str:
            self.threads[self.utid(pid, tid)][2] = raw_tid
        return pid, tid, has_pid, has_tid

    def _metadata_event(self, e: ChromeEvent, pid: int, utid: int) -> None:
        if e.name not in ("thread_name", "process_name") or e.args is None:
            return
        name = arg_values(e.args).get("name")
        if not isinstance(name, str) or not name:
            return
        if e.name == "thread_name":
            self.threads[utid][2] = name
        else:
            self.processes[self.upid(pid)][2] = name

    def _counter(self, e: ChromeEvent, ts: int, idx: int, pid: int) -> None:
        args = arg_values(e.args) if e.args is not None else None
        if not args:
            self.stats["json_parser_failure"] += 1
            return
        prefix = e.name if isinstance(e.name, str) else ""
        if e.id is not None and e.id != "":
            prefix += f" id: {e.id}"
        upid = self.upid(pid)
        for key, value in args.items():
            t = type(value)
            if t is str:
                try:
                    value = float(value)
                except ValueError:
                    self.stats["json_parser_failure"] += 1
                    continue
            elif t is not int and t is not float:
                self.stats["json_parser_failure"] += 1
                continue
            cname = f"{prefix} {key}"
            track = self.track_of.get(("c", upid, cname))
            if track is None:
                track = self.track(("c", upid, cname), cname, PROCESS_COUNTER_TRACK, upid=upid)
            self.counter_points.append((ts, idx, track, float(value)))

    def _async_track(self, e: ChromeEvent, pid: int, has_pid: bool) -> int | None:
        id2 = e.id2 if isinstance(e.id2, dict) else {}
        aid = "" if e.id is None else str(e.id)
        local = str(id2.get("local", ""))
        glob = str(id2.get("global", ""))
        if not has_pid or not (aid or glob or local):
            self.stats["json_parser_failure"] += 1
            return None
        name = e.name if isinstance(e.name, str) else None
        cat = _text(e.cat)
        if aid or glob:  # process-independent ids: a global track
            return self.track(("a", cat, aid or glob), name, GLOBAL_TRACK)
        upid = self.upid(pid)
        return self.track(("a", upid, cat, local), name, PROCESS_TRACK, upid=upid)

    # --- pass 2: the timeline, in Perfetto's sort order -----------------------------------------
    def build(self) -> ImportedTrace:
        self.entries.sort()
        slices: list[list[Any]] = []
        flows: list[tuple[Any, ...]] = []
        arg_sets: list[tuple[str | None, Any]] = []
        stacks: dict[int, list[list[Any]]] = {}
        pending_flows: dict[int, list[tuple[Any, ...]]] = {}  # track -> v1 flow keys awaiting a slice
        flow_source: dict[Any, list[Any]] = {}  # v2 bind_id or v1 key -> the slice row it leaves from
        stats = self.stats

        def add_flow(key: Any, out_row: list[Any], in_row: list[Any]) -> None:
            if type(key) is tuple:  # v1: trace_id is the JSON id; args name and cat
                arg = len(arg_sets)
                arg_sets.append((None, {k: v for k, v in (("name", key[2]), ("cat", key[1])) if v is not None}))
                flows.append((len(flows), out_row[0], in_row[0], _int64(key[0]), arg))
            else:
                flows.append((len(flows), out_row[0], in_row[0], _int64(key), None))

        def begin_flow(key: Any, row: list[Any]) -> None:
            if key in flow_source:
                stats["flow_duplicate_id"] += 1
            else:
                flow_source[key] = row

        def continue_flow(key: Any, row: list[Any], step: bool) -> None:
            src = flow_source.get(key)
            if src is None:
                stats["flow_step_without_start" if step else "flow_end_without_start"] += 1
                return
            if src[1] > row[1]:  # the earlier slice is the flow's source
                add_flow(key, row, src)
            else:
                add_flow(key, src, row)
            if step:
                flow_source[key] = row

        def v2_flow(e: ChromeEvent, stack: list[list[Any]]) -> None:
            key = _flow_id(e.bind_id)
            if key is None:
                return
            out, into = _truthy(e.flow_out), _truthy(e.flow_in)
            if not out and not into:
                stats["flow_without_direction"] += 1
            elif not stack:
                stats["flow_no_enclosing_slice"] += 1
            elif out and into:
                continue_flow(key, stack[-1], True)
            elif out:
                begin_flow(key, stack[-1])
            else:
                continue_flow(key, stack[-1], False)

        for ts, sort_key, _idx, kind, track, e in self.entries:
            stack = stacks.get(track)
            if stack is None:
                stack = stacks[track] = []
            if kind <= _BEGIN:  # a slice begins: complete, instant or 'B'
                dur = PENDING_DUR if kind == _BEGIN else -sort_key
                # Fast path for the usual case, the previous slice of the track has ended;
                # anything else goes through the full port of Perfetto's rules.
                if stack and (len(stack) > 1 or kind == _BEGIN or stack[-1][2] < 0 or dur == 0
                              or stack[-1][1] + stack[-1][2] > ts):
                    if not _close_ended(stack, ts, dur, stats):
                        stats["slice_drop_overlapping_complete_event"] += 1
                        if e.bind_id is not None and kind != _INSTANT:
                            v2_flow(e, stack)
                        continue
                elif stack:
                    stack.pop()
                args = e.args
                arg = None
                if args is not None and _has_args(args):
                    arg = len(arg_sets)
                    arg_sets.append(("args", args))
                name = e.name
                cat = e.cat
                row = [len(slices), ts, dur, track, cat if type(cat) is str and cat else None,
                       name if type(name) is str and name else NO_NAME,
                       len(stack), stack[-1][0] if stack else None, arg, None, None]
                if e.tts is not None:
                    row[9] = _ns(e.tts)
                    if kind != _BEGIN:
                        row[10] = _ns(e.tdur) if e.tdur is not None else (0 if dur == 0 else None)
                slices.append(row)
                stack.append(row)
                if pending_flows:
                    waiting = pending_flows.pop(track, None)
                    for key in waiting or ():
                        src = flow_source.get(key)
                        if src is not None:
                            add_flow(key, src, row)
                bind = e.bind_id
                if bind is not None and kind != _INSTANT:
                    # Inlined common cases of v2_flow: an int id that only leaves or only arrives.
                    if type(bind) is int and 0 <= bind < INT63:
                        if e.flow_out is True and e.flow_in is None:
                            if bind in flow_source:
                                stats["flow_duplicate_id"] += 1
                            else:
                                flow_source[bind] = row
                            continue
                        if e.flow_in is True and e.flow_out is None:
                            src = flow_source.get(bind)
                            if src is None:
                                stats["flow_end_without_start"] += 1
                            elif src[1] > ts:
                                flows.append((len(flows), row[0], src[0], bind, None))
                            else:
                                flows.append((len(flows), src[0], row[0], bind, None))
                            continue
                    v2_flow(e, stack)
            elif kind == _END:
                _close_ended(stack, ts, PENDING_DUR, stats)
                at = _matching_open(stack, _text(e.cat), e.name)
                if at is None:
                    continue
                row = stack[at]
                row[2] = ts - row[1]
                if e.args is not None and _has_args(e.args):  # an end's args join its slice's
                    if row[8] is None:
                        row[8] = len(arg_sets)
                        arg_sets.append(("args", e.args))
                    else:
                        arg_sets[row[8]] = ("args", {**arg_values(arg_sets[row[8]][1]), **arg_values(e.args)})
                if at == len(stack) - 1:
                    stack.pop()
            else:  # v1 flow event
                fid = _flow_id(e.id) if e.id is not None else None
                if fid is None:
                    stats["flow_invalid_id"] += 1
                    continue
                key = (fid, _text(e.cat), e.name if type(e.name) is str else None)
                phase = e.ph[0]
                if phase == "f" and e.bp != "e":
                    pending_flows.setdefault(track, []).append(key)
                    continue
                if not stack:
                    stats["flow_no_enclosing_slice"] += 1
                    continue
                if phase == "s":
                    begin_flow(key, stack[-1])
                else:
                    continue_flow(key, stack[-1], phase == "t")

        self.counter_points.sort()
        counters = [(i, ts, track, value) for i, (ts, _idx, track, value) in enumerate(self.counter_points)]
        return ImportedTrace(self.processes, self.threads, self.tracks, slices, counters, flows, arg_sets,
                             self.stats)


def _close_ended(stack: list[list[Any]], new_ts: int, new_dur: int, stats: dict[str, int]) -> bool:
    """Pop the slices of `stack` that ended before a new slice [new_ts, new_ts + new_dur)
    begins; False if the new slice overlaps an open one without nesting in it (it is then
    dropped). A line-by-line port of SliceTracker::MaybeCloseStack."""
    incomplete_below = False
    i = len(stack) - 1
    while i >= 0:
        row = stack[i]
        start, dur = row[1], row[2]
        i -= 1
        if dur == PENDING_DUR:
            incomplete_below = True
            continue
        end = start + dur
        if incomplete_below:
            if new_ts <= end:
                continue
            # Open 'B' slices above one that ended: they end with it.
            stats["misplaced_end_event"] += 1
            for j in range(len(stack) - 1, i + 1, -1):
                child = stack[j]
                child[2] = end - child[1]
                stack.pop()
            stack.pop()
            incomplete_below = False
            continue
        if end < new_ts or (end == new_ts and not (dur == 0 and new_dur == 0)):
            stack.pop()
            continue
        if new_dur == PENDING_DUR:
            continue
        if new_ts < end < new_ts + new_dur:
            return False
    return True


def _matching_open(stack: list[list[Any]], cat: str | None, name: Any) -> int | None:
    """Index of the innermost open 'B' slice an end event closes (matching its cat and name
    when the end has them)."""
    for i in range(len(stack) - 1, -1, -1):
        row = stack[i]
        if row[2] != PENDING_DUR:
            continue
        if cat is not None and row[4] != cat:
            continue
        if type(name) is str and name and row[5] != name:
            continue
        return i
    return None


def import_events(events: Iterable[ChromeEvent] | Iterable[dict[str, Any]]) -> ImportedTrace:
    """The rows Perfetto's JSON importer would make of `events`: ChromeEvent structs, or
    Chrome-JSON-shaped dicts (traceEvents entries)."""
    importer = _Importer()
    importer.scan(events_from_dicts(events))
    return importer.build()
