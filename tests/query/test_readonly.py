"""`phantora query` only reads (issue 19, point 7): one statement per query, nothing that writes,
attaches a file or changes the database's settings; reading pragmas and ordinary SELECTs work."""

from __future__ import annotations

import os

import pytest
from click.testing import CliRunner

from phantora.cli import main
from phantora.query import QueryError, load
from phantora.query.readonly import check_statement

from .helpers import names, write_trace, x


@pytest.fixture(autouse=True)
def builtin_engine(monkeypatch, tmp_path):
    monkeypatch.delenv("PHANTORA_TRACE_PROCESSOR", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))


@pytest.fixture
def trace(tmp_path):
    events = names(1, "rank 0", {1: "host"}) + [x(1, 1, "a", 0, 1.5), x(1, 1, "b", 2, 1)]
    return write_trace(tmp_path / "t.json", events, {"gpu": "h100"})


def run(*args: str):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def test_attach_creates_no_file_and_fails_with_one_line(trace, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    r = run("query", str(trace), "ATTACH DATABASE 'evil.db' AS evil")
    assert r.exit_code == 1
    assert "SQL error" in r.output and len(r.output.strip().splitlines()) == 1, r.output
    assert not (tmp_path / "evil.db").exists()
    assert os.listdir(tmp_path) == ["t.json"] or set(os.listdir(tmp_path)) <= {"t.json", "home"}


@pytest.mark.parametrize("sql", [
    "insert into slice (ts, dur, name) values (1, 2, 'x')",
    "update slice set name = 'x'",
    "delete from slice",
    "drop table slice",
    "create table t (a)",
    "create temp view v as select 1",
    "pragma journal_mode = wal",
    "pragma writable_schema = 1",
    "with s as (select 1) insert into slice (ts) select * from s",
])
def test_statements_that_change_state_are_refused(trace, sql):
    with load(trace, engine="builtin") as db:
        with pytest.raises(QueryError):
            db.query(sql)
        assert db.query("select count(*) from slice").scalar() == 2  # nothing changed
        assert db.query("select group_concat(name) from slice order by ts").scalar() in ("a,b", "b,a")


def test_several_statements_are_refused_not_half_run(trace):
    with load(trace, engine="builtin") as db:
        with pytest.raises(QueryError, match="one SQL statement; this one has 2"):
            db.query("select 1; select count(*) from slice")


def test_reading_queries_pragmas_and_lazy_tables_still_work(trace):
    with load(trace, engine="builtin") as db:
        assert db.query("select count(*) from slice;").scalar() == 2  # a trailing ';' is one statement
        assert db.query("with s as (select dur from slice) select sum(dur) from s").scalar() == 2500
        assert "name" in [r[1] for r in db.query("pragma table_info(slice)").rows]
        assert db.query("select count(*) from args").scalar() >= 0  # filled on first read
        assert db.query("select replace(name, 'a', 'z') from slice order by ts").rows[0] == ("z",)


@pytest.mark.parametrize("sql", ["ATTACH 'x.db' AS x", "select 1; attach 'x.db' as x", "REPLACE INTO t VALUES (1)",
                                 "PRAGMA writable_schema=1", "with a as (select 1) delete from slice"])
def test_screening_for_trace_processor_refuses_writes(sql):
    with pytest.raises(QueryError):
        check_statement(sql)


@pytest.mark.parametrize("sql", ["select replace(name, 'x', 'y') from slice", "SELECT 'drop table x' AS s",
                                 "with t as (select 1) select * from t", "values (1)",
                                 "select name -- delete\nfrom slice"])
def test_screening_lets_reads_through(sql):
    check_statement(sql)
