"""The built-in engine's tables for hand-written traces; every expected row is worked out by
hand from Perfetto's JSON import rules (phantora/query/importer.py lists them)."""

from __future__ import annotations

import pytest

from phantora.query import load

from .helpers import names, write_trace, x


def rows(db, sql):
    return db.query(sql).rows


def slices_by_name(db):
    return {name: (ts, dur, depth, parent) for name, ts, dur, depth, parent in
            rows(db, "select s.name, s.ts, s.dur, s.depth, p.name from slice s left join slice p on s.parent_id = p.id")}


def test_nesting_depth_and_parent_follow_perfetto(tmp_path):
    events = names(1, "proc", {1: "main"}) + [
        x(1, 1, "D", 5, 1),  # file order does not matter: everything is sorted by time
        x(1, 1, "A", 0, 10),
        x(1, 1, "B", 1, 2),
        x(1, 1, "C", 4, 2),
        x(1, 1, "E", 10, 2),  # starts where A ends: A is closed, E is a sibling
        x(1, 1, "short", 20, 5),  # same start: the longer one encloses, whatever the file order
        x(1, 1, "long", 20, 10),
        x(1, 1, "zero", 12, 0),  # a complete slice of length 0 at E's end: after E, at depth 0
    ]
    with load(write_trace(tmp_path / "t.json", events), engine="builtin") as db:
        got = slices_by_name(db)
        assert got["A"] == (0, 10_000, 0, None)
        assert got["B"] == (1_000, 2_000, 1, "A")
        assert got["C"] == (4_000, 2_000, 1, "A")
        assert got["D"] == (5_000, 1_000, 2, "C")
        assert got["E"] == (10_000, 2_000, 0, None)
        assert got["zero"] == (12_000, 0, 0, None)
        assert got["long"] == (20_000, 10_000, 0, None)
        assert got["short"] == (20_000, 5_000, 1, "long")
        # ids follow Perfetto's processing order (time; at equal time longest first)
        order = [n for (n,) in rows(db, "select name from slice order by id")]
        assert order == ["A", "B", "C", "D", "E", "zero", "long", "short"]


def test_timestamps_are_integer_ns_without_float_error(tmp_path):
    events = [x(1, 1, "k", 6190.356, 134.829), x(1, 1, "k2", 139682.05, 0.001)]
    with load(write_trace(tmp_path / "t.json", events), engine="builtin") as db:
        assert rows(db, "select ts, dur from slice order by ts") == [(6190356, 134829), (139682050, 1)]


def test_instants_are_zero_length_slices_and_stack_on_each_other(tmp_path):
    events = [
        x(1, 1, "outer", 0, 10),
        {"ph": "i", "s": "t", "pid": 1, "tid": 1, "name": "inside", "cat": "i", "ts": 2},
        {"ph": "i", "pid": 1, "tid": 1, "name": "at start", "cat": "i", "ts": 0},  # no scope: thread
        {"ph": "i", "s": "t", "pid": 1, "tid": 1, "name": "first", "cat": "i", "ts": 30},
        {"ph": "i", "s": "t", "pid": 1, "tid": 1, "name": "second", "cat": "i", "ts": 30},
        {"ph": "I", "s": "p", "pid": 1, "tid": 1, "name": "process wide", "ts": 40},
        {"ph": "i", "s": "g", "pid": 1, "tid": 1, "name": "global", "ts": 50},
    ]
    with load(write_trace(tmp_path / "t.json", events), engine="builtin") as db:
        got = slices_by_name(db)
        assert got["inside"] == (2_000, 0, 1, "outer")
        assert got["at start"] == (0, 0, 1, "outer")  # sorted after the slice that starts with it
        assert got["first"] == (30_000, 0, 0, None)
        assert got["second"] == (30_000, 0, 1, "first")
        assert rows(db, "select t.type, p.pid from slice s join process_track t on s.track_id = t.id "
                        "join process p using (upid) where s.name = 'process wide'") == [("process_track", 1)]
        assert rows(db, "select t.type from slice s join track t on s.track_id = t.id where s.name = 'global'") \
            == [("track",)]


def test_overlapping_complete_slice_is_dropped_and_counted(tmp_path):
    events = [x(1, 1, "first", 0, 10), x(1, 1, "crosses", 5, 10), x(1, 1, "after", 20, 1)]
    with load(write_trace(tmp_path / "t.json", events), engine="builtin") as db:
        assert [n for (n,) in rows(db, "select name from slice order by ts")] == ["first", "after"]
        assert rows(db, "select value, severity from stats where name = 'slice_drop_overlapping_complete_event'") \
            == [(1, "data_loss")]
        assert db.import_stats == {"slice_drop_overlapping_complete_event": 1}


def test_begin_end_pairs_and_unfinished_begin(tmp_path):
    events = [
        {"ph": "B", "pid": 1, "tid": 1, "name": "outer", "ts": 60},
        {"ph": "B", "pid": 1, "tid": 1, "name": "inner", "ts": 61, "args": {"a": 1}},
        {"ph": "E", "pid": 1, "tid": 1, "ts": 62, "args": {"b": 2}},
        {"ph": "E", "pid": 1, "tid": 1, "ts": 65},
        {"ph": "B", "pid": 1, "tid": 1, "name": "never ends", "ts": 70},
    ]
    with load(write_trace(tmp_path / "t.json", events), engine="builtin") as db:
        got = slices_by_name(db)
        assert got["outer"] == (60_000, 5_000, 0, None)
        assert got["inner"] == (61_000, 1_000, 1, "outer")
        assert got["never ends"] == (70_000, -1, 0, None)
        # the end's args join its slice's
        assert rows(db, "select extract_arg(arg_set_id, 'args.a'), extract_arg(arg_set_id, 'args.b') "
                        "from slice where name = 'inner'") == [(1, 2)]


ARGS = {"a": 1, "b": {"c": "x", "d": [1, None, 2.5]}, "e": True, "n": None, "l": [[1, 2], [3]],
        "Input Dims": [[4, 8]], "empty": {}}
# (flat_key, key, int_value, string_value, real_value, value_type), worked out by hand
ARG_ROWS = [
    ("args.a", "args.a", 1, None, None, "int"),
    ("args.b.c", "args.b.c", None, "x", None, "string"),
    ("args.b.d", "args.b.d[0]", 1, None, None, "int"),
    ("args.b.d", "args.b.d[1]", None, None, 2.5, "real"),  # the null takes no index
    ("args.e", "args.e", 1, None, None, "bool"),
    ("args.l", "args.l[0][0]", 1, None, None, "int"),
    ("args.l", "args.l[0][1]", 2, None, None, "int"),
    ("args.l", "args.l[1][0]", 3, None, None, "int"),
    ("args.Input Dims", "args.Input Dims[0][0]", 4, None, None, "int"),
    ("args.Input Dims", "args.Input Dims[0][1]", 8, None, None, "int"),
]


def test_args_are_flattened_like_perfettos_json_importer(tmp_path):
    events = [x(1, 1, "k", 0, 1, args=ARGS), x(1, 1, "no args", 2, 1), x(1, 1, "empty args", 4, 1, args={})]
    with load(write_trace(tmp_path / "t.json", events), engine="builtin") as db:
        got = rows(db, "select flat_key, key, int_value, string_value, real_value, value_type from args "
                       "join slice using (arg_set_id) where slice.name = 'k' order by args.id")
        assert got == ARG_ROWS
        assert rows(db, "select display_value from args where key in ('args.e', 'args.b.d[1]', 'args.a') "
                        "order by key") == [("1",), ("2.5",), ("true",)]
        assert rows(db, "select arg_set_id from slice where name in ('no args', 'empty args')") == [(None,), (None,)]


def test_extract_arg_reads_every_key_the_args_table_has(tmp_path):
    events = [x(1, 1, "k", 0, 1, args=ARGS)]
    with load(write_trace(tmp_path / "t.json", events), engine="builtin") as db:
        for _flat, key, i, s, r, _type in ARG_ROWS:
            expected = next(v for v in (i, s, r) if v is not None)
            assert db.query(f"select extract_arg(arg_set_id, '{key}') from slice").scalar() == expected, key
        for missing in ("args.b", "args.n", "args.nope", "args.b.d[2]", "a", "args.l[0]"):
            assert db.query(f"select extract_arg(arg_set_id, '{missing}') from slice").scalar() is None, missing


def test_counters_get_a_process_track_per_name_and_key(tmp_path):
    events = names(7, "rank 0", {}) + [
        {"ph": "C", "pid": 7, "tid": 0, "name": "mem", "ts": 2, "args": {"alloc": 5, "res": 9}},
        {"ph": "C", "pid": 7, "tid": 0, "name": "mem", "ts": 1, "args": {"alloc": 3, "res": 8}},
        {"ph": "C", "pid": 7, "tid": 0, "name": "mem", "id": 4, "ts": 1, "args": {"alloc": "1.5"}},
    ]
    with load(write_trace(tmp_path / "t.json", events), engine="builtin") as db:
        got = rows(db, "select t.name, p.pid, c.ts, c.value from counter c join process_counter_track t "
                       "on c.track_id = t.id join process p using (upid) order by t.name, c.ts")
        assert got == [("mem alloc", 7, 1000, 3.0), ("mem alloc", 7, 2000, 5.0),
                       ("mem id: 4 alloc", 7, 1000, 1.5),
                       ("mem res", 7, 1000, 8.0), ("mem res", 7, 2000, 9.0)]
        assert {n for (n,) in rows(db, "select name from counter_track")} == {"mem alloc", "mem res", "mem id: 4 alloc"}


def test_flows_v2_bind_to_their_slices(tmp_path):
    events = [
        x(1, 1, "launch", 0, 5, bind_id=5, flow_out=True),
        x(1, 10, "kernel", 3, 10, bind_id=5, flow_in=True),
        x(1, 1, "launch2", 6, 1, bind_id="1f", flow_out=True),  # string ids are hex
        x(1, 10, "kernel2", 14, 1, bind_id=31, flow_in=True),
        x(1, 10, "orphan", 20, 1, bind_id=99, flow_in=True),
    ]
    with load(write_trace(tmp_path / "t.json", events), engine="builtin") as db:
        got = rows(db, "select o.name, i.name, f.trace_id from flow f join slice o on f.slice_out = o.id "
                       "join slice i on f.slice_in = i.id order by o.ts")
        assert got == [("launch", "kernel", 5), ("launch2", "kernel2", 31)]
        assert db.import_stats == {"flow_end_without_start": 1}


def test_flows_v1_bind_to_enclosing_or_next_slice(tmp_path):
    events = [
        x(1, 1, "send", 0, 10),
        x(2, 1, "recv", 5, 10),
        x(2, 1, "later", 30, 1),
        {"ph": "s", "id": "c1", "pid": 1, "tid": 1, "ts": 0, "name": "all_reduce #1", "cat": "collective", "bp": "e"},
        {"ph": "f", "id": "c1", "pid": 2, "tid": 1, "ts": 5, "name": "all_reduce #1", "cat": "collective", "bp": "e"},
        {"ph": "s", "id": 2, "pid": 1, "tid": 1, "ts": 3, "name": "n", "cat": "x"},
        {"ph": "f", "id": 2, "pid": 2, "tid": 1, "ts": 20, "name": "n", "cat": "x"},  # no bp: the next slice
    ]
    with load(write_trace(tmp_path / "t.json", events), engine="builtin") as db:
        got = rows(db, "select o.name, i.name, f.trace_id, extract_arg(f.arg_set_id, 'name'), "
                       "extract_arg(f.arg_set_id, 'cat') from flow f join slice o on f.slice_out = o.id "
                       "join slice i on f.slice_in = i.id order by i.ts")
        assert got == [("send", "recv", 0xC1, "all_reduce #1", "collective"), ("send", "later", 2, "n", "x")]
        assert rows(db, "select key, string_value from args where arg_set_id = "
                        "(select arg_set_id from flow where trace_id = 2) order by key") == [("cat", "x"), ("name", "n")]


def test_processes_threads_and_thread_tracks(tmp_path):
    events = names(3, "rank 2 · node 0 · GPU 2 · H100", {1: "host", 10: "cuda:2 default stream"}) + [
        x(3, 1, "op", 0, 1), x(3, 10, "kern", 1, 1)]
    with load(write_trace(tmp_path / "t.json", events), engine="builtin") as db:
        assert rows(db, "select pid, name from process where pid = 3") == [(3, "rank 2 · node 0 · GPU 2 · H100")]
        got = rows(db, "select s.name, tt.name, th.tid, th.name, p.pid from slice s "
                       "join thread_track tt on s.track_id = tt.id join thread th using (utid) "
                       "join process p using (upid) order by s.ts")
        # as in Perfetto, a thread track has no name of its own: the thread's name is thread.name
        assert got == [("op", None, 1, "host", 3), ("kern", None, 10, "cuda:2 default stream", 3)]
        assert rows(db, "select upid, pid from process where upid = 0") == [(0, 0)]


@pytest.mark.parametrize("gz", [False, True])
def test_gzip_is_detected_by_content_and_metadata_is_a_table(tmp_path, gz):
    meta = {"gpu": "h100-sxm-80gb", "simulated_ns": 139682050, "wall_seconds": 10.5, "command": ["python", "x.py"],
            "ok": True, "nothing": None}
    path = write_trace(tmp_path / "t.json", [x(1, 1, "k", 0, 1)], meta, gz=gz)  # .json name either way
    with load(path, engine="builtin") as db:
        assert db.metadata == meta
        assert db.query("select count(*) from slice").scalar() == 1
        got = {r[0]: r[1:] for r in rows(db, "select name, int_value, str_value from metadata")}
        assert got["gpu"] == (None, "h100-sxm-80gb")
        assert got["simulated_ns"] == (139682050, None)
        assert got["wall_seconds"] == (None, "10.5")
        assert got["command"] == (None, '["python","x.py"]')
        assert got["ok"] == (1, None)
        assert got["nothing"] == (None, None)
        assert got["trace_type"] == (None, "json")


def test_a_trace_cut_off_mid_write_is_read_up_to_its_last_event(tmp_path):
    full = write_trace(tmp_path / "full.json", [x(1, 1, f"s{i}", i, 1) for i in range(5)])
    text = full.read_bytes().replace(b"},{", b"},\n{")
    cut = tmp_path / "cut.json"
    cut.write_bytes(text[: text.index(b'"s4"')])  # the last event is half written
    with load(cut, engine="builtin") as db:
        assert [n for (n,) in rows(db, "select name from slice order by ts")] == ["s0", "s1", "s2", "s3"]
        assert db.import_stats.get("json_truncated_file") == 1


def test_a_list_of_events_is_a_trace_too(tmp_path):
    path = tmp_path / "list.json"
    path.write_bytes(b'[{"ph": "X", "pid": 1, "tid": 1, "name": "k", "ts": 1, "dur": 2}]')
    with load(path, engine="builtin") as db:
        assert rows(db, "select name, ts, dur from slice") == [("k", 1000, 2000)]
        assert db.metadata == {}


NO_NULL_ARGS = [
    {"a": 1, "b": {"c": "x", "d": [1, 2.5]}, "e": True, "f": False, "l": [[1, 2], [3]], "Input Dims": [[4, 8]],
     "b.c": {'x"y': "quoted"}, "big": 2**63 - 1, "neg": -2.5e-300, "s": "a \\ b \u00e9"},
    {"op": "aten::mm.default", "shapes": [[1024, 768], [768, 3072]], "flops": 4831838208.0},
]


def test_args_from_sqlites_json_tree_equal_the_python_flattening(tmp_path, monkeypatch):
    events = [x(1, 1, f"k{i}", i, 1, args=a) for i, a in enumerate(NO_NULL_ARGS)]
    events += [{"ph": "s", "id": 1, "pid": 1, "tid": 1, "ts": 0, "name": "n", "cat": "c"},
               {"ph": "f", "id": 1, "pid": 1, "tid": 1, "ts": 1, "name": "n", "cat": "c", "bp": "e"}]
    path = write_trace(tmp_path / "t.json", events)
    query = ("select arg_set_id, flat_key, key, int_value, string_value, real_value, value_type, display_value "
             "from args order by arg_set_id, id")
    with load(path, engine="builtin") as db:
        fast = rows(db, query)
        assert ("args.b.c.x\"y", "args.b.c.x\"y", None, "quoted") in [r[1:5] for r in fast]
        assert ("args.Input Dims", "args.Input Dims[0][1]", 8) in [r[1:4] for r in fast]
        assert ("args.f", "args.f", 0, None, None, "bool", "false") in [r[1:] for r in fast]
    from phantora.query import sqlite_engine

    def no_json(self):
        raise sqlite_engine.sqlite3.OperationalError("no such table: json_tree")

    monkeypatch.setattr(sqlite_engine.SqliteTraceDB, "_fill_args_with_json_tree", no_json)
    with load(path, engine="builtin") as db:
        assert rows(db, query) == fast


def test_pid_0_is_a_process_apart_from_perfettos_placeholders(tmp_path):
    events = names(0, "simulator (rollbacks, corrections)", {1: "network rollbacks"}) + [
        {"ph": "i", "s": "t", "pid": 0, "tid": 1, "name": "rollback: x", "cat": "rollback", "ts": 5},
        x(7, 3, "op", 0, 1)]
    with load(write_trace(tmp_path / "t.json", events), engine="builtin") as db:
        # upid 0 / utid 0 are Perfetto's idle placeholders (the thread in no process)
        assert rows(db, "select upid, pid, name from process order by upid") == [
            (0, 0, None), (1, 0, "simulator (rollbacks, corrections)"), (2, 7, None)]
        assert rows(db, "select tid, upid from thread where utid = 0") == [(0, None)]
        assert rows(db, "select p.name from slice s join thread_track tt on s.track_id = tt.id "
                        "join thread using (utid) join process p using (upid) where s.category = 'rollback'") \
            == [("simulator (rollbacks, corrections)",)]
        # every process has its main thread (tid = pid), as Perfetto creates it
        assert rows(db, "select p.pid, t.tid from thread t join process p using (upid) where t.tid = p.pid "
                        "order by p.pid") == [(0, 0), (7, 7)]
