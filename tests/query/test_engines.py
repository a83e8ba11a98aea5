"""TraceDB's engines: the built-in one's SQL behaviour, and how the trace processor engine is
found and driven (with a stand-in for trace_processor_shell: no binary exists on this
machine and none can be downloaded)."""

from __future__ import annotations

import sys
import types

import pytest

from phantora.query import EngineUnavailable, QueryError, TraceFileError, load
from phantora.query import trace_processor as tp_module

from .helpers import write_trace, x


@pytest.fixture
def trace(tmp_path):
    events = [x(1, 1, f"op{i}", i * 10, 5, args={"n": i, "shape": [i, 2]}, bind_id=i + 1, flow_out=True)
              for i in range(4)]
    events += [x(1, 10, f"kernel{i}", i * 10 + 1, 3, bind_id=i + 1, flow_in=True) for i in range(4)]
    events += [{"ph": "C", "pid": 1, "tid": 0, "name": "mem", "ts": i, "args": {"v": i}} for i in range(3)]
    return write_trace(tmp_path / "t.json", events, {"gpu": "h100"})


@pytest.fixture
def no_trace_processor(monkeypatch, tmp_path):
    monkeypatch.delenv(tp_module.ENV_VAR, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # no cached perfetto download there


def test_auto_uses_the_builtin_engine_without_a_binary(trace, no_trace_processor):
    with load(trace) as db:
        assert db.engine == "builtin"


def test_tables_filled_on_first_read_answer_like_the_others(trace):
    with load(trace, engine="builtin") as db:
        # args, flow and counter are filled when a statement first reads them, even inside a
        # subquery or a common table expression; EXTRACT_ARG agrees with the args table
        assert db.query("select count(*) from slice where id in (select slice_in from flow)").scalar() == 4
        assert db.query("with arg_view as (select * from args) "
                        "select count(*) from arg_view where key = 'args.n'").scalar() == 4
        joined = db.query("select s.name, a.int_value from slice s join args a using (arg_set_id) "
                          "where a.key = 'args.shape[0]' order by s.id").rows
        extracted = db.query("select name, extract_arg(arg_set_id, 'args.shape[0]') from slice "
                             "where arg_set_id is not null order by id").rows
        assert joined == extracted == [(f"op{i}", i) for i in range(4)]
        assert db.query("select sum(value) from counter").scalar() == 3.0


def test_semicolons_inside_strings_and_comments_do_not_split_a_statement(trace):
    with load(trace, engine="builtin") as db:
        r = db.query("select 41 + 1 as y -- a comment; with a semicolon\n;")
        assert (r.columns, r.rows) == (["y"], [(42,)])
        assert db.query("select 'a;b' as s").rows == [("a;b",)]


def test_sql_errors_carry_the_engines_message_and_the_statement(trace):
    with load(trace, engine="builtin") as db:
        with pytest.raises(QueryError) as e:
            db.query("select nope from slice;")
        assert e.value.message == "no such column: nope"
        assert e.value.sql == "select nope from slice;"


def test_a_missing_or_unreadable_trace_is_a_trace_file_error(tmp_path):
    with pytest.raises(TraceFileError, match="no such file"):
        load(tmp_path / "missing.json", engine="builtin")
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(TraceFileError, match="not a Chrome JSON trace"):
        load(tmp_path / "notes.txt", engine="builtin")
    (tmp_path / "obj.json").write_text('{"traceEvents": {"a": 1}}')
    with pytest.raises(TraceFileError, match="not a Chrome JSON trace"):
        load(tmp_path / "obj.json", engine="builtin")
    (tmp_path / "bad.json").write_text('{"traceEvents": [{"ph": "X"} {')
    with pytest.raises(TraceFileError, match="corrupt JSON"):
        load(tmp_path / "bad.json", engine="builtin")


# --- the trace processor engine ------------------------------------------------------------------
def _executable(path):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\nexit 0\n")
    path.chmod(0o755)
    return path


def test_env_var_names_the_binary(monkeypatch, tmp_path):
    binary = _executable(tmp_path / "tp" / "trace_processor_shell")
    monkeypatch.setenv(tp_module.ENV_VAR, str(binary))
    assert tp_module.find_binary() == binary
    monkeypatch.setenv(tp_module.ENV_VAR, str(tmp_path / "nope"))
    with pytest.raises(EngineUnavailable, match="not an executable file"):
        tp_module.find_binary()


def test_the_perfetto_packages_cached_download_is_found_without_downloading(monkeypatch, tmp_path):
    manifest = types.ModuleType("perfetto.prebuilts.manifests.trace_processor_shell")
    import platform

    manifest.TRACE_PROCESSOR_SHELL_MANIFEST = [{
        "file_name": "trace_processor_shell", "sha256": "ab" * 32, "platform": sys.platform.lower(),
        "machine": [platform.machine().lower()], "url": "https://example.invalid/never-fetched"}]
    for name in ("perfetto", "perfetto.prebuilts", "perfetto.prebuilts.manifests"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, manifest.__name__, manifest)
    monkeypatch.delenv(tp_module.ENV_VAR, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert tp_module.find_binary() is None  # not downloaded yet: nothing, and no download
    cached = _executable(tmp_path / ".local/share/perfetto/prebuilts" / f"trace_processor_shell-{'ab' * 8}")
    assert tp_module.find_binary() == cached


def test_forcing_the_trace_processor_without_a_binary_says_what_to_do(trace, no_trace_processor):
    with pytest.raises(EngineUnavailable, match="PHANTORA_TRACE_PROCESSOR"):
        load(trace, engine="trace_processor")


class _FakeResult:
    def __init__(self, columns, cells):
        self.column_names = columns
        self.cells = cells


class _FakeTraceProcessor:
    """Stands in for perfetto.trace_processor.TraceProcessor (which would start the binary)."""

    instances: list = []

    def __init__(self, trace, config):
        self.trace, self.bin_path, self.closed = trace, config.bin_path, False
        _FakeTraceProcessor.instances.append(self)

    def query(self, sql):
        if "nope" in sql:
            raise Exception("Traceback (most recent call last):\n  no such column: nope")
        return _FakeResult(["name", "dur"], ["a", 1, "b", None])

    def close(self):
        self.closed = True


def test_trace_processor_engine_drives_perfettos_python_api(monkeypatch, trace, tmp_path):
    binary = _executable(tmp_path / "trace_processor_shell")
    monkeypatch.setenv(tp_module.ENV_VAR, str(binary))
    api = types.ModuleType("perfetto.trace_processor")
    api.TraceProcessor = _FakeTraceProcessor
    api.TraceProcessorConfig = lambda bin_path: types.SimpleNamespace(bin_path=bin_path)
    monkeypatch.setitem(sys.modules, "perfetto", types.ModuleType("perfetto"))
    monkeypatch.setitem(sys.modules, "perfetto.trace_processor", api)
    with load(trace) as db:
        fake = _FakeTraceProcessor.instances[-1]
        assert db.engine == "trace_processor"
        assert (fake.trace, fake.bin_path) == (str(trace), str(binary))
        assert db.metadata == {"gpu": "h100"}  # read from the file: Perfetto skips JSON metadata
        r = db.query("select name, dur from slice")
        assert (r.columns, r.rows) == (["name", "dur"], [("a", 1), ("b", None)])
        with pytest.raises(QueryError, match="no such column: nope"):
            db.query("select nope from slice")
    assert fake.closed


# --- .pftrace input ---------------------------------------------------------------------------
PFTRACE_HEAD = b"\x0a\x02\x08\x01"  # a Trace.packet field: what a protobuf trace starts with


def test_pftrace_without_a_reader_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "phantora.trace.perfetto", None)  # as if the module did not exist
    path = tmp_path / "run.pftrace"
    path.write_bytes(PFTRACE_HEAD)
    with pytest.raises(TraceFileError, match=r"cannot read \.pftrace files yet .* write the trace as \.json"):
        load(path, engine="builtin")


def test_pftrace_events_from_the_reader_are_imported(monkeypatch, tmp_path):
    reader = types.ModuleType("phantora.trace.perfetto")
    seen = []

    def read_pftrace(path):
        seen.append(path)
        events = iter([{"ph": "X", "pid": 1, "tid": 1, "name": "k", "ts": 1.5, "dur": 2.0, "args": {"flops": 7}}])
        return events, {"gpu": "h100"}

    reader.read_pftrace = read_pftrace
    monkeypatch.setitem(sys.modules, "phantora.trace.perfetto", reader)
    path = tmp_path / "run.pftrace"
    path.write_bytes(PFTRACE_HEAD)
    with load(path, engine="builtin") as db:
        assert seen == [path]
        assert db.query("select name, ts, dur, extract_arg(arg_set_id, 'args.flops') from slice").rows == \
            [("k", 1500, 2000, 7)]
        assert db.metadata == {"gpu": "h100"}
        assert db.query("select str_value from metadata where name = 'trace_type'").scalar() == "proto"
