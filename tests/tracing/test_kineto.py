"""KinetoSink (one Kineto trace per rank for HTA) and TeeSink, driven directly: a few events of
one rank, then the files checked field by field against what HTA 0.5's parser reads."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from phantora.hardware import lookup_gpu
from phantora.trace import TeeSink
from phantora.trace.kineto import HOST_PID_BASE, KinetoExportError, KinetoSink

PID = 4  # trace pid of rank 3, as the engine numbers them
RANK = 3
DEFAULT_STREAM_TRACK, NCCL_TRACK, STEP_TRACK, HOST_TRACK = 10, 11, 2, 1
H100 = lookup_gpu("h100")


def write_one_rank(directory: Path) -> KinetoSink:
    """Two steps of one rank: an aten op with its kernel, a copy, a collective, nvtx, memory."""
    sink = KinetoSink(directory, H100, total_memory=40 << 30)
    sink.process(PID, "rank 3 · node 0 · GPU 3 · H100", 3)
    sink.process(0, "simulator (rollbacks, corrections)", -1)
    sink.thread(PID, HOST_TRACK, "host (aten op launches)", 0)
    sink.thread(PID, DEFAULT_STREAM_TRACK, "cuda:3 default stream", DEFAULT_STREAM_TRACK)
    sink.thread(PID, NCCL_TRACK, "cuda:3 nccl group [2, 3]", NCCL_TRACK)
    sink.thread(PID, STEP_TRACK, "steps (optimizer.step)", 1)
    # aten::mm: 1 us of Python overhead, then 4 us of launch; its kernel runs 10..30 us
    sink.slice(PID, HOST_TRACK, "aten::mm", 2_000, 5_000, "cpu_op",
               {"Input Dims": [[8, 8], [8, 8]], "correlation": 7, "python_overhead_ns": 1_000}, flow_out=7)
    sink.slice(PID, DEFAULT_STREAM_TRACK, "sm90_gemm", 10_000, 20_000, "kernel",
               {"op": "aten::mm", "device": 3, "stream": 0, "correlation": 7, "bytes": 768}, flow_in=7)
    sink.slice(PID, HOST_TRACK, "aten::copy_", 14_000, 3_000, "cpu_op",
               {"Input Dims": [[8, 8]], "correlation": 8, "python_overhead_ns": 0}, flow_out=8)
    sink.slice(PID, DEFAULT_STREAM_TRACK, "Memcpy HtoD (Pageable -> Device)", 30_000, 2_000, "gpu_memcpy",
               {"op": "aten::copy_", "device": 3, "stream": 0, "correlation": 8, "bytes": 4_000}, flow_in=8)
    sink.slice(PID, HOST_TRACK, "aten::copy_", 17_000, 1_000, "cpu_op",
               {"Input Dims": [[8, 8]], "correlation": 10, "python_overhead_ns": 0}, flow_out=10)
    sink.slice(PID, DEFAULT_STREAM_TRACK, "Memcpy DtoD (Device -> Device)", 32_000, 1_000, "kernel",
               {"op": "aten::copy_", "device": 3, "stream": 0, "correlation": 10, "bytes": 512}, flow_in=10)
    sink.slice(PID, HOST_TRACK, "nccl:all_reduce", 11_000, 1_500, "cpu_op",
               {"group ranks": [2, 3], "seq": 0, "correlation": 9}, flow_out=9)
    sink.slice(PID, NCCL_TRACK, "ncclDevKernel_AllReduce_Sum_f32_RING_LL", 25_000, 15_000, "kernel",
               {"op": "all_reduce", "bytes": 256, "group ranks": [2, 3], "correlation": 9, "collective": 1},
               flow_in=9)
    sink.flow(5000, "all_reduce #0", (PID, NCCL_TRACK, 25_000), (PID + 1, NCCL_TRACK, 25_000))
    sink.slice(PID, HOST_TRACK, "forward", 1_000, 12_000, "nvtx")
    sink.slice(PID, STEP_TRACK, "ProfilerStep#0", 0, 13_000, "user_annotation", {"step": 0})
    sink.slice(PID, STEP_TRACK, "ProfilerStep#1", 13_000, 7_000, "user_annotation", {"step": 1})
    sink.counter(PID, "cuda:3 memory", 2_000, {"allocated": 1024, "reserved": 2 << 20})
    sink.counter(PID, "cuda:3 memory", 9_000, {"allocated": 1536, "reserved": 2 << 20})
    sink.instant(0, 1, "rollback: x", 5_000, "rollback", {"flows rolled back": 1})
    sink.close({"gpu": "h100-sxm-80gb", "started_at": "2026-01-02T03:04:05.000006+00:00"})
    return sink


def load(path: Path) -> dict:
    return json.loads(path.read_text())


def test_rank_file_has_the_header_and_events_hta_reads(tmp_path):
    sink = write_one_rank(tmp_path)
    path = tmp_path / "rank-3.pt.trace.json"
    assert sink.export is not None and sink.export.files == [path]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rank-3.pt.trace.json"]  # no scratch left behind
    data = load(path)
    assert data["distributedInfo"] == {"backend": "nccl", "rank": 3, "world_size": 1}
    assert data["baseTimeNanoseconds"] == 1767323045_000006_000
    (dev,) = data["deviceProperties"]
    assert dev["id"] == 3 and dev["name"] == "NVIDIA H100 80GB HBM3" and dev["totalGlobalMem"] == 40 << 30
    assert (dev["computeMajor"], dev["computeMinor"], dev["numSms"]) == (9, 0, 132)

    xs = {(e["cat"], e["name"]): e for e in data["traceEvents"] if e["ph"] == "X"}
    host = HOST_PID_BASE + RANK
    kernel = xs[("kernel", "sm90_gemm")]
    assert (kernel["pid"], kernel["tid"], kernel["ts"], kernel["dur"]) == (3, DEFAULT_STREAM_TRACK, 10.0, 20.0)
    assert kernel["args"]["stream"] == DEFAULT_STREAM_TRACK and kernel["args"]["device"] == 3
    assert kernel["args"]["correlation"] == 7 and kernel["args"]["External id"] == 7
    op = xs[("cpu_op", "aten::mm")]
    assert (op["pid"], op["tid"], op["ts"], op["dur"]) == (host, host, 2.0, 5.0)
    assert "correlation" not in op["args"] and op["args"]["External id"] == 7
    # the launch: the op's time after its Python overhead, the kernel's correlation
    launches = {e["args"]["correlation"]: e for e in data["traceEvents"] if e.get("cat") == "cuda_runtime"}
    assert sorted(launches) == [7, 8, 9, 10]
    assert {c: (e["name"], e["pid"], e["tid"], e["ts"], e["dur"]) for c, e in launches.items()} == {
        7: ("cudaLaunchKernel", host, host, 3.0, 4.0),
        8: ("cudaMemcpyAsync", host, host, 14.0, 3.0),
        9: ("cudaLaunchKernel", host, host, 11.0, 1.5),
        10: ("cudaMemcpyAsync", host, host, 17.0, 1.0),
    }
    # a device-to-device copy is a copy in Kineto, though the main trace files it with kernels
    assert xs[("gpu_memcpy", "Memcpy DtoD (Device -> Device)")]["args"]["stream"] == DEFAULT_STREAM_TRACK
    assert xs[("gpu_memcpy", "Memcpy HtoD (Pageable -> Device)")]["args"]["memory bandwidth (GB/s)"] == 2.0
    nccl = xs[("kernel", "ncclDevKernel_AllReduce_Sum_f32_RING_LL")]
    assert nccl["args"]["stream"] == NCCL_TRACK and nccl["args"]["device"] == 3
    assert nccl["args"]["Collective name"] == "all_reduce" and nccl["args"]["Group size"] == 2
    # steps and annotations on the host thread, with Kineto's categories
    step = xs[("user_annotation", "ProfilerStep#1")]
    assert (step["pid"], step["tid"], step["ts"], step["dur"]) == (host, host, 13.0, 7.0)
    assert xs[("user_annotation", "forward")]["tid"] == host
    memory = [e for e in data["traceEvents"] if e["name"] == "[memory]"]
    assert [(m["args"]["Total Allocated"], m["args"]["Bytes"], m["args"]["Device Id"]) for m in memory] == \
        [(1024, 1024, 3), (1536, 512, 3)]
    # launch -> kernel arrows as Kineto draws them; nothing of the simulator process, no collective arrows
    assert sorted((e["ph"], e["id"]) for e in data["traceEvents"] if e.get("cat") == "ac2g") == \
        [("f", 7), ("f", 8), ("f", 9), ("f", 10), ("s", 7), ("s", 8), ("s", 9), ("s", 10)]
    assert not [e for e in data["traceEvents"] if "rollback" in e["name"] or e["ph"] in ("t",) or e.get("id") == 5000]
    names = {(e["pid"], e["tid"], e["name"]): e["args"] for e in data["traceEvents"] if e["ph"] == "M"}
    assert names[(3, NCCL_TRACK, "thread_name")]["name"] == "stream 11 (cuda:3 nccl group [2, 3])"
    assert names[(3, 0, "process_labels")]["labels"] == "GPU 3"


@pytest.mark.filterwarnings("ignore:The inplace keyword")  # HTA 0.5's own pandas calls, under pandas 3
def test_hta_parses_the_file_links_kernels_to_launches_and_numbers_iterations(tmp_path):
    trace_file = pytest.importorskip("hta.common.trace_file", reason="holistictraceanalysis (the test extra) "
                                                                       "is not installed")
    from hta.common.trace import parse_trace_file

    write_one_rank(tmp_path)
    ok, ranks = trace_file.create_rank_to_trace_dict([str(tmp_path / "rank-3.pt.trace.json")])
    assert ok and list(ranks) == [3]
    os.environ["HTA_DISABLE_NS_ROUNDING"] = "1"
    try:
        meta, df, symbols = parse_trace_file(ranks[3])
    finally:
        del os.environ["HTA_DISABLE_NS_ROUNDING"]
    names = symbols.get_sym_table()
    df["s_name"] = df["name"].map(lambda i: names[i])
    gpu = df[df["stream"].gt(0)].set_index("s_name")
    assert sorted(gpu.index) == sorted(["sm90_gemm", "Memcpy HtoD (Pageable -> Device)",
                                        "Memcpy DtoD (Device -> Device)", "ncclDevKernel_AllReduce_Sum_f32_RING_LL"])
    for kernel, launch in (("sm90_gemm", "cudaLaunchKernel"), ("Memcpy HtoD (Pageable -> Device)", "cudaMemcpyAsync"),
                           ("Memcpy DtoD (Device -> Device)", "cudaMemcpyAsync"),
                           ("ncclDevKernel_AllReduce_Sum_f32_RING_LL", "cudaLaunchKernel")):
        linked = df.loc[gpu.loc[kernel, "index_correlation"]]
        assert linked["s_name"] == launch and linked["stream"] == -1
    # iterations come from the launches: at 3 and 11 us in step 0 (0-13 us), at 14 and 17 us in step 1
    assert gpu["iteration"].to_dict() == {"sm90_gemm": 0, "ncclDevKernel_AllReduce_Sum_f32_RING_LL": 0,
                                          "Memcpy HtoD (Pageable -> Device)": 1, "Memcpy DtoD (Device -> Device)": 1}
    assert meta["distributedInfo"]["rank"] == 3


def test_export_replaces_rank_files_of_an_earlier_run_and_names_other_trace_files(tmp_path):
    (tmp_path / "rank-7.pt.trace.json").write_text("{}")  # an earlier, 8-rank export
    (tmp_path / "mine.json").write_text("{}")
    sink = write_one_rank(tmp_path)
    assert sink.export is not None
    assert [p.name for p in sink.export.removed_stale] == ["rank-7.pt.trace.json"]
    assert [p.name for p in sink.export.other_trace_files] == ["mine.json"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine.json", "rank-3.pt.trace.json"]


def test_a_file_in_place_of_the_directory_is_a_clear_error(tmp_path):
    blocker = tmp_path / "out"
    blocker.write_text("x")
    with pytest.raises(KinetoExportError, match=r"out.*is a file, not a directory"):
        KinetoSink(blocker)


class Recorder:
    def __init__(self, fail_on_close: bool = False) -> None:
        self.calls: list[tuple] = []
        self.fail_on_close = fail_on_close

    def __getattr__(self, name):
        def record(*args, **kwargs):
            self.calls.append((name, args, kwargs))
            if name == "close" and self.fail_on_close:
                raise OSError("disk full")
        return record


def test_tee_forwards_every_call_in_order_to_each_sink_and_closes_all_of_them():
    first, second = Recorder(fail_on_close=True), Recorder()
    tee = TeeSink([first, second])
    args = {"correlation": 1}
    tee.process(1, "rank 0", 0)
    tee.thread(1, 10, "cuda:0 default stream", 10)
    tee.slice(1, 10, "k", 5, 6, "kernel", args, None, 1)
    tee.instant(1, 1, "oom", 7, "memory", None)
    tee.counter(1, "cuda:0 memory", 8, {"allocated": 1.0})
    tee.flow(3, "all_reduce #0", (1, 11, 0), (2, 11, 0))
    with pytest.raises(OSError, match="disk full"):
        tee.close({"exit_code": 0})
    expected = [
        ("process", (1, "rank 0", 0), {}),
        ("thread", (1, 10, "cuda:0 default stream", 10), {}),
        ("slice", (1, 10, "k", 5, 6, "kernel", args, None, 1), {}),
        ("instant", (1, 1, "oom", 7, "memory", None), {}),
        ("counter", (1, "cuda:0 memory", 8, {"allocated": 1.0}), {}),
        ("flow", (3, "all_reduce #0", (1, 11, 0), (2, 11, 0)), {}),
        ("close", ({"exit_code": 0},), {}),
    ]
    assert first.calls == expected and second.calls == expected  # the second closed although the first failed
