"""`phantora query / summary / diff` as users run them: output formats and the errors they
hit (one line naming the file or the query, exit 1; click's exit 2 for usage errors)."""

from __future__ import annotations

import csv
import gzip
import io

import orjson
import pytest
from click.testing import CliRunner

from phantora.cli import main

from .helpers import names, write_trace, x
from .test_summary import two_rank_trace


@pytest.fixture(autouse=True)
def builtin_engine(monkeypatch, tmp_path):
    monkeypatch.delenv("PHANTORA_TRACE_PROCESSOR", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))


def run(*args: str):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


@pytest.fixture
def trace(tmp_path):
    events = names(1, "rank 0 · node 0 · GPU 0 · H100", {1: "host"}) + [
        x(1, 1, "b, with comma", 2, 1), x(1, 1, "a", 0, 1.5, args={"n": 1})]
    return write_trace(tmp_path / "t.json", events, {"gpu": "h100"})


def test_query_prints_aligned_columns(trace):
    r = run("query", str(trace), "select name, ts, dur from slice order by ts")
    assert r.exit_code == 0, r.output
    assert r.output.splitlines() == [
        "name             ts   dur",
        "-------------  ----  ----",
        "a                 0  1500",
        "b, with comma  2000  1000",
        "(2 rows)",
    ]


def test_query_csv_and_json(trace):
    r = run("query", str(trace), "--format", "csv", "select name, dur, arg_set_id from slice order by ts")
    assert r.exit_code == 0, r.output
    assert list(csv.reader(io.StringIO(r.output))) == [["name", "dur", "arg_set_id"], ["a", "1500", "0"],
                                                      ["b, with comma", "1000", ""]]
    r = run("query", str(trace), "--format", "json", "select name, extract_arg(arg_set_id, 'args.n') as n "
                                                      "from slice order by ts")
    assert orjson.loads(r.output) == [{"name": "a", "n": 1}, {"name": "b, with comma", "n": None}]


def test_missing_file(tmp_path):
    r = run("query", str(tmp_path / "nope.json"), "select 1")
    assert r.exit_code == 1
    assert r.output.strip() == f"phantora: {tmp_path / 'nope.json'}: no such file"


def test_corrupt_and_unsupported_traces(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"traceEvents": [{"ph": "X"}, {"ph": "X", "ts": ]}')
    r = run("summary", str(bad))
    assert r.exit_code == 1 and "corrupt JSON" in r.output and str(bad) in r.output
    assert len(r.output.strip().splitlines()) == 1
    zipped = tmp_path / "trunc.json.gz"
    zipped.write_bytes(gzip.compress(b"x" * 1000)[:40])
    r = run("query", str(zipped), "select 1")
    assert r.exit_code == 1 and str(zipped) in r.output and "Traceback" not in r.output
    png = tmp_path / "image.png"
    png.write_bytes(b"\x89PNG\r\n\x1a\n" + b"\0" * 20)
    r = run("query", str(png), "select 1")
    assert r.exit_code == 1 and "not a Chrome JSON trace" in r.output


def test_sql_error_shows_the_engines_message_and_the_query(trace):
    r = run("query", str(trace), "select nope\n  from slice")
    assert r.exit_code == 1
    assert r.output.strip() == "phantora: SQL error: no such column: nope (in query: select nope from slice)"


def test_usage_errors_are_clicks(trace):
    assert run("query", str(trace)).exit_code == 2
    assert run("query", str(trace), "select 1", "--format", "xml").exit_code == 2
    assert run("diff", str(trace)).exit_code == 2


def test_summary_text_and_json(tmp_path):
    path = two_rank_trace(tmp_path)
    r = run("summary", str(path))
    assert r.exit_code == 0, r.output
    assert "Step times (ms) from step markers" in r.output
    assert "rank 0 cuda:0" in r.output and "MFU against h100-sxm-80gb dense bf16 989.4 TFLOP/s" in r.output
    assert "Unknown ops (timed as memory-bound): aten::foo.default x1" in r.output
    assert "GPU time (ms) over steps 2-3" in r.output  # the rule is stated
    data = orjson.loads(run("summary", "--json", "--whole-run", str(path)).output)
    assert data["steps"]["source"] == "step markers"
    assert data["steps"]["stats"]["mean_ns"] == 21_000
    assert data["gpus"][0]["exposed_comm_ns"] == 10_000


def test_diff_text_and_json(tmp_path):
    a = two_rank_trace(tmp_path, "a.json")
    b = two_rank_trace(tmp_path, "b.json", comm_end=35)
    r = run("diff", "--whole-run", str(a), str(b))
    assert r.exit_code == 0, r.output
    assert "comm per GPU (whole run) ms" in r.output and "1.500x" in r.output
    data = orjson.loads(run("diff", "--whole-run", "--json", str(a), str(b)).output)
    comm = next(f for f in data["figures"] if f["what"] == "comm per GPU (whole run) ns")
    assert comm["delta"] == 5_000
    r = run("diff", str(a), str(tmp_path / "missing.json"))
    assert r.exit_code == 1 and "missing.json: no such file" in r.output


def _cut_in_half(tmp_path, trace):
    text = trace.read_bytes().replace(b"},{", b"},\n{")  # one event per line, as phantora writes them
    trace.write_bytes(text)
    cut = tmp_path / "cut.json"
    cut.write_bytes(text[: len(text) // 2])
    return cut


def test_summary_query_and_diff_say_a_truncated_trace_is_truncated(tmp_path):
    # issue 19, point 6: a trace cut in half used to give partial figures with no warning
    full = two_rank_trace(tmp_path)
    cut = _cut_in_half(tmp_path, full)
    for args in (("summary", str(cut)), ("query", str(cut), "select count(*) from slice"),
                 ("diff", str(full), str(cut))):
        r = CliRunner().invoke(main, list(args), catch_exceptions=False)
        assert r.exit_code == 0, r.output
        assert f"{cut} is truncated" in r.output, (args, r.output)
    r = CliRunner().invoke(main, ["summary", str(full)], catch_exceptions=False)
    assert "truncated" not in r.output


def test_the_dashboard_of_a_truncated_trace_carries_the_warning(tmp_path):
    from phantora.view.dashboard import build_dashboard

    full = two_rank_trace(tmp_path)
    assert build_dashboard(full).summary.warnings == []
    warnings = build_dashboard(_cut_in_half(tmp_path, full)).summary.warnings
    assert len(warnings) == 1 and "is truncated" in warnings[0]
