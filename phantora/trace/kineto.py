"""Kineto trace export: one torch.profiler-style JSON file per rank, for Holistic Trace Analysis.

HTA (PyPI `holistictraceanalysis`) reads a directory of Kineto traces, one per rank, the files
`torch.profiler` writes. This sink turns the engine's events into that format, following what
HTA 0.5's parser reads (hta/common/trace_file.py, trace_parser.py, trace.py):

- The rank comes from `"distributedInfo": {"rank": R, ...}`, found by the regex `"rank":\\s+(\\d+)`
  on the file's lines, so the header is written first, with a space after each colon.
- GPU events carry args `stream` > 0 and `correlation` >= 0; host events carry no `stream` (HTA
  reads -1). A kernel is linked to the host event with the same `correlation`, which must be
  unique on the host: it is a `cuda_runtime` launch (cudaLaunchKernel, cudaMemcpyAsync) nested
  in the aten op, as Kineto writes it; the aten op (`cpu_op`) carries `External id` instead.
- Iterations are `ProfilerStep#N` slices on the host thread; HTA keeps only kernels launched
  before the last step starts.
- NCCL kernels are named `ncclDevKernel_*` (HTA's regex `^nccl.*Kernel` makes them
  communication), copies `Memcpy ...` (memory), everything else computation.
- Times are microseconds with three decimals (nanosecond precision) relative to
  `baseTimeNanoseconds`, as Kineto has written them since PyTorch 2.4. HTA rounds such times to
  whole microseconds unless HTA_DISABLE_NS_ROUNDING=1 is set where HTA runs.

Layout: GPU events use pid = the CUDA device index and tid = stream (Kineto's convention); a
stream's number is the engine's track id for it, so it is unique within the rank and > 0. Host
events use pid = tid = HOST_PID_BASE + rank (Kineto uses the OS pid, which phantora's trace does
not carry). Memory counters become Kineto `[memory]` instant events. Events of other processes
(simulator rollbacks, network links) and the collective flow arrows are not exported: they have
no Kineto counterpart.

Each rank's events are streamed to a scratch file in the directory while the run goes on; on
close each rank file is assembled (header, events, footer) and renamed into place.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import orjson

from phantora.hardware import GPUSpec
from phantora.protocol import kept_json

HOST_PID_BASE = 100_000
KERNEL_LAUNCH = "cudaLaunchKernel"
_LAUNCH_CALLS = {"gpu_memcpy": "cudaMemcpyAsync", "gpu_memset": "cudaMemsetAsync"}
_CHUNK_EVENTS = 4096
_RANK_PROCESS = re.compile(r"^rank (\d+) · node (\d+) · GPU (\d+)")
_GPU_TRACK = re.compile(r"^cuda:(\d+) ")
_MEMORY_COUNTER = re.compile(r"^cuda:(\d+) memory$")
_RANK_FILE = re.compile(r"^rank-(\d+)\.pt\.trace\.json$")
_STEP = re.compile(r"^ProfilerStep#\d+$")
# Categories of host slices as Kineto names them.
_HOST_CATEGORIES = {"nvtx": "user_annotation", "python": "python_function"}


class KinetoExportError(ValueError):
    """The export directory cannot be used; the message names it and says why."""


def rank_file_name(rank: int) -> str:
    return f"rank-{rank}.pt.trace.json"


def _us(ns: int) -> float:
    return round(ns / 1000.0, 3)


@dataclass
class _Rank:
    rank: int
    local_gpu: int
    scratch: Path
    file: IO[bytes]
    pending: list[bytes] = field(default_factory=list)
    events: int = 0
    devices: set[int] = field(default_factory=set)  # for deviceProperties
    gpu_processes: set[int] = field(default_factory=set)  # devices whose Kineto process is named
    allocated: dict[int, float] = field(default_factory=dict)  # device -> last allocated bytes

    @property
    def host_pid(self) -> int:
        return HOST_PID_BASE + self.rank


@dataclass
class _Launch:
    """An aten op (or collective call) whose kernel has not been written yet."""

    rank: _Rank
    ts_ns: int
    dur_ns: int


@dataclass
class KinetoExport:
    """What a closed KinetoSink wrote."""

    directory: Path
    files: list[Path]
    removed_stale: list[Path]
    other_trace_files: list[Path]  # .json/.gz files in the directory HTA would load as well


class KinetoSink:
    """Writes `rank-<R>.pt.trace.json` into `directory` for every rank (TraceSink protocol).

    `gpu` and `total_memory` fill the files' deviceProperties (what the simulated GPUs report).
    """

    def __init__(self, directory: Path, gpu: GPUSpec | None = None, total_memory: int | None = None) -> None:
        self.directory = Path(directory)
        self.gpu = gpu
        self.total_memory = total_memory or (gpu.total_memory if gpu else None)
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
        except FileExistsError:
            raise KinetoExportError(f"cannot export Kineto traces to {str(self.directory)!r}: it is a file, "
                                    "not a directory; name a directory") from None
        except OSError as e:
            raise KinetoExportError(f"cannot create {str(self.directory)!r} for the Kineto traces: "
                                    f"{e.strerror}") from None
        if not os.access(self.directory, os.W_OK):
            raise KinetoExportError(f"cannot write Kineto traces into {str(self.directory)!r}: permission denied")
        self._ranks: dict[int, _Rank] = {}  # trace pid -> rank
        self._gpu_tracks: dict[tuple[int, int], tuple[int, str]] = {}  # (pid, tid) -> (device, label)
        self._launches: dict[int, _Launch] = {}  # correlation -> host launch awaiting its kernel
        self.closed = False
        self.export: KinetoExport | None = None

    # --- TraceSink ---------------------------------------------------------------------------
    def process(self, pid: int, name: str, sort_index: int) -> None:
        m = _RANK_PROCESS.match(name)
        if m is None or pid in self._ranks:
            return
        rank = int(m.group(1))
        scratch = self.directory / f".rank-{rank}.events.partial"
        r = self._ranks[pid] = _Rank(rank, int(m.group(3)), scratch, open(scratch, "wb"))
        r.devices.add(r.local_gpu)
        self._emit(r, {"ph": "M", "name": "process_name", "pid": r.host_pid, "tid": 0,
                       "args": {"name": f"rank {rank} host (phantora)"}})
        self._emit(r, {"ph": "M", "name": "process_sort_index", "pid": r.host_pid, "tid": 0,
                       "args": {"sort_index": 0}})
        self._emit(r, {"ph": "M", "name": "thread_name", "pid": r.host_pid, "tid": r.host_pid,
                       "args": {"name": "thread 0 (python)"}})

    def thread(self, pid: int, tid: int, name: str, sort_index: int) -> None:
        r = self._ranks.get(pid)
        m = _GPU_TRACK.match(name)
        if r is None or m is None or (pid, tid) in self._gpu_tracks:
            return
        device = int(m.group(1))
        self._gpu_tracks[(pid, tid)] = (device, name)
        if device not in r.gpu_processes:
            r.gpu_processes.add(device)
            self._emit(r, {"ph": "M", "name": "process_name", "pid": device, "tid": 0, "args": {"name": "python"}})
            self._emit(r, {"ph": "M", "name": "process_labels", "pid": device, "tid": 0,
                           "args": {"labels": f"GPU {device}"}})
            self._emit(r, {"ph": "M", "name": "process_sort_index", "pid": device, "tid": 0,
                           "args": {"sort_index": 1_000_000 + device}})
        r.devices.add(device)
        self._emit(r, {"ph": "M", "name": "thread_name", "pid": device, "tid": tid,
                       "args": {"name": f"stream {tid} ({name})"}})
        self._emit(r, {"ph": "M", "name": "thread_sort_index", "pid": device, "tid": tid, "args": {"sort_index": tid}})

    def slice(
        self,
        pid: int,
        tid: int,
        name: str,
        ts_ns: int,
        dur_ns: int,
        cat: str,
        args: dict[str, Any] | None = None,
        flow_out: int | None = None,
        flow_in: int | None = None,
    ) -> None:
        r = self._ranks.get(pid)
        if r is None:
            return
        track = self._gpu_tracks.get((pid, tid))
        if track is not None:
            self._gpu_slice(r, track[0], tid, name, ts_ns, dur_ns, cat, args or {})
        elif _STEP.match(name):
            self._emit(r, {"ph": "X", "cat": "user_annotation", "name": name, "pid": r.host_pid, "tid": r.host_pid,
                           "ts": _us(ts_ns), "dur": _us(dur_ns), "args": dict(args or {})})
        else:
            self._host_slice(r, name, ts_ns, dur_ns, cat, args or {})

    def open_slice(self, pid: int, tid: int, name: str, ts_ns: int, cat: str, end_ns: int | None = None) -> None:
        pass  # complete ("X") events are written once the slice ends

    def _host_slice(self, r: _Rank, name: str, ts_ns: int, dur_ns: int, cat: str, args: dict[str, Any]) -> None:
        out = {k: v for k, v in args.items() if k != "correlation" or cat == "cuda_runtime"}
        correlation = args.get("correlation")
        if correlation is not None:
            out["External id"] = correlation
            # The launch call is the part of the op after its Python overhead (HostRecords.op in phantora/engine/host_records.py).
            overhead = int(args.get("python_overhead_ns") or 0)
            self._launches[correlation] = _Launch(r, ts_ns + overhead, dur_ns - overhead)
        self._emit(r, {"ph": "X", "cat": _HOST_CATEGORIES.get(cat, cat), "name": name, "pid": r.host_pid,
                       "tid": r.host_pid, "ts": _us(ts_ns), "dur": _us(dur_ns), "args": out})
        if correlation is not None and cat == "cuda_runtime":  # cudaGraphLaunch: it is its own launch call
            self._emit(r, {"ph": "s", "id": correlation, "pid": r.host_pid, "tid": r.host_pid, "ts": _us(ts_ns),
                           "cat": "ac2g", "name": "ac2g"})

    def _gpu_slice(self, r: _Rank, device: int, tid: int, name: str, ts_ns: int, dur_ns: int, cat: str,
                   args: dict[str, Any]) -> None:
        if cat == "cuda_graph":
            # A CUDA graph replay: Kineto shows no event for the graph itself, only its kernels,
            # which carry the correlation of the host's cudaGraphLaunch (already written).
            correlation = args.get("correlation")
            if self._launches.pop(correlation, None) is not None:  # the arrow ends at the first kernel
                self._emit(r, {"ph": "f", "id": correlation, "pid": device, "tid": tid, "ts": _us(ts_ns),
                               "cat": "ac2g", "name": "ac2g", "bp": "e"})
            return
        if cat == "kernel" and name.startswith(("Memcpy", "Memset")):
            # Device-to-device copies: the main trace files them with kernels; Kineto (and HTA's
            # memory kernel type) with copies.
            cat = "gpu_memcpy" if name.startswith("Memcpy") else "gpu_memset"
        out = dict(args)
        out["device"] = device
        out["stream"] = tid
        correlation = args.get("correlation")
        if correlation is not None:
            out["External id"] = correlation
            launch = self._launches.pop(correlation, None)
            if launch is not None:
                self._emit_launch(r, correlation, launch, _LAUNCH_CALLS.get(cat, KERNEL_LAUNCH))
                self._emit(r, {"ph": "f", "id": correlation, "pid": device, "tid": tid, "ts": _us(ts_ns),
                               "cat": "ac2g", "name": "ac2g", "bp": "e"})
        if cat == "gpu_memcpy" and dur_ns > 0 and isinstance(args.get("bytes"), (int, float)):
            out["memory bandwidth (GB/s)"] = round(args["bytes"] / dur_ns, 3)
        if name.startswith("nccl") and "group ranks" in args:
            out["Collective name"] = args.get("op", "")
            out["Group size"] = len(args["group ranks"])
            out["Process Group Ranks"] = args["group ranks"]
        self._emit(r, {"ph": "X", "cat": cat, "name": name, "pid": device, "tid": tid, "ts": _us(ts_ns),
                       "dur": _us(dur_ns), "args": out})

    def _emit_launch(self, r: _Rank, correlation: int, launch: _Launch, name: str, flow: bool = True) -> None:
        self._emit(r, {"ph": "X", "cat": "cuda_runtime", "name": name, "pid": r.host_pid, "tid": r.host_pid,
                       "ts": _us(launch.ts_ns), "dur": _us(launch.dur_ns),
                       "args": {"correlation": correlation, "External id": correlation}})
        if flow:
            self._emit(r, {"ph": "s", "id": correlation, "pid": r.host_pid, "tid": r.host_pid,
                           "ts": _us(launch.ts_ns), "cat": "ac2g", "name": "ac2g"})

    def instant(self, pid: int, tid: int, name: str, ts_ns: int, cat: str, args: dict[str, Any] | None = None) -> None:
        r = self._ranks.get(pid)
        if r is None or (pid, tid) in self._gpu_tracks:
            return
        self._emit(r, {"ph": "i", "s": "t", "cat": cat, "name": name, "pid": r.host_pid, "tid": r.host_pid,
                       "ts": _us(ts_ns), "args": dict(args or {})})

    def counter(self, pid: int, name: str, ts_ns: int, values: dict[str, float]) -> None:
        r = self._ranks.get(pid)
        m = _MEMORY_COUNTER.match(name)
        if r is None or m is None:
            return
        device = int(m.group(1))
        allocated = values.get("allocated", 0)
        delta = allocated - r.allocated.get(device, 0)
        r.allocated[device] = allocated
        self._emit(r, {"ph": "i", "s": "t", "cat": "cpu_instant_event", "name": "[memory]", "pid": r.host_pid,
                       "tid": r.host_pid, "ts": _us(ts_ns),
                       "args": {"Total Reserved": values.get("reserved", 0), "Total Allocated": allocated,
                                "Bytes": delta, "Device Type": 1, "Device Id": device}})

    def flow(self, flow_id: int, name: str, src: tuple[int, int, int], dst: tuple[int, int, int]) -> None:
        """Collective arrows between ranks cross files; Kineto traces have none."""

    def flush(self) -> None:
        pass  # an export for HTA, useful only complete: written at close

    def close(self, metadata: dict[str, Any]) -> None:
        if self.closed:
            return
        self.closed = True
        for correlation, launch in self._launches.items():  # launches whose kernel never came
            self._emit_launch(launch.rank, correlation, launch, KERNEL_LAUNCH, flow=False)
        self._launches.clear()
        world_size = len(self._ranks)
        base_ns = _base_time_ns(metadata)
        files = []
        for r in sorted(self._ranks.values(), key=lambda r: r.rank):
            self._flush(r)
            r.file.close()
            files.append(self._assemble(r, world_size, base_ns, metadata))
        ours = {p.name for p in files}
        removed, others = [], []
        for p in sorted(self.directory.iterdir()):
            if p.name in ours or not p.is_file():
                continue
            if _RANK_FILE.match(p.name):
                p.unlink()  # a rank of an earlier, larger run: HTA would load it with this run's
                removed.append(p)
            elif p.name.endswith(".json") or p.name.endswith(".gz"):
                others.append(p)
        self.export = KinetoExport(self.directory, files, removed, others)

    # --- writing -----------------------------------------------------------------------------
    def _emit(self, r: _Rank, event: dict[str, Any]) -> None:
        r.pending.append(kept_json(event))
        if len(r.pending) >= _CHUNK_EVENTS:
            self._flush(r)

    def _flush(self, r: _Rank) -> None:
        if not r.pending:
            return
        body = b",\n".join(r.pending)
        r.file.write(body if r.events == 0 else b",\n" + body)
        r.events += len(r.pending)
        r.pending.clear()

    def _device_properties(self, r: _Rank) -> list[dict[str, Any]]:
        if self.gpu is None:
            return []
        g = self.gpu
        return [{"id": d, "name": g.device_name, "totalGlobalMem": self.total_memory,
                 "computeMajor": g.capability[0], "computeMinor": g.capability[1],
                 "maxThreadsPerMultiprocessor": g.max_threads_per_sm, "regsPerMultiprocessor": g.regs_per_sm,
                 "warpSize": g.warp_size, "numSms": g.sm_count} for d in sorted(r.devices)]

    def _assemble(self, r: _Rank, world_size: int, base_ns: int, metadata: dict[str, Any]) -> Path:
        path = self.directory / rank_file_name(r.rank)
        partial = path.with_name(path.name + ".partial")
        # json.dumps' default separators put the space after ':' that HTA's rank regex needs.
        distributed = json.dumps({"backend": "nccl", "rank": r.rank, "world_size": world_size})
        with open(partial, "wb") as out:
            out.write(b'{\n  "schemaVersion": 1,\n  "distributedInfo": ' + distributed.encode() + b",\n")
            out.write(b'  "deviceProperties": ' + orjson.dumps(self._device_properties(r)) + b",\n")
            out.write(b'  "baseTimeNanoseconds": ' + str(base_ns).encode() + b",\n")
            out.write(b'  "traceName": ' + orjson.dumps(f"phantora rank {r.rank}") + b",\n")
            out.write(b'  "traceEvents": [\n')
            with open(r.scratch, "rb") as events:
                shutil.copyfileobj(events, out)
            out.write(b'\n  ],\n  "displayTimeUnit": "ms",\n  "phantora": ' + orjson.dumps(metadata) + b"\n}\n")
        os.replace(partial, path)
        r.scratch.unlink()
        return path


def _base_time_ns(metadata: dict[str, Any]) -> int:
    """Unix time of simulated time 0: when the run started (Kineto's event times count from it)."""
    started = metadata.get("started_at")
    if isinstance(started, str):
        try:
            t = _dt.datetime.fromisoformat(started)
        except ValueError:
            return 0
        return round(t.timestamp() * 1e6) * 1000
    return 0
