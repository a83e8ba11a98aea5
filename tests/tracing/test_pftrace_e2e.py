"""Real runs written as .pftrace: the same content as the Chrome JSON, through the CLI too.

Two runs of a multi-rank script do not give identical traces (correlation ids follow the order
in which the ranks' records reach the simulator), so each comparison writes one run to both
formats at once: `run_trace` in this process, with the sink it opens replaced by one that
forwards every call to a Chrome JSON sink and a Perfetto protobuf sink.
"""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from pathlib import Path

import orjson
import pytest

from phantora.hardware import lookup_gpu
from phantora.query import load
from phantora.simulator import launch
from phantora.trace import TeeSink
from phantora.trace.check import check_chrome_trace, load_chrome_trace
from phantora.trace.chrome import ChromeJsonSink
from phantora.trace.perfetto import PerfettoProtoSink, load_pftrace

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "tests" / "e2e" / "scripts"
TINY_GPT = ["--layers", "2", "--embd", "128", "--heads", "2", "--seq", "128", "--batch", "2", "--steps", "2"]
TINY_DDP = ["--layers", "1", "--embd", "128", "--heads", "2", "--seq", "128", "--batch", "2", "--steps", "1",
            "--accum", "2", "--bucket-mb", "1"]


QUERIES = [
    "select p.pid, p.name, t.tid, t.name, s.name, count(*), sum(s.dur), max(s.depth) from slice s "
    "join thread_track tt on s.track_id = tt.id join thread t using (utid) join process p using (upid) "
    "group by 1, 2, 3, 4, 5 order by 1, 3, 5",
    "select so.name, si.name, count(*) from flow f join slice so on so.id = f.slice_out "
    "join slice si on si.id = f.slice_in group by 1, 2 order by 1, 2",
    "select t.name, count(*), sum(c.value) from counter c join counter_track t on c.track_id = t.id "
    "group by 1 order by 1",
]


def both_formats(stem: Path) -> tuple[TeeSink, PerfettoProtoSink]:
    """A sink writing every call to `<stem>.json` and `<stem>.pftrace`, and the latter."""
    pftrace = PerfettoProtoSink(stem.with_suffix(".pftrace"))
    return TeeSink([ChromeJsonSink(stem.with_suffix(".json")), pftrace]), pftrace


def run_both(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, command: list[str],
             nproc_per_node: int | None = None) -> tuple[dict, dict, PerfettoProtoSink]:
    sinks: list[tuple[TeeSink, PerfettoProtoSink]] = []
    monkeypatch.setattr(launch, "open_sink", lambda path: sinks.append(both_formats(Path(path))) or sinks[-1][0])
    run = launch.TraceRun(command=command, output=tmp_path / "run", gpu=lookup_gpu("h100"),
                          nproc_per_node=nproc_per_node)
    result = launch.run_trace(run)
    assert result.exit_code == 0 and not result.internal_errors, result
    assert check_chrome_trace(tmp_path / "run.json").ok
    return load_chrome_trace(tmp_path / "run.json"), load_pftrace(tmp_path / "run.pftrace"), sinks[0][1]


def multiset(events: list[dict]) -> Counter:
    return Counter(orjson.dumps(e, option=orjson.OPT_SORT_KEYS) for e in events)


def assert_same_trace(expected: dict, decoded: dict, sink: PerfettoProtoSink) -> None:
    assert sink.late_slices == sink.unbound_flows == sink.unclosed_slices == 0
    want, got = multiset(expected["traceEvents"]), multiset(decoded["traceEvents"])
    assert want == got, (list((want - got).elements())[:3], list((got - want).elements())[:3])
    assert decoded["metadata"] == expected["metadata"]


@pytest.mark.slow
def test_ddp_two_ranks_pftrace_holds_what_the_json_holds(tmp_path, monkeypatch):
    expected, decoded, sink = run_both(tmp_path, monkeypatch,
                                       [sys.executable, str(ROOT / "examples" / "ddp_train.py"), *TINY_DDP],
                                       nproc_per_node=2)
    assert_same_trace(expected, decoded, sink)
    phases = Counter(e["ph"] for e in decoded["traceEvents"])
    assert phases["s"] == phases["f"] > 0 and phases["X"] > 0 and phases["C"] > 0  # collective flows, slices, memory
    # `phantora query` answers alike on both files.
    with load(tmp_path / "run.json", engine="builtin") as js, load(tmp_path / "run.pftrace", engine="builtin") as pf:
        for sql in QUERIES:
            assert js.query(sql).rows == pf.query(sql).rows, sql


@pytest.mark.slow
def test_gpt_one_rank_pftrace_holds_what_the_json_holds(tmp_path, monkeypatch):
    expected, decoded, sink = run_both(tmp_path, monkeypatch,
                                       [sys.executable, str(ROOT / "examples" / "gpt_train.py"), *TINY_GPT])
    assert_same_trace(expected, decoded, sink)


@pytest.mark.slow
def test_nvtx_ranges_pftrace_holds_what_the_json_holds(tmp_path, monkeypatch):
    expected, decoded, sink = run_both(tmp_path, monkeypatch, [sys.executable, str(SCRIPTS / "cuda_api.py")])
    assert_same_trace(expected, decoded, sink)
    assert {e["name"] for e in decoded["traceEvents"] if e.get("cat") == "nvtx"} == {"my-range", "ctx-range"}


def phantora(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "phantora.cli", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)


def test_cli_writes_a_pftrace_even_when_the_script_raises(tmp_path):
    out = tmp_path / "raises.pftrace"
    proc = phantora("trace", "-o", str(out), "--", sys.executable, str(SCRIPTS / "raises.py"))
    assert proc.returncode == 1 and "ValueError: boom from the user script" in proc.stderr
    assert f"trace: {out}" in proc.stderr and not (tmp_path / "raises.pftrace.partial").exists()
    trace = load_pftrace(out)
    mms = [e for e in trace["traceEvents"] if e["ph"] == "X" and e.get("args", {}).get("op") == "aten::mm.default"]
    launches = {e["bind_id"] for e in trace["traceEvents"] if e.get("flow_out")}
    assert len(mms) == 3 and all(k["bind_id"] in launches for k in mms)  # each kernel linked to its launch
    assert trace["metadata"]["exit_code"] == 1 and trace["metadata"]["command"][-1].endswith("raises.py")


def test_an_unsupported_extension_is_a_one_line_error(tmp_path):
    proc = phantora("trace", "-o", str(tmp_path / "run.trace"), "--", sys.executable, "-c", "pass")
    assert proc.returncode == 2
    assert ".pftrace" in proc.stderr and ".json" in proc.stderr and "Traceback" not in proc.stderr
    assert not list(tmp_path.iterdir())
