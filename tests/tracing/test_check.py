"""check_chrome_trace's flow rules, each modelled on what Perfetto's trace processor does with
such a trace (test_perfetto_conformance.py shows the trace processor doing it)."""

from __future__ import annotations

import json
from pathlib import Path

from phantora.trace.check import check_chrome_trace
from phantora.trace.chrome import BIND_ID_BASE


def _trace(tmp_path: Path, events: list[dict]) -> Path:
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": events}))
    return path


def _collective(bind_id: object, s_ts: float = 2, f_ts: float = 2) -> list[dict]:
    """A launch flow into rank 0's collective slice, and an arrow from it to rank 1's."""
    return [
        {"ph": "X", "pid": 1, "tid": 1, "name": "launch", "ts": 0, "dur": 1, "bind_id": bind_id, "flow_out": True},
        {"ph": "X", "pid": 1, "tid": 11, "name": "allreduce", "ts": 2, "dur": 3, "bind_id": bind_id, "flow_in": True},
        {"ph": "X", "pid": 2, "tid": 11, "name": "allreduce", "ts": 1, "dur": 4},
        {"ph": "s", "id": "c1", "cat": "collective", "name": "ar", "pid": 1, "tid": 11, "ts": s_ts, "bp": "e"},
        {"ph": "f", "id": "c1", "cat": "collective", "name": "ar", "pid": 2, "tid": 11, "ts": f_ts, "bp": "e"},
    ]


def test_bind_ids_clear_of_v1_flow_ids_pass(tmp_path):
    check = check_chrome_trace(_trace(tmp_path, _collective(BIND_ID_BASE + 1)))
    assert check.ok, check.problems
    assert check.flows == 2


def test_a_bind_id_perfetto_also_gives_a_v1_flow_is_a_problem(tmp_path):
    # One v1 flow: Perfetto calls it 0, the id of the launch flow too ("0" read as hex).
    for bind_id in (0, "0"):
        problems = check_chrome_trace(_trace(tmp_path, _collective(bind_id))).problems
        assert problems == [f"flow bind_id {bind_id!r} collides with Perfetto's ids for the 1 v1 flows (0 to 0): "
                            "start bind_ids at 2^32"]


def test_a_bind_id_that_is_not_hex_is_a_problem(tmp_path):
    problems = check_chrome_trace(_trace(tmp_path, _collective("launch-7"))).problems
    assert problems == ["flow bind_id 'launch-7' is neither an integer nor hex: Perfetto ignores it"]


def test_a_flow_that_ends_before_it_starts_is_a_problem(tmp_path):
    problems = check_chrome_trace(_trace(tmp_path, _collective(BIND_ID_BASE, s_ts=3, f_ts=2))).problems
    assert problems == ["flow ('v1', 'c1', 'collective', 'ar') ends at 2 us, before it starts at 3 us: "
                        "Perfetto meets the end first and drops the arrow"]


def test_a_flow_event_outside_every_slice_of_its_thread_is_a_problem(tmp_path):
    # rank 1's slice lasts from 1 to 5 us: an arrow ending at 6 us has nothing to bind to.
    problems = check_chrome_trace(_trace(tmp_path, _collective(BIND_ID_BASE, f_ts=6))).problems
    assert problems == ["flow ('v1', 'c1', 'collective', 'ar'): no slice on track (2, 11) at 6000 ns to bind to"]
