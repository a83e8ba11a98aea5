"""The Perfetto protobuf sink, driven directly: content, ordering, interning, streaming.

The raw file is read back with the generated protos (`Trace.FromString`), independently of
read_pftrace, so the checks on packets do not trust the reader; the round-trip checks compare
the reader's output with what the Chrome JSON sink writes for the same calls.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from pathlib import Path

import orjson
import pytest
from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import Trace, TracePacket, TrackEvent

from phantora.trace import TeeSink, TraceSink, UnsupportedTraceFormat, open_sink
from phantora.trace.check import load_chrome_trace
from phantora.trace.chrome import ChromeJsonSink
from phantora.trace.perfetto import PerfettoProtoSink, PftraceFormatError, load_pftrace, read_pftrace

BEGIN, END, INSTANT = TrackEvent.TYPE_SLICE_BEGIN, TrackEvent.TYPE_SLICE_END, TrackEvent.TYPE_INSTANT


def multiset(events: list[dict]) -> Counter:
    return Counter(orjson.dumps(e, option=orjson.OPT_SORT_KEYS) for e in events)


def packets(path: Path) -> list[TracePacket]:
    return list(Trace.FromString(path.read_bytes()).packet)


def track_names(pkts: list[TracePacket]) -> dict[int, tuple[int, int]]:
    """Thread track uuid -> (pid, tid)."""
    return {p.track_descriptor.uuid: (p.track_descriptor.thread.pid, p.track_descriptor.thread.tid)
            for p in pkts if p.HasField("track_descriptor") and p.track_descriptor.HasField("thread")}


def slices_in_file_order(path: Path, sort: bool = False) -> dict[tuple[int, int], list[tuple[str, int, int, int]]]:
    """Per (pid, tid): (name, ts, dur, depth) of each slice, pairing begins and ends with a stack
    in the order the packets are in the file (no sorting), failing on any unbalanced end or on a
    track whose timestamps go back in file order. With `sort`, in the order the trace processor
    takes them instead: by timestamp, then file position."""
    pkts = packets(path)
    tracks = track_names(pkts)
    # Interned names, in file order (the writer never redefines an iid).
    names = {e.iid: e.name for p in pkts if p.trusted_packet_sequence_id == 1 for e in p.interned_data.event_names}
    if sort:
        pkts = [p for _, p in sorted(enumerate(pkts), key=lambda ip: (ip[1].timestamp, ip[0]))]
    stacks: dict[int, list[tuple[str, int]]] = defaultdict(list)
    last_ts: dict[int, int] = {}
    out: dict[tuple[int, int], list[tuple[str, int, int, int]]] = defaultdict(list)
    for p in pkts:
        if not p.HasField("track_event") or p.track_event.type not in (BEGIN, END, INSTANT):
            continue
        ev = p.track_event
        uuid = ev.track_uuid
        assert p.timestamp >= last_ts.get(uuid, 0), f"track {tracks[uuid]} goes back in time in file order"
        last_ts[uuid] = p.timestamp
        stack = stacks[uuid]
        if ev.type == BEGIN:
            stack.append((names[ev.name_iid], p.timestamp))
        elif ev.type == INSTANT:
            out[tracks[uuid]].append((names[ev.name_iid], p.timestamp, 0, len(stack)))
        else:
            assert stack, f"unbalanced SLICE_END on track {tracks[uuid]} at {p.timestamp}"
            name, ts = stack.pop()
            out[tracks[uuid]].append((name, ts, p.timestamp - ts, len(stack)))
    assert not any(stacks.values()), "slices left open"
    return out


def write_sample(sink: TraceSink) -> None:
    """A small run: two ranks, nvtx ranges opening before their contents, zero-length and
    back-to-back slices, equal timestamps, instants out of order, counters, both kinds of flows,
    args of every JSON type."""
    sink.process(1, "rank 0 · node 0 · GPU 0 · H100", 0)
    sink.thread(1, 1, "host (aten op launches)", 0)
    sink.open_slice(1, 1, "step", 0, "nvtx")
    sink.open_slice(1, 1, "forward", 0, "nvtx")
    sink.slice(1, 1, "aten::mm", 0, 10, "cpu_op",
               {"Input Dims": [[64, 32], [32, 16], []], "correlation": 1, "python_overhead_ns": 0}, flow_out=1)
    sink.thread(1, 10, "cuda:0 default stream", 10)
    sink.slice(1, 10, "gemm", 12, 8, "kernel",
               {"op": "aten::mm.default", "flops": 65536.0, "bytes": 0.0, "estimator": "analytical", "device": 0,
                "nested": {"a": [1, 2.5, None, True, "x"], "empty": {}, "none": None}, "ünïcode": "∑"},
               flow_in=1)
    sink.slice(1, 1, "python: optimizer_step", 10, 0, "python", {"count": 3})
    sink.slice(1, 1, "cudaDeviceSynchronize", 10, 10, "cuda_runtime")
    sink.counter(1, "cuda:0 memory", 20, {"allocated": 1 << 33, "reserved": 1.5e10})
    sink.counter(1, "cuda:0 memory", 20, {"allocated": 1 << 32, "reserved": 1.5e10})  # same time: two events
    sink.slice(1, 1, "forward", 0, 20, "nvtx")
    sink.instant(1, 1, "CUDA out of memory", 20, "memory", {"requested_bytes": 8 << 30, "message": "OOM"})
    sink.slice(1, 1, "aten::add", 20, 5, "cpu_op")
    sink.slice(1, 1, "step", 0, 25, "nvtx")
    sink.process(2, "rank 1 · node 0 · GPU 1 · H100", 1)
    sink.thread(2, 1, "host (aten op launches)", 0)
    sink.thread(1, 11, "cuda:0 nccl group [0, 1]", 11)
    sink.thread(2, 11, "cuda:1 nccl group [0, 1]", 11)
    sink.slice(1, 11, "ncclDevKernel_AllReduce", 30, 10, "kernel", {"op": "all_reduce", "root": None, "collective": 1})
    sink.slice(2, 11, "ncclDevKernel_AllReduce", 35, 5, "kernel", {"op": "all_reduce", "root": None, "collective": 1})
    sink.flow(3000, "all_reduce #0", (1, 11, 30), (2, 11, 35))
    # A receive that waited from before its send: the arrow's end is inside it, at the send's start.
    sink.slice(1, 11, "ncclDevKernel_SendRecv", 60, 10, "kernel", {"op": "send", "collective": 2})
    sink.slice(2, 11, "ncclDevKernel_SendRecv", 50, 20, "kernel", {"op": "recv", "collective": 2})
    sink.flow(4000, "send #1", (1, 11, 60), (2, 11, 60))
    sink.process(0, "simulator (rollbacks, corrections)", -1)
    sink.thread(0, 1, "network rollbacks", 0)
    sink.instant(0, 1, "rollback: b", 40, "rollback", {"corrections": [["ar", 30, 41]]})
    sink.instant(0, 1, "rollback: a", 5, "rollback", {"corrections": []})
    sink.counter(1000000, "link nvlink0", 50, {"utilization": 0.25, "GB/s": 112.5})


METADATA = {"gpu": "h100-sxm-80gb", "nodes": 1, "nproc_per_node": None, "wall_seconds": 1.25, "exit_code": 0,
            "command": ["python", "train.py"], "ok": True}


def close_both(tmp_path: Path) -> tuple[Path, Path, PerfettoProtoSink]:
    js, pf = ChromeJsonSink(tmp_path / "run.json"), PerfettoProtoSink(tmp_path / "run.pftrace")
    tee = TeeSink([js, pf])
    write_sample(tee)
    tee.close(METADATA)
    return tmp_path / "run.json", tmp_path / "run.pftrace", pf


def test_decoded_pftrace_equals_the_json_of_the_same_calls(tmp_path):
    json_path, pf_path, sink = close_both(tmp_path)
    assert sink.late_slices == sink.unbound_flows == sink.unclosed_slices == 0
    expected = load_chrome_trace(json_path)
    decoded = load_pftrace(pf_path)
    assert multiset(decoded["traceEvents"]) == multiset(expected["traceEvents"])
    assert decoded["metadata"] == expected["metadata"] == METADATA
    assert list(read_pftrace(pf_path)) == decoded["traceEvents"]
    assert not (tmp_path / "run.pftrace.partial").exists()


def test_begins_and_ends_nest_per_track_in_file_order(tmp_path):
    _, pf_path, _ = close_both(tmp_path)
    host = slices_in_file_order(pf_path)[(1, 1)]
    # The nvtx ranges were written when they closed, after their contents, yet their begins come
    # first in the file; slices with equal timestamps nest as the JSON importer nests them.
    assert sorted(host, key=lambda s: (s[1], -s[2], s[3])) == [
        ("step", 0, 25, 0),
        ("forward", 0, 20, 1),
        ("aten::mm", 0, 10, 2),
        ("cudaDeviceSynchronize", 10, 10, 2),
        ("python: optimizer_step", 10, 0, 3),  # zero-length: inside the slice starting with it
        ("aten::add", 20, 5, 1),  # back to back with "forward", which ends at 20
        ("CUDA out of memory", 20, 0, 2),
    ]
    rollbacks = slices_in_file_order(pf_path)[(0, 1)]
    assert sorted(rollbacks) == [("rollback: a", 5, 0, 0), ("rollback: b", 40, 0, 0)]


def test_the_trace_processor_meets_each_collective_arrow_at_its_start_first(tmp_path):
    _, pf_path, _ = close_both(tmp_path)
    pkts = packets(pf_path)
    tracks = track_names(pkts)
    ids: dict[int, list[tuple[int, tuple[int, int], str]]] = defaultdict(list)  # flow id -> (ts, track, role)
    for p in pkts:
        if p.HasField("track_event"):
            ev = p.track_event
            assert ev.type == BEGIN or not (ev.flow_ids_old or ev.terminating_flow_ids_old)
            for fid in ev.flow_ids_old:
                ids[fid].append((p.timestamp, tracks[ev.track_uuid], "flow"))
            for fid in ev.terminating_flow_ids_old:
                ids[fid].append((p.timestamp, tracks[ev.track_uuid], "terminating"))
    collective = {fid & ~(1 << 63): sorted(uses) for fid, uses in ids.items() if fid >> 63}
    assert collective == {
        # all-reduce: the destination starts after the source; its begin ends the arrow
        3000: [(30, (1, 11), "flow"), (35, (2, 11), "terminating")],
        # the receive started first (50): a terminating id there would come before the arrow's
        # start, so both begins carry a plain flow id (the trace processor steps from 50 to 60)
        4000: [(50, (2, 11), "flow"), (60, (1, 11), "flow")],
    }


def test_every_packet_carries_a_sequence_id_and_sequences_start_cleared(tmp_path):
    _, pf_path, sink = close_both(tmp_path)
    pkts = packets(pf_path)
    assert len(pkts) == sink.packets_written and all(p.trusted_packet_sequence_id for p in pkts)
    first: dict[int, TracePacket] = {}
    for p in pkts:
        first.setdefault(p.trusted_packet_sequence_id, p)
        if p.HasField("interned_data") or p.HasField("track_event"):
            assert p.sequence_flags & TracePacket.SEQ_NEEDS_INCREMENTAL_STATE
    for p in first.values():
        assert p.sequence_flags & TracePacket.SEQ_INCREMENTAL_STATE_CLEARED and p.first_packet_on_sequence


def test_ranks_are_processes_and_their_tracks_threads(tmp_path):
    _, pf_path, _ = close_both(tmp_path)
    descs = [p.track_descriptor for p in packets(pf_path) if p.HasField("track_descriptor")]
    processes = {d.process.pid: (d.uuid, d.process.process_name, d.process.legacy_sort_index)
                 for d in descs if d.HasField("process") and d.process.HasField("process_name")}
    assert processes[1][1:] == ("rank 0 · node 0 · GPU 0 · H100", 0)
    assert processes[0][1:] == ("simulator (rollbacks, corrections)", -1)
    threads = [d for d in descs if d.HasField("thread")]
    by_uuid = {d.uuid: d for d in descs}
    for t in threads:
        assert by_uuid[t.parent_uuid].process.pid == t.thread.pid  # a thread's parent is its process track
    memory = [d for d in descs if d.HasField("counter") and d.name.startswith("cuda:0 memory")]
    assert sorted(d.name for d in memory) == ["cuda:0 memory allocated", "cuda:0 memory reserved"]
    group = by_uuid[memory[0].parent_uuid]
    assert group.name == "cuda:0 memory" and by_uuid[group.parent_uuid].process.pid == 1


def test_names_categories_and_arg_names_are_interned_once(tmp_path):
    sink = PerfettoProtoSink(tmp_path / "many.pftrace")
    sink.thread(1, 10, "cuda:0 default stream", 10)
    for i in range(200):
        sink.slice(1, 10, "ampere_sgemm_128x64", i * 10, 5, "kernel", {"op": "aten::mm.default", "correlation": i})
    sink.close({})
    pkts = packets(tmp_path / "many.pftrace")
    interned = [p.interned_data for p in pkts if p.HasField("interned_data")]
    assert [e.name for i in interned for e in i.event_names] == ["ampere_sgemm_128x64"]
    assert [c.name for i in interned for c in i.event_categories] == ["kernel"]
    assert sorted(n.name for i in interned for n in i.debug_annotation_names) == ["correlation", "op"]
    begins = [p.track_event for p in pkts if p.HasField("track_event") and p.track_event.type == BEGIN]
    assert len(begins) == 200
    for b in begins:
        assert b.name_iid and not b.HasField("name") and list(b.category_iids) and not b.categories
        assert all(a.name_iid and not a.HasField("name") for a in b.debug_annotations)
        # String values stay inline: interned ones are lost on older trace processors.
        assert [a.string_value for a in b.debug_annotations if a.HasField("string_value")] == ["aten::mm.default"]


def test_events_stream_to_disk_while_a_range_stays_open(tmp_path):
    sink = PerfettoProtoSink(tmp_path / "long.pftrace")
    sink.thread(1, 1, "host", 0)
    sink.open_slice(1, 1, "whole run", 0, "nvtx")
    for i in range(5000):
        sink.slice(1, 1, "aten::add", i * 10, 10, "cpu_op")
    # Two descriptors and every event but the three at or after the latest start (49,990 ns)
    # are in the file already: nothing waits for the open range to close.
    assert sink.packets_written == 2 + (1 + 2 * 5000) - 3
    sink.slice(1, 1, "whole run", 0, 50000, "nvtx")
    sink.close({})
    host = slices_in_file_order(tmp_path / "long.pftrace")[(1, 1)]
    assert ("whole run", 0, 50000, 0) in host and len(host) == 5001


def write_collective_call(sink: TraceSink) -> None:
    """A collective's host call announced with its end when the rank makes it, written (with
    its args and its link to the kernel) only after the rank's host track went on."""
    sink.process(1, "rank 0", 0)
    sink.thread(1, 1, "host (aten op launches)", 0)
    sink.thread(1, 11, "cuda:0 nccl group [0, 1]", 11)
    sink.slice(1, 1, "aten::mm", 0, 10, "cpu_op", {"correlation": 1}, flow_out=1)
    sink.open_slice(1, 1, "nccl:all_reduce", 10, "cpu_op", end_ns=12)
    sink.slice(1, 1, "python: module_call", 12, 0, "python")  # at the call's end: waits for it
    sink.slice(1, 1, "aten::add", 12, 8, "cpu_op")
    sink.slice(1, 1, "aten::mul", 20, 10, "cpu_op")
    sink.slice(1, 11, "ncclDevKernel_AllReduce", 40, 10, "kernel", {"op": "all_reduce", "correlation": 7},
               flow_in=7)
    sink.slice(1, 1, "nccl:all_reduce", 10, 2, "cpu_op", {"seq": 0, "correlation": 7}, flow_out=7)


def test_a_call_written_after_later_slices_keeps_its_place_args_and_flow(tmp_path):
    js, pf = ChromeJsonSink(tmp_path / "c.json"), PerfettoProtoSink(tmp_path / "c.pftrace")
    tee = TeeSink([js, pf])
    write_collective_call(tee)
    tee.close({})
    assert pf.late_slices == 0
    decoded = load_pftrace(tmp_path / "c.pftrace")
    assert multiset(decoded["traceEvents"]) == multiset(load_chrome_trace(tmp_path / "c.json")["traceEvents"])
    host = slices_in_file_order(tmp_path / "c.pftrace", sort=True)[(1, 1)]
    assert sorted(host, key=lambda s: (s[1], -s[2])) == [
        ("aten::mm", 0, 10, 0), ("nccl:all_reduce", 10, 2, 0), ("aten::add", 12, 8, 0),
        ("python: module_call", 12, 0, 1), ("aten::mul", 20, 10, 0)]
    # The call's begin waited for its flow and args, as a complete slice's begin carries them.
    events = [p.track_event for p in packets(tmp_path / "c.pftrace") if p.HasField("track_event")]
    calls = [e for e in events if e.type == BEGIN and list(e.flow_ids_old) == [7]]
    assert len(calls) == 1 and len(calls[0].debug_annotations) == 2  # seq, correlation
    assert not any(e.flow_ids_old or e.debug_annotations for e in events if e.type == END)


def test_events_go_on_while_a_call_waits_for_its_args(tmp_path):
    sink = PerfettoProtoSink(tmp_path / "wait.pftrace")
    sink.thread(1, 1, "host", 0)
    sink.open_slice(1, 1, "nccl:all_gather", 0, "cpu_op", end_ns=5)
    for i in range(1000):
        sink.slice(1, 1, "aten::add", 5 + i * 10, 10, "cpu_op")
    # Only the events at the call's start and end wait for it (its begin, the next slice's
    # begin), not the 1,000 slices after it; the usual three at the latest start wait too.
    assert sink.packets_written == 2 + (1 + 2 * 1000) - 3 - 2
    sink.slice(1, 1, "nccl:all_gather", 0, 5, "cpu_op", {"seq": 3})
    sink.close({})
    host = slices_in_file_order(tmp_path / "wait.pftrace", sort=True)[(1, 1)]
    assert ("nccl:all_gather", 0, 5, 0) in host and all(depth == 0 for *_, depth in host) and len(host) == 1001


def test_a_slice_out_of_order_is_counted_and_kept(tmp_path):
    sink = PerfettoProtoSink(tmp_path / "late.pftrace")
    sink.slice(1, 1, "b", 100, 10, "cpu_op")
    sink.slice(1, 1, "c", 200, 10, "cpu_op")
    sink.slice(1, 1, "a", 50, 10, "cpu_op")  # starts before slices already written
    sink.close({})
    assert sink.late_slices == 1
    xs = sorted((e["name"], e["ts"], e["dur"]) for e in read_pftrace(tmp_path / "late.pftrace") if e["ph"] == "X")
    assert xs == [("a", 0.05, 0.01), ("b", 0.1, 0.01), ("c", 0.2, 0.01)]


def test_a_flow_to_a_slice_already_written_is_counted_not_half_written(tmp_path):
    sink = PerfettoProtoSink(tmp_path / "flow.pftrace")
    sink.slice(1, 11, "ar", 10, 5, "kernel")
    sink.slice(1, 11, "ar", 20, 5, "kernel")
    sink.slice(2, 11, "ar", 20, 5, "kernel")
    sink.flow(1000, "all_reduce #0", (1, 11, 10), (2, 11, 20))  # the first slice's begin is written
    sink.close({})
    assert sink.unbound_flows == 1
    evs = list(read_pftrace(tmp_path / "flow.pftrace"))
    assert not [e for e in evs if e["ph"] in ("s", "f")]
    events = [p.track_event for p in packets(tmp_path / "flow.pftrace") if p.HasField("track_event")]
    assert not any(e.flow_ids or e.terminating_flow_ids or e.flow_ids_old or e.terminating_flow_ids_old
                   for e in events)


def test_a_range_still_open_on_close_ends_at_its_tracks_last_event(tmp_path):
    sink = PerfettoProtoSink(tmp_path / "open.pftrace")
    sink.open_slice(1, 1, "never closed", 5, "nvtx")
    sink.slice(1, 1, "op", 10, 30, "cpu_op")
    sink.close({})
    assert sink.unclosed_slices == 1
    host = slices_in_file_order(tmp_path / "open.pftrace")[(1, 1)]
    assert sorted(host) == [("never closed", 5, 35, 0), ("op", 10, 30, 1)]


def test_open_sink_chooses_the_format_by_extension(tmp_path):
    for name in ("a.pftrace", "a.perfetto-trace"):
        sink = open_sink(tmp_path / name)
        assert isinstance(sink, PerfettoProtoSink)
        sink.close({})
        assert (tmp_path / name).exists()
    with pytest.raises(UnsupportedTraceFormat, match=r"\.pftrace"):
        open_sink(tmp_path / "a.proto")


def test_reader_errors_name_the_file(tmp_path):
    _, pf_path, _ = close_both(tmp_path)
    with pytest.raises(PftraceFormatError, match="not a Perfetto protobuf trace") as e:
        load_pftrace(tmp_path / "run.json")
    assert "run.json" in str(e.value)
    cut = tmp_path / "cut.pftrace"
    cut.write_bytes(pf_path.read_bytes()[:-7])
    with pytest.raises(PftraceFormatError, match="truncated"):
        load_pftrace(cut)
    with pytest.raises(PftraceFormatError, match="cannot read"):
        load_pftrace(tmp_path / "missing.pftrace")


def test_json_kept_as_a_key_or_a_buffered_event_costs_its_length_not_orjsons_buffer():
    """orjson.dumps' result keeps its 4 KiB output buffer: the Perfetto writer's cache of 65,536
    (name, value) keys held 260 MiB of a 582 MiB simulator at 128 GPUs. kept_json is what the
    writers, the Chrome and Kineto buffers and the engine's estimate cache keep."""
    import tracemalloc

    from phantora.protocol import kept_json

    tracemalloc.start()
    try:
        keys = [kept_json(["seq", i]) for i in range(1000)]
        per_key = tracemalloc.get_traced_memory()[0] / len(keys)
    finally:
        tracemalloc.stop()
    assert keys[7] == b'["seq",7]'
    assert per_key < 200, per_key  # orjson.dumps' own: about 4,100 bytes each
