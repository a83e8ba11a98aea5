"""The dashboard's JSON documents: counters read by SQL from a hand-built trace, thinning, and
the summary document carrying `phantora summary`'s own figures."""

from __future__ import annotations

import json

import orjson

from phantora.query import load
from phantora.query.summary import summarize
from phantora.view.dashboard import TOP_KERNELS, build_dashboard, read_series, thin
from phantora.view.server import ViewUrls

from .helpers import SAMPLE_TRACE


def meta(pid, name):
    return {"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": name}}


def counter(pid, name, ts_us, **values):
    return {"ph": "C", "pid": pid, "tid": 0, "name": name, "ts": ts_us, "args": values}


def tiny_trace(tmp_path):
    events = [
        meta(1, "rank 0 · node 0 · GPU 0 · H100"), meta(2, "rank 1 · node 0 · GPU 1 · H100"),
        meta(1000000, "network"), meta(0, "simulator (rollbacks, corrections)"),
        counter(1, "cuda:0 memory", 1.0, allocated=100, reserved=200),
        counter(1, "cuda:0 memory", 3.0, allocated=50, reserved=200),
        counter(2, "cuda:1 memory", 2.0, allocated=70, reserved=80),
        counter(1000000, "link gpu->nvswitch [node0 gpu0]", 1.0, **{"utilization": 0.5, "GB/s": 185.0}),
        counter(1000000, "link gpu->nvswitch [node0 gpu0]", 2.0, **{"utilization": 0.0, "GB/s": 0.0}),
        {"ph": "i", "s": "t", "pid": 0, "tid": 1, "name": "rollback: ar#3", "cat": "rollback", "ts": 2.5},
        # a counter of another process named like a link must not count as one
        counter(1, "link fake", 1.0, utilization=1.0),
    ]
    path = tmp_path / "tiny.json"
    path.write_bytes(orjson.dumps({"traceEvents": events, "metadata": {"simulated_ns": 4000}}))
    return path


def test_series_from_counters_and_rollback_instants(tmp_path):
    with load(tiny_trace(tmp_path)) as db:
        series = read_series(db)
    assert series.span_ms == 0.004
    mem = {(m.rank, m.device): m for m in series.memory}
    assert set(mem) == {(0, 0), (1, 1)}
    assert mem[(0, 0)].allocated == [(0.001, 100), (0.003, 50)]
    assert mem[(0, 0)].reserved == [(0.001, 200), (0.003, 200)]
    assert mem[(1, 1)].allocated == [(0.002, 70)]
    assert [(link.name, link.points) for link in series.links] == [
        ("gpu->nvswitch [node0 gpu0]", [(0.001, 0.5, 185.0), (0.002, 0.0, 0.0)])]
    assert [(r.ms, r.name) for r in series.rollbacks] == [(0.0025, "rollback: ar#3")]


def test_thin_keeps_peaks_order_and_the_last_point():
    points = [(float(t), float(t % 97)) for t in range(10_000)]
    points[5000] = (5000.0, 1e9)
    out = thin(points, limit=300)
    assert len(out) <= 300 + 3
    assert out == sorted(out) and out[0] == points[0] and out[-1] == points[-1]
    assert (5000.0, 1e9) in out
    short = [(0.0, 1.0), (1.0, 2.0)]
    assert thin(short, limit=300) == short


def test_summary_document_carries_phantora_summary_figures():
    dashboard = build_dashboard(SAMPLE_TRACE)
    doc = json.loads(dashboard.api_documents(ViewUrls("d", "t", None))["summary.json"])
    with load(SAMPLE_TRACE) as db:
        s = summarize(db, top=TOP_KERNELS)
    assert doc["file"] == SAMPLE_TRACE.name and doc["trace_bytes"] == SAMPLE_TRACE.stat().st_size
    assert doc["steps"]["mean_ms"] == s.steps.stats.mean_ns / 1e6
    assert doc["steps"]["step_ms"] == [d / 1e6 for d in s.steps.overall_ns]
    assert doc["throughput"]["mfu"] == s.overall.mfu and doc["throughput"]["peak"] == s.peak
    assert [(g["rank"], g["compute_ms"], g["exposed_comm_ms"], g["idle_ms"]) for g in doc["gpus"]] == [
        (g.rank, g.compute_ns / 1e6, g.exposed_comm_ns / 1e6, g.idle_ns / 1e6) for g in s.gpus]
    assert [k["name"] for k in doc["top_kernels"]] == [k.name for k in s.top_kernels]
    assert doc["rollbacks"] == {"count": s.rollbacks, "stale_replies": s.stale_replies}
    assert doc["run"]["ranks"] == 2 and doc["run"]["gpu"] == "h100-sxm-80gb"
