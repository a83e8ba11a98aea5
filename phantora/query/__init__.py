"""SQL on phantora traces, with Perfetto's schema.

    from phantora.query import load
    with load("run.json") as db:
        db.query("select name, sum(dur) from slice group by name order by 2 desc limit 5").rows
        db.metadata["gpu"]

Two engines answer the same SQL:
- Perfetto's trace_processor_shell, when a binary is on this machine
  (PHANTORA_TRACE_PROCESSOR=/path/to/trace_processor_shell, or the one the `perfetto`
  package cached after a download elsewhere). Nothing is downloaded.
- Otherwise a built-in engine: the trace imported into in-memory SQLite the way Perfetto's
  JSON importer imports it (see importer.py for the rules).

Schema of the built-in engine (timestamps and durations in ns, as in Perfetto):
  slice(id, ts, dur, track_id, category, name, depth, parent_id, arg_set_id, thread_ts, thread_dur)
  track(id, name, type, parent_id); thread_track(+ utid); process_track(+ upid);
  counter_track(+ unit, description); process_counter_track(+ upid)
  thread(utid, id, tid, name, upid, start_ts, end_ts)
  process(upid, id, pid, name, start_ts, end_ts, parent_upid, uid, cmdline, arg_set_id)
  counter(id, ts, track_id, value, arg_set_id)
  flow(id, slice_out, slice_in, trace_id, arg_set_id)
  args(id, arg_set_id, flat_key, key, int_value, string_value, real_value, value_type, display_value)
  metadata(id, name, key_type, int_value, str_value): the trace's top-level "metadata"
  stats(name, idx, severity, source, value, description): what the import dropped
  EXTRACT_ARG(arg_set_id, key) as in Perfetto.

Where it differs from trace_processor:
- Only these tables; no stdlib modules (INCLUDE PERFETTO MODULE), no sched/ftrace tables,
  no span_join or other Perfetto-only SQL functions besides EXTRACT_ARG.
- ids (slice, track, utid, upid, arg_set_id) are numbered differently; join on them, do
  not hard-code them. Equal arg sets are not shared: each slice has its own arg_set_id.
- thread_track.name is NULL, as in Perfetto's JSON import: a thread's name is thread.name.
- track.type holds the subtable's name ("thread_track", "process_counter_track", ...).
- Reals in args.display_value are Python's repr; booleans are value_type 'bool'.
- Trace metadata: Perfetto does not import Chrome JSON's "metadata"; here it is the
  metadata table (integers and booleans in int_value, other values in str_value, lists and
  objects as JSON), plus trace_type and trace_size_bytes. Either engine: TraceDB.metadata.
- args, flow and counter are filled when a statement first reads them (the args table of
  a million kernel slices, ~8M rows, takes about half a minute); EXTRACT_ARG does not need
  the args table.
- Slices that overlap without nesting are dropped as in Perfetto (which may instead move them
  to an overflow track); stats counts them, and TraceDB.import_stats lists what was dropped.
"""

from phantora.query.db import ENGINES, QueryResult, TraceDB, load
from phantora.query.errors import EngineUnavailable, QueryError, TraceFileError

__all__ = ["ENGINES", "EngineUnavailable", "QueryError", "QueryResult", "TraceDB", "TraceFileError", "load"]
