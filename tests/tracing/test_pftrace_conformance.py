"""Our .pftrace traces, imported by a real Perfetto trace processor: no import problems, and the
slices, flows, counters, names and metadata of the Chrome JSON trace of the same run.

The trace processor is the WASM build of Perfetto v20.1 (perfetto_wasm.py; see
test_perfetto_conformance.py for its quirks). Each example runs once, written in both formats
(a multi-rank run is not repeatable event for event), and the JSON is read by the rules of its
format (conformance.contents_of_json), so the expectation does not come from the .pftrace code.
Two differences from the JSON's conformance checks, both from the formats:
- durations are exact: a .pftrace has integer ns begin and end times, where v20.1 truncates a
  JSON dur * 1000, so the JSON's durations are read to the nearest ns here;
- an arrow is compared by the two slices it links, not its direction: a collective arrow whose
  destination slice started first is written so that the trace processor meets its start first
  (perfetto.py), and v20.1 then points it the other way (current Perfetto orders both formats'
  arrows by their slices' start times).
"""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import orjson
import pytest

from phantora.hardware import lookup_gpu
from phantora.simulator import launch
from phantora.trace import TeeSink
from phantora.trace.check import load_chrome_trace
from phantora.trace.chrome import ChromeJsonSink
from phantora.trace.perfetto import PerfettoProtoSink

from . import conformance
from .conformance import TraceContents, contents_of_json, import_with_trace_processor
from .conftest import EXAMPLES, ROOT
from .perfetto_wasm import WasmTraceProcessor
from .test_perfetto_conformance import names_v20_may_misattribute

RUNS = ["gpt", "ddp", "pp"]


@pytest.fixture(scope="session")
def both_formats(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], tuple[Path, Path]]:
    """both_formats("ddp"): (.json, .pftrace) of one tiny run of that example."""
    made: dict[str, tuple[Path, Path]] = {}
    folder = tmp_path_factory.mktemp("both_formats")

    def make(name: str) -> tuple[Path, Path]:
        if name not in made:
            script, args, ranks = EXAMPLES[name]
            stem = folder / name
            with pytest.MonkeyPatch.context() as mp:
                mp.setattr(launch, "open_sink", lambda path: TeeSink([ChromeJsonSink(stem.with_suffix(".json")),
                                                                      PerfettoProtoSink(stem.with_suffix(".pftrace"))]))
                result = launch.run_trace(launch.TraceRun(command=[sys.executable, str(ROOT / script), *args],
                                                          output=stem, gpu=lookup_gpu("h100"), nproc_per_node=ranks))
            assert result.exit_code == 0 and not result.internal_errors, result
            made[name] = (stem.with_suffix(".json"), stem.with_suffix(".pftrace"))
        return made[name]

    return make


def expected(json_path: Path) -> TraceContents:
    """The JSON's contents with durations to the nearest ns (what the .pftrace holds exactly)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(conformance, "dur_ns_v20", conformance.ts_ns)
        return contents_of_json(json_path)


def undirected(flows: Counter) -> Counter:
    return Counter(tuple(sorted(ends)) for ends in flows.elements())


@pytest.mark.slow
@pytest.mark.parametrize("name", RUNS)
def test_pftrace_imports_with_the_contents_of_the_json(name, perfetto_tp: WasmTraceProcessor, both_formats):
    json_path, pftrace = both_formats(name)
    imported = import_with_trace_processor(perfetto_tp, pftrace)
    assert imported.problems == []
    ours, theirs = expected(json_path), imported.contents
    assert ours.slices and ours.counters and ours.flows
    assert theirs.slices == ours.slices  # each slice and instant: pid, tid, ts, dur, name, category
    assert theirs.counters == ours.counters
    assert undirected(theirs.flows) == undirected(ours.flows)
    assert theirs.process_names == ours.process_names
    # The trace processor's own idle thread (tid 0, no process) is named "swapper" in a
    # protobuf trace; it is not one of ours.
    assert theirs.thread_names.pop((None, 0), "swapper") == "swapper"
    unattributable = names_v20_may_misattribute(ours)
    assert {k: v for k, v in theirs.thread_names.items() if k not in unattributable} == \
        {k: v for k, v in ours.thread_names.items() if k not in unattributable}


@pytest.mark.slow
def test_pftrace_metadata_reaches_the_trace_processor(perfetto_tp: WasmTraceProcessor, both_formats):
    json_path, pftrace = both_formats("gpt")
    run = perfetto_tp.query(pftrace, ["select name, str_value, int_value from metadata where name like 'cr-%'"])
    got = {name[len("cr-"):]: (s if s is not None else i) for name, s, i in run.results[0].rows}
    want = load_chrome_trace(json_path)["metadata"]
    # Strings and ints are stored as such (bools as ints); anything else (lists, floats, null)
    # as JSON text.
    assert got == {k: v if isinstance(v, (str, int)) else orjson.dumps(v).decode() for k, v in want.items()}
