"""The built-in query engine: an in-memory SQLite database with Perfetto's table and column
names and units (timestamps and durations in ns), filled by importer.py.

Loading is bulk: executemany of each table's rows, indexes created after the inserts. Binding
values is what costs (~0.3 us per value on the 2-core development machine), so the tables a
query may never touch are filled when a statement first reads them: args (~10 rows per
kernel slice), flow and counter. An SQLite authorizer refuses the read, the table is filled,
and the statement runs again. EXTRACT_ARG(arg_set_id, key) reads the arg sets directly, so
the common `EXTRACT_ARG(arg_set_id, 'args.flops')` never needs the args table.
"""

from __future__ import annotations

import sqlite3
import threading
from typing import Any

import orjson

from phantora.query.importer import (
    PROCESS_COUNTER_TRACK,
    PROCESS_TRACK,
    STAT_DESCRIPTIONS,
    THREAD_TRACK,
    ImportedTrace,
    arg_values,
    stat_severity,
)
from phantora.query.readonly import single_statement, sqlite_authorizer

INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1

SCHEMA = f"""
CREATE TABLE process (upid INTEGER PRIMARY KEY, id INTEGER, pid INTEGER, name TEXT, start_ts INTEGER,
    end_ts INTEGER, parent_upid INTEGER, uid INTEGER, cmdline TEXT, arg_set_id INTEGER);
CREATE TABLE thread (utid INTEGER PRIMARY KEY, id INTEGER, tid INTEGER, name TEXT, upid INTEGER,
    start_ts INTEGER, end_ts INTEGER);
CREATE TABLE __intrinsic_track (id INTEGER PRIMARY KEY, name TEXT, type TEXT, utid INTEGER, upid INTEGER,
    unit TEXT, description TEXT);
CREATE VIEW track AS SELECT id, name, type, NULL AS parent_id FROM __intrinsic_track;
CREATE VIEW thread_track AS SELECT id, name, type, NULL AS parent_id, utid FROM __intrinsic_track
    WHERE type = '{THREAD_TRACK}';
CREATE VIEW process_track AS SELECT id, name, type, NULL AS parent_id, upid FROM __intrinsic_track
    WHERE type = '{PROCESS_TRACK}';
CREATE VIEW counter_track AS SELECT id, name, type, NULL AS parent_id, unit, description FROM __intrinsic_track
    WHERE type = '{PROCESS_COUNTER_TRACK}';
CREATE VIEW process_counter_track AS SELECT id, name, type, NULL AS parent_id, unit, description, upid
    FROM __intrinsic_track WHERE type = '{PROCESS_COUNTER_TRACK}';
CREATE TABLE slice (id INTEGER PRIMARY KEY, ts INTEGER NOT NULL, dur INTEGER NOT NULL, track_id INTEGER NOT NULL,
    category TEXT, name TEXT, depth INTEGER NOT NULL, parent_id INTEGER, arg_set_id INTEGER, thread_ts INTEGER,
    thread_dur INTEGER);
CREATE TABLE counter (id INTEGER PRIMARY KEY, ts INTEGER NOT NULL, track_id INTEGER NOT NULL, value REAL,
    arg_set_id INTEGER);
CREATE TABLE flow (id INTEGER PRIMARY KEY, slice_out INTEGER NOT NULL, slice_in INTEGER NOT NULL,
    trace_id INTEGER, arg_set_id INTEGER);
CREATE TABLE args (id INTEGER PRIMARY KEY, arg_set_id INTEGER NOT NULL, flat_key TEXT, key TEXT,
    int_value INTEGER, string_value TEXT, real_value REAL, value_type TEXT, display_value TEXT);
CREATE TABLE metadata (id INTEGER PRIMARY KEY, name TEXT NOT NULL, key_type TEXT, int_value INTEGER,
    str_value TEXT);
CREATE TABLE stats (name TEXT, idx INTEGER, severity TEXT, source TEXT, value INTEGER, description TEXT);
"""

SLICE_INDEX = "CREATE INDEX slice_track_ts ON slice (track_id, ts)"

_ARGS_BATCH = 200_000
_MISSING = object()


def metadata_rows(metadata: dict[str, Any]) -> list[tuple[Any, ...]]:
    """The trace's top-level metadata as rows of Perfetto's metadata table: integers (and
    booleans) in int_value, everything else in str_value (lists and objects as JSON)."""
    rows = []
    for i, (name, value) in enumerate(metadata.items()):
        int_value = str_value = None
        if isinstance(value, bool):
            int_value = int(value)
        elif isinstance(value, int) and INT64_MIN <= value <= INT64_MAX:
            int_value = value
        elif isinstance(value, str):
            str_value = value
        elif value is not None:
            str_value = orjson.dumps(value).decode() if isinstance(value, (list, dict)) else repr(value)
        rows.append((i, str(name), "single", int_value, str_value))
    return rows


def split_statements(sql: str) -> list[str]:
    """`sql` cut into single statements (trace_processor accepts several and answers with the
    last one's rows; sqlite3 runs one at a time)."""
    statements, start = [], 0
    for i, ch in enumerate(sql):
        if ch == ";" and sqlite3.complete_statement(sql[start:i + 1]):
            stmt = sql[start:i + 1].strip()
            if stmt.rstrip(";").strip():
                statements.append(stmt)
            start = i + 1
    tail = sql[start:].strip()
    if tail:
        statements.append(tail)
    return statements


def _leaf(value: Any) -> Any:
    """An arg value as SQL sees it: booleans as 0/1, containers and nulls as NULL."""
    t = type(value)
    if t is bool:
        return int(value)
    if t is int:
        return value if INT64_MIN <= value <= INT64_MAX else float(value)
    if t is float or t is str:
        return value
    return None


def lookup_arg(values: Any, path: str) -> Any:
    """The value at an args key path below `values` ("a.b[1]" for values["a"]["b"][1]; list
    indices count non-null items, as Perfetto numbers them). Keys may contain dots: the
    longest key that matches wins. _MISSING when there is none."""
    node = values
    while path:
        if type(node) is dict:
            hit = node.get(path, _MISSING)
            if hit is not _MISSING:
                return hit
            for i in range(len(path) - 1, 0, -1):
                if path[i] in ".[" and path[:i] in node:
                    node, path = node[path[:i]], path[i:]
                    break
            else:
                return _MISSING
            if path[0] == ".":
                path = path[1:]
                if type(node) is not dict:
                    return _MISSING
        elif type(node) is list and path[0] == "[":
            close = path.find("]")
            try:
                index = int(path[1:close])
            except ValueError:
                return _MISSING
            items = [x for x in node if x is not None]
            if close < 0 or not 0 <= index < len(items):
                return _MISSING
            node, path = items[index], path[close + 1:]
            if path[:1] == ".":
                path = path[1:]
                if type(node) is not dict:
                    return _MISSING
        else:
            return _MISSING
    return node


def _arg_key_names(prefix: str, path: str) -> tuple[str, str]:
    """(flat_key, key) of a json_tree fullkey ('$.a."b c"[0]') under `prefix` ("args", or ""
    for arg sets whose keys are at the top): ("args.a.b c", "args.a.b c[0]")."""
    flat, key = [prefix], [prefix]
    i, n = 1, len(path)  # after the "$"
    while i < n:
        if path[i] == "[":
            close = path.index("]", i)
            key.append(path[i:close + 1])
            i = close + 1
            continue
        i += 1  # the "."
        if i < n and path[i] == '"':  # a quoted label, with backslash escapes
            j, label = i + 1, []
            while path[j] != '"':
                if path[j] == "\\":
                    j += 1
                label.append(path[j])
                j += 1
            part, i = "".join(label), j + 1
        else:
            j = i
            while j < n and path[j] not in ".[":
                j += 1
            part, i = path[i:j], j
        flat.append("." + part)
        key.append("." + part)
    flat_key, full = "".join(flat), "".join(key)
    return (flat_key[1:], full[1:]) if not prefix else (flat_key, full)


def _flatten(rows: list[tuple[Any, ...]], set_id: int, flat_key: str, key: str, value: Any) -> None:
    t = type(value)
    if t is dict:
        for k, v in value.items():
            _flatten(rows, set_id, f"{flat_key}.{k}", f"{key}.{k}", v)
    elif t is list:
        n = 0
        for v in value:
            if v is None:  # nulls are skipped and take no index
                continue
            _flatten(rows, set_id, flat_key, f"{key}[{n}]", v)
            n += 1
    elif t is str:
        rows.append((set_id, flat_key, key, None, value, None, "string", value))
    elif t is bool:
        rows.append((set_id, flat_key, key, int(value), None, None, "bool", "true" if value else "false"))
    elif t is int:
        if INT64_MIN <= value <= INT64_MAX:
            rows.append((set_id, flat_key, key, value, None, None, "int", str(value)))
        else:
            rows.append((set_id, flat_key, key, None, None, float(value), "real", repr(float(value))))
    elif t is float:
        rows.append((set_id, flat_key, key, None, None, value, "real", repr(value)))


class SqliteTraceDB:
    """One imported trace in an in-memory SQLite database."""

    engine = "builtin"

    def __init__(self, trace: ImportedTrace, metadata: dict[str, Any], trace_type: str = "json",
                 size_bytes: int = 0) -> None:
        self._trace: ImportedTrace | None = trace  # until every lazy table is filled
        self._arg_sets = trace.arg_sets
        self._lazy = {"args": self._fill_args, "flow": self._fill_flows, "counter": self._fill_counters}
        self._filled: set[str] = set()
        self._wanted: set[str] = set()
        self._cached_set: int = -1
        self._cached_values: tuple[str | None, dict[str, Any]] = (None, {})
        self._lock = threading.Lock()
        self.import_stats = {k: v for k, v in trace.stats.items() if v}
        conn = sqlite3.connect(":memory:", check_same_thread=False, isolation_level=None)
        self._conn = conn
        conn.executescript("PRAGMA journal_mode = OFF; PRAGMA synchronous = OFF; PRAGMA temp_store = MEMORY;")
        conn.executescript(SCHEMA)
        conn.execute("BEGIN")
        conn.executemany("INSERT INTO process (upid, id, pid, name) VALUES (?, ?, ?, ?)",
                         ((p[0], p[0], p[1], p[2]) for p in trace.processes))
        conn.executemany("INSERT INTO thread (utid, id, tid, name, upid) VALUES (?, ?, ?, ?, ?)",
                         ((t[0], t[0], t[1], t[2], t[3]) for t in trace.threads))
        conn.executemany("INSERT INTO __intrinsic_track (id, name, type, utid, upid) VALUES (?, ?, ?, ?, ?)",
                         trace.tracks)
        self._insert_slices(trace.slices)
        meta = dict(metadata)
        meta.setdefault("trace_type", trace_type)
        if size_bytes:
            meta.setdefault("trace_size_bytes", size_bytes)
        conn.executemany("INSERT INTO metadata VALUES (?, ?, ?, ?, ?)", metadata_rows(meta))
        conn.executemany("INSERT INTO stats VALUES (?, 0, ?, 'trace', ?, ?)",
                         [(name, stat_severity(name), trace.stats.get(name, 0), desc)
                          for name, desc in STAT_DESCRIPTIONS.items()])
        conn.execute(SLICE_INDEX)  # after the inserts: building it once is cheaper than updating it
        conn.execute("COMMIT")
        conn.create_function("extract_arg", 2, self._extract_arg, deterministic=True)
        conn.set_authorizer(self._authorize)

    def _insert_slices(self, slices: list[list[Any]]) -> None:
        """Slices in id order. Only the first row names its id (SQLite numbers the rest
        max + 1, which is theirs) and the rare thread times go in afterwards: every value not
        bound saves ~0.3 us a row."""
        conn = self._conn
        if not slices:
            return
        conn.execute("INSERT INTO slice VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", slices[0])
        conn.executemany("INSERT INTO slice (ts, dur, track_id, category, name, depth, parent_id, arg_set_id) "
                         "VALUES (?, ?, ?, ?, ?, ?, ?, ?)", (row[1:9] for row in slices[1:]))
        conn.executemany("UPDATE slice SET thread_ts = ?, thread_dur = ? WHERE id = ?",
                         [(row[9], row[10], row[0]) for row in slices if row[9] is not None])

    # --- tables filled on first read -------------------------------------------------------
    def _authorize(self, action: int, arg1: str | None, *_: Any) -> int:
        if action == sqlite3.SQLITE_READ and arg1 in self._lazy and arg1 not in self._filled:
            self._wanted.add(arg1)
            return sqlite3.SQLITE_DENY
        return sqlite_authorizer(action, arg1, *_)

    def _fill(self, table: str) -> None:
        if table in self._filled:
            return
        self._filled.add(table)
        conn = self._conn
        conn.set_authorizer(None)
        conn.execute("BEGIN")
        self._lazy[table]()
        conn.execute("COMMIT")
        conn.set_authorizer(self._authorize)
        if self._filled == set(self._lazy):
            self._trace = None

    def _fill_flows(self) -> None:
        assert self._trace is not None
        self._conn.executemany("INSERT INTO flow VALUES (?, ?, ?, ?, ?)", self._trace.flows)
        self._conn.execute("CREATE INDEX flow_out ON flow (slice_out)")
        self._conn.execute("CREATE INDEX flow_in ON flow (slice_in)")

    def _fill_counters(self) -> None:
        assert self._trace is not None
        self._conn.executemany("INSERT INTO counter (id, ts, track_id, value) VALUES (?, ?, ?, ?)",
                               self._trace.counters)
        self._conn.execute("CREATE INDEX counter_track_ts ON counter (track_id, ts)")

    def _fill_args(self) -> None:
        """The args table from the arg sets. SQLite's json_tree flattens the raw args JSON in C
        (~10x faster than flattening in Python and binding each row); arg sets it would number
        differently (lists holding nulls, which Perfetto skips without using up an index) and
        SQLite builds without JSON support take the Python path."""
        try:
            python_sets = self._fill_args_with_json_tree()
        except sqlite3.OperationalError:  # no JSON functions in this SQLite
            python_sets = range(len(self._arg_sets))
        insert = ("INSERT INTO args (arg_set_id, flat_key, key, int_value, string_value, real_value, value_type, "
                  "display_value) VALUES (?, ?, ?, ?, ?, ?, ?, ?)")
        rows: list[tuple[Any, ...]] = []
        for set_id in python_sets:
            prefix, payload = self._arg_sets[set_id]
            values = arg_values(payload)
            if prefix is None:
                for k, v in values.items():
                    _flatten(rows, set_id, k, k, v)
            else:
                _flatten(rows, set_id, prefix, prefix, values)
            if len(rows) >= _ARGS_BATCH:
                self._conn.executemany(insert, rows)
                rows.clear()
        self._conn.executemany(insert, rows)
        self._conn.execute("CREATE INDEX args_set ON args (arg_set_id)")

    def _fill_args_with_json_tree(self) -> list[int]:
        """Fill args from the arg sets json_tree can flatten; the ids of those it cannot."""
        conn = self._conn
        python_sets: list[int] = []

        def json_rows() -> Any:
            for set_id, (prefix, payload) in enumerate(self._arg_sets):
                text = bytes(memoryview(payload)).decode() if type(payload) is not dict else orjson.dumps(payload).decode()
                if "null" in text:
                    python_sets.append(set_id)
                else:
                    yield set_id, prefix or "", text

        conn.execute("CREATE TEMP TABLE __arg_json (arg_set_id INTEGER PRIMARY KEY, prefix TEXT, json TEXT)")
        try:
            conn.executemany("INSERT INTO __arg_json VALUES (?, ?, ?)", json_rows())
            conn.execute("CREATE TEMP TABLE __arg_leaf AS SELECT a.arg_set_id, a.prefix, t.fullkey, t.type, t.atom "
                         "FROM __arg_json a, json_tree(a.json) t WHERE t.type NOT IN ('object', 'array', 'null')")
            conn.execute("CREATE TEMP TABLE __arg_key (prefix TEXT, fullkey TEXT, flat_key TEXT, key TEXT, "
                         "PRIMARY KEY (prefix, fullkey))")
            conn.executemany("INSERT INTO __arg_key VALUES (?, ?, ?, ?)",
                             [(prefix, path, *_arg_key_names(prefix, path)) for prefix, path in
                              conn.execute("SELECT DISTINCT prefix, fullkey FROM __arg_leaf").fetchall()])
            # CROSS JOIN keeps the leaves (in arg set and document order) as the outer loop.
            conn.execute("""
                INSERT INTO args (arg_set_id, flat_key, key, int_value, string_value, real_value, value_type,
                                  display_value)
                SELECT l.arg_set_id, k.flat_key, k.key,
                       CASE l.type WHEN 'integer' THEN l.atom WHEN 'true' THEN 1 WHEN 'false' THEN 0 END,
                       CASE l.type WHEN 'text' THEN l.atom END,
                       CASE l.type WHEN 'real' THEN l.atom END,
                       CASE l.type WHEN 'integer' THEN 'int' WHEN 'real' THEN 'real' WHEN 'text' THEN 'string'
                                   ELSE 'bool' END,
                       CASE l.type WHEN 'true' THEN 'true' WHEN 'false' THEN 'false' ELSE CAST(l.atom AS TEXT) END
                FROM __arg_leaf l CROSS JOIN __arg_key k ON k.prefix = l.prefix AND k.fullkey = l.fullkey""")
        finally:
            for table in ("__arg_json", "__arg_leaf", "__arg_key"):
                conn.execute(f"DROP TABLE IF EXISTS temp.{table}")
        return python_sets

    def fill_all(self) -> None:
        """Fill every lazily filled table now (args, flow, counter)."""
        with self._lock:
            for table in self._lazy:
                self._fill(table)

    def _extract_arg(self, arg_set_id: Any, key: Any) -> Any:
        if type(arg_set_id) is not int or type(key) is not str or arg_set_id < 0:
            return None
        if arg_set_id == self._cached_set:
            prefix, values = self._cached_values
        else:
            try:
                prefix, payload = self._arg_sets[arg_set_id]
            except IndexError:
                return None
            # Queries often extract several keys of one row: decode its args once.
            values = arg_values(payload)
            self._cached_set, self._cached_values = arg_set_id, (prefix, values)
        if prefix is not None:
            if not key.startswith(prefix) or key[len(prefix):len(prefix) + 1] != ".":
                return None
            key = key[len(prefix) + 1:]
        value = lookup_arg(values, key)
        return None if value is _MISSING else _leaf(value)

    # --- queries ---------------------------------------------------------------------------
    def execute(self, sql: str) -> tuple[list[str], list[tuple[Any, ...]]]:
        """Run the one statement of `sql`, which may only read (readonly.py): its columns and
        rows. sqlite3.Error on failure, with the statement as `.statement`; QueryError for a
        query of several statements."""
        stmt = single_statement(split_statements(sql), sql)
        with self._lock:
            return self._run(stmt)

    def _run(self, stmt: str) -> tuple[list[str], list[tuple[Any, ...]]]:
        try:
            while True:
                try:
                    cur = self._conn.execute(stmt)
                    break
                except sqlite3.DatabaseError:
                    wanted = self._wanted - self._filled
                    if not wanted:
                        raise
                    for table in wanted:  # the statement reads a table not filled yet
                        self._fill(table)
            rows = cur.fetchall()
        except (sqlite3.Error, sqlite3.Warning) as e:
            e.statement = stmt  # type: ignore[attr-defined]
            raise
        columns = [d[0] for d in cur.description] if cur.description else []
        return columns, rows

    def close(self) -> None:
        self._conn.close()
