"""CUDA graphs on the virtual GPU: torch.cuda.CUDAGraph, torch.cuda.graph, graph_pool_handle,
is_current_stream_capturing and make_graphed_callables, with torch's own Python code running
on top of a simulated replacement for the C++ base class torch._C._CUDAGraph.

`install_cuda_graphs` swaps torch._C._CUDAGraph, _graph_pool_handle and
_cuda_isCurrentStreamCapturing for the ones below and re-executes torch/cuda/graphs.py, so
torch.cuda.CUDAGraph is torch's class (subclassable, usable in annotations, with the
capture/replay hooks of the installed torch version) over a base that reports to the simulator:

  * capture_begin: the current stream starts capturing (not the default stream, as on CUDA).
    Ops launched on it are reported with OP_CAPTURED (interpose/ops/observer.py): the engine records
    their kernels into the graph and runs nothing (phantora/engine/graphs.py). Their storages
    come from the graph's private memory pool (phantora/engine/memory.py graph pools), which
    stays reserved while a graph holds it, as PyTorch's caching allocator keeps it.
  * replay: one cudaGraphLaunch; the engine places the recorded kernels on the current stream.
    No Python runs again, so tensors produced during capture keep their (placeholder) values.
  * reset / garbage collection: the graph's pools are released.
An event recorded on a capturing stream and waited on by another stream joins that stream to
the capture, as cudaStreamWaitEvent does. Synchronisations inside a capture (synchronize,
.item()) raise what CUDA raises: "operation not permitted when stream is capturing".
NCCL collectives called during a capture are recorded into the graph, not run, and consume no
sequence number of their process group (interpose/distributed/process_group.py); each replay then takes the
group's next sequence number for each of them, in capture order, and sends them with the launch,
so replayed collectives are matched across ranks as eager ones are (phantora/engine/graphs.py).
"""

from __future__ import annotations

import importlib
import itertools
import warnings
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from interpose import runtime as rt_mod
from phantora import protocol as P

_MODES = ("global", "thread_local", "relaxed")
_graph_ids = itertools.count(1)
_pool_uids = itertools.count(1)  # graph_pool_handle(): (0, n), as in c10 (0 is "not set")
_private_ids = itertools.count(1)  # a capture's own pool: (n, 0)


def _accelerator_error(message: str) -> Exception:
    error = getattr(torch, "AcceleratorError", RuntimeError)
    return error(message)


def _not_permitted(what: str) -> Exception:
    return _accelerator_error(
        "CUDA error: operation not permitted when stream is capturing\n"
        f"phantora: {what} during CUDA graph capture; a real GPU refuses it the same way (it would invalidate "
        "the capture). Move it before torch.cuda.graph(...) or after the capture ends.")


@dataclass
class _Capture:
    """What one CUDAGraph holds. Kept apart from the graph object so that the finalizer that
    releases it when the graph is collected does not keep the graph alive."""

    graph_id: int
    keep_graph: bool
    device: int = -1
    stream: int = -1
    streams: list[tuple[int, int]] = field(default_factory=list)  # capturing now: origin + joined
    pool: tuple[int, int] | None = None
    retained: list[tuple[int, int]] = field(default_factory=list)  # pools this graph holds
    ops: list[str] = field(default_factory=list)  # captured op names (debug_dump)
    # per collective captured, in capture order: gives it its group's next sequence number (a replay)
    collectives: list[Callable[[], int]] = field(default_factory=list)
    ended: bool = False
    has_exec: bool = False
    debug: bool = False

    def stop_capturing(self, rt: rt_mod.Runtime) -> None:
        for key in self.streams:
            rt.capturing.pop(key, None)
            rt.pool_routes.pop(key, None)
        self.streams = []

    def release(self) -> None:
        """cudaGraphExecDestroy + releasePool: the C++ destructor's reset()."""
        rt = rt_mod._runtime
        if rt is None:
            return
        with rt.lock:
            self.stop_capturing(rt)
            if self.retained:
                dm = rt.devices.get(self.device)
                if dm is not None:
                    for pool in self.retained:
                        dm.allocator.release_graph_pool(pool)
                self.retained = []
            if rt.client.connected and self.device >= 0:
                rt.client.record([P.R_GRAPH_RESET, self.graph_id])
        self.ended = self.has_exec = False


def _current(device: int | None = None) -> tuple[int, int]:
    index = torch._C._accelerator_getDeviceIndex() if device is None else device
    return index, torch._C._accelerator_getStream(index).stream_id


def is_current_stream_capturing() -> bool:
    """torch._C._cuda_isCurrentStreamCapturing."""
    rt = rt_mod._runtime
    return bool(rt is not None and rt.capturing and _current() in rt.capturing)


def graph_pool_handle() -> tuple[int, int]:
    """torch._C._graph_pool_handle: a pool id to share between captures."""
    return (0, next(_pool_uids))


def check_sync_allowed(what: str, device: int | None = None, stream: int | None = None) -> None:
    """Raise CUDA's error for a synchronisation while a capture is under way: any capture for a
    device-wide wait, the waited stream's own capture otherwise."""
    rt = rt_mod._runtime
    if rt is None or not rt.capturing:
        return
    if stream is None:
        if device is None or any(d == device for d, _ in rt.capturing):
            raise _not_permitted(what)
    elif (device, stream) in rt.capturing:
        raise _not_permitted(what)


def join_capture(event_graph: Any, device: int, stream: int) -> None:
    """cudaStreamWaitEvent on an event recorded during a capture: the waiting stream joins it."""
    rt = rt_mod.get()
    cap: _Capture | None = event_graph
    if cap is None or not cap.streams or (device, stream) in rt.capturing:
        return
    with rt.lock:
        cap.streams.append((device, stream))
        rt.capturing[(device, stream)] = cap
        origin = rt.pool_routes.get(cap.streams[0])
        if origin is not None:
            rt.pool_routes[(device, stream)] = origin
        rt.client.record([P.R_GRAPH_JOIN, cap.graph_id, device, stream])


def capture_of(device: int, stream: int) -> Any:
    rt = rt_mod._runtime
    return rt.capturing.get((device, stream)) if rt is not None and rt.capturing else None


class _CUDAGraph:
    """The simulated torch._C._CUDAGraph (the pybind class of at::cuda::CUDAGraph)."""

    def __new__(cls, keep_graph: bool = False) -> "_CUDAGraph":
        self = object.__new__(cls)
        cap = _Capture(next(_graph_ids), bool(keep_graph))
        self._phantora_capture = cap
        fin = weakref.finalize(self, cap.release)
        fin.atexit = False  # at exit the simulator connection is gone; nothing to release
        return self

    def __init__(self, keep_graph: bool = False) -> None:
        pass

    # --- capture --------------------------------------------------------------------------
    def capture_begin(self, pool: Any = None, capture_error_mode: str = "global") -> None:
        cap: _Capture = self._phantora_capture
        if cap.has_exec or cap.ended:
            raise RuntimeError("This CUDAGraph instance already owns a captured graph. "
                               "To capture a new graph, create a new instance.")
        if capture_error_mode not in _MODES:
            raise RuntimeError(f"Unknown capture error mode. Expected `global`, `thread_local`, or `relaxed`, "
                               f"got {capture_error_mode}")
        device, stream = _current()
        if stream == 0:
            raise RuntimeError("CUDA graphs must be captured on a non-default stream. "
                               "(However, after capture, it's ok to replay them on the default stream.)")
        rt = rt_mod.get()
        if (device, stream) in rt.capturing:
            raise _accelerator_error("CUDA error: operation not permitted when stream is capturing\nphantora: "
                                     f"stream {stream} of cuda:{device} is already capturing another CUDA graph")
        pool_id = tuple(int(x) for x in pool) if pool is not None and tuple(pool) != (0, 0) else None
        with rt.lock:
            cap.device, cap.stream = device, stream
            cap.pool = pool_id if pool_id is not None else (next(_private_ids), 0)
            key = rt.device_memory(device).allocator.retain_graph_pool(cap.pool)  # type: ignore[arg-type]
            cap.retained.append(cap.pool)  # type: ignore[arg-type]
            cap.streams = [(device, stream)]
            rt.capturing[(device, stream)] = cap
            rt.pool_routes[(device, stream)] = key
            rt.client.record([P.R_GRAPH_BEGIN, cap.graph_id, device, stream])

    def capture_end_pre(self) -> None:
        cap: _Capture = self._phantora_capture
        if not cap.streams:
            raise RuntimeError("capture_end() called before capture_begin().")
        if _current(cap.device) != (cap.device, cap.stream):
            raise RuntimeError("Capture must end on the same stream it began on.")
        rt = rt_mod.get()
        with rt.lock:
            cap.stop_capturing(rt)
            cap.ended = True
            rt.client.record([P.R_GRAPH_END, cap.graph_id])
        if not cap.ops:
            warnings.warn("The CUDA Graph is empty. This usually means that the graph was attempted to be "
                          "captured on wrong device or stream.", stacklevel=2)

    def capture_end_post(self) -> None:
        return None  # the template cudaGraph_t needs no destroying here

    def capture_end(self) -> None:
        self.capture_end_pre()
        if not self._phantora_capture.keep_graph:
            _CUDAGraph.instantiate(self)
        self.capture_end_post()

    def instantiate(self) -> None:
        cap: _Capture = self._phantora_capture
        if not cap.ended:
            raise RuntimeError("capture_end() must have been called before calling instantiate")
        if cap.has_exec and not cap.keep_graph:
            raise RuntimeError("instantiate() is intended to be called by the user only when keep_graph=true")
        rt_mod.get().client.record([P.R_GRAPH_INSTANTIATE, cap.graph_id])
        cap.has_exec = True

    @property
    def _has_graph_exec(self) -> bool:
        return self._phantora_capture.has_exec

    # --- replay ---------------------------------------------------------------------------
    def replay(self) -> None:
        cap: _Capture = self._phantora_capture
        if not cap.ended:
            raise RuntimeError("Called CUDAGraph::replay without a preceding successful capture.")
        if not cap.has_exec:  # keep_graph=True: instantiated on first replay
            _CUDAGraph.instantiate(self)
        device, stream = _current(cap.device)  # replays on the capture device's current stream
        if capture_of(device, stream) is not None:
            raise NotImplementedError(
                f"phantora does not simulate replaying a CUDA graph inside another capture (graph "
                f"{cap.graph_id} replayed while stream {stream} of cuda:{device} is capturing); replay it outside")
        rt_mod.get().model_work_since_step = True  # a replay runs the captured forward and backward
        rec: list[Any] = [P.R_GRAPH_REPLAY, cap.graph_id, device, stream]
        if cap.collectives:  # launched again by this replay, each with its group's next sequence number
            rec.append([next_seq() for next_seq in cap.collectives])
        rt_mod.get().client.record(rec)

    def reset(self) -> None:
        self._phantora_capture.release()
        self._phantora_capture.ops = []
        self._phantora_capture.collectives = []

    # --- pools ----------------------------------------------------------------------------
    def pool(self) -> tuple[int, int]:
        cap: _Capture = self._phantora_capture
        if not cap.ended or cap.pool is None:
            raise RuntimeError("Called CUDAGraph::pool() without a preceding successful capture.")
        return cap.pool

    def pools(self) -> list[tuple[int, int]]:
        cap: _Capture = self._phantora_capture
        if not cap.ended:
            raise RuntimeError("Called CUDAGraph::pools() without a preceding successful capture.")
        return list(cap.retained)

    def _retain_pool(self, pool: Any) -> None:
        cap: _Capture = self._phantora_capture
        pool_id = (int(pool[0]), int(pool[1]))
        if pool_id in cap.retained:
            return
        device = cap.device if cap.device >= 0 else torch._C._accelerator_getDeviceIndex()
        rt_mod.get().device_memory(device).allocator.retain_graph_pool(pool_id)
        cap.device = device
        cap.retained.append(pool_id)

    # --- debugging ------------------------------------------------------------------------
    def enable_debug_mode(self) -> None:
        cap: _Capture = self._phantora_capture
        cap.debug = cap.keep_graph = True  # torch 2.14 unifies debug mode with keep_graph

    def debug_dump(self, debug_path: str) -> None:
        """A DOT file with the captured ops in capture order (cudaGraphDebugDotPrint's nodes are
        kernels; the simulator knows those, the user process knows the ops)."""
        cap: _Capture = self._phantora_capture
        if not (cap.debug or cap.keep_graph):
            warnings.warn("CUDA Graphs debug not enabled, set with [graph].enable_debug_mode()", stacklevel=2)
            return
        self._phantora_dump_dot(debug_path)

    def _phantora_dump_dot(self, debug_path: str) -> None:
        cap: _Capture = self._phantora_capture
        lines = [f'digraph "phantora CUDA graph {cap.graph_id}" {{']
        for i, op in enumerate(cap.ops):
            lines.append(f'  n{i} [label="{op}"];')
            if i:
                lines.append(f"  n{i - 1} -> n{i};")
        lines.append("}")
        with open(debug_path, "w") as f:
            f.write("\n".join(lines) + "\n")

    def raw_cuda_graph(self) -> int:
        cap: _Capture = self._phantora_capture
        if not cap.keep_graph:
            raise RuntimeError("You cannot access the raw cudaGraph_t instance unless CUDAGraph was initialized "
                               "with keep_graph=true")
        if not cap.ended:
            raise RuntimeError("You cannot access the raw cudaGraph_t instance until capture_end() has been called")
        return 0x7E00_0000_0000 + (cap.graph_id << 8)  # an opaque handle; there is no driver behind it

    def raw_cuda_graph_exec(self) -> int:
        cap: _Capture = self._phantora_capture
        if not cap.has_exec:
            raise RuntimeError("You cannot access the raw cudaGraphExec_t instance until instantiate() has been "
                               "called")
        return 0x7E80_0000_0000 + (cap.graph_id << 8)

    def register_generator_state(self, *args: Any, **kwargs: Any) -> None:
        return None  # fake tensors draw no random numbers: nothing to offset per replay


def note_captured_collective(cap: Any, op: str, next_seq: Callable[[], int]) -> None:
    """Collective `op` was called on a stream capturing `cap`: each replay launches it again with
    the sequence number next_seq() gives then."""
    cap.collectives.append(next_seq)
    cap.ops.append(f"nccl:{op}")


def note_captured_op(cap: Any, name: str) -> None:
    """The observer saw an op on a capturing stream (kept for debug_dump and the empty-graph check)."""
    cap.ops.append(name)


def _dump_graph_dot(cuda_graph: Any, path: str, *, verbose: bool = True) -> None:
    """torch 2.14's torch.cuda.graphs._dump_graph_dot (debug_dump, export_dot) prints the template
    through cuda-bindings' cudaGraphDebugDotPrint; there is no driver graph behind ours."""
    cuda_graph._phantora_dump_dot(path)


def install_cuda_graphs() -> None:
    """Replace the C++ graph bindings and re-run torch/cuda/graphs.py on top of them."""
    C = torch._C
    C._CUDAGraph = _CUDAGraph  # type: ignore[attr-defined]
    C._graph_pool_handle = graph_pool_handle  # type: ignore[attr-defined]
    C._cuda_isCurrentStreamCapturing = is_current_stream_capturing  # type: ignore[attr-defined]
    if not hasattr(C, "_host_emptyCache"):  # pinned host memory cache (torch.cuda.graph.__enter__)
        C._host_emptyCache = lambda: None  # type: ignore[attr-defined]
    import torch.cuda.graphs as graphs

    # torch.cuda's streams module defined torch._C._CudaStreamBase (a dummy on CPU builds) before
    # this re-run, so graphs.py imports the bindings set above instead of defining dummies.
    assert hasattr(C, "_CudaStreamBase")
    graphs = importlib.reload(graphs)
    if hasattr(graphs, "_dump_graph_dot"):
        graphs._dump_graph_dot = _dump_graph_dot
    for name in ("CUDAGraph", "graph", "graph_pool_handle", "is_current_stream_capturing",
                 "make_graphed_callables", "export_dot", "export_graph_data"):
        if hasattr(graphs, name):
            setattr(torch.cuda, name, getattr(graphs, name))
