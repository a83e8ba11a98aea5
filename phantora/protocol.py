"""Wire protocol between a rank process (interpose/client.py) and the simulator.

One Unix stream socket per rank process. Each message is a 4-byte little-endian length followed
by an orjson array `[records, call]`:
  records  a batch of fire-and-forget records, applied in order (see the R_* kinds below)
  call     null, or `[call_id, kind, *args]` for a request that needs an answer (C_* kinds);
           it is answered after the records in the same message have been applied.
A reply is `[call_id, ok, value]`: ok is true and value the result, or false and value an error
message the client raises in the user's script.

Records are plain lists whose first element is the kind, so that batching thousands of them per
step costs one orjson call. This module must not import torch.
"""

from __future__ import annotations

import socket
import struct

import orjson

# --- records (no reply) ------------------------------------------------------------------------
R_SIG = 0  # [R_SIG, sig_id, OpSignature wire form]: define an interned op signature
R_OP = 1  # [R_OP, sig_id, stream_id, flags(, python_ns)]: the op was called now, on this stream of its device
R_MEM = 2  # [R_MEM, device, allocated, reserved]: allocator totals changed
R_EVENT_RECORD = 3  # [R_EVENT_RECORD, event_id, device, stream_id]
R_EVENT_WAIT = 4  # [R_EVENT_WAIT, event_id, device, stream_id]: stream waits for the event
R_SYNC_DEVICE = 5  # [R_SYNC_DEVICE, device]: host blocks until the device is idle
R_SYNC_STREAM = 6  # [R_SYNC_STREAM, device, stream_id]
R_SYNC_EVENT = 7  # [R_SYNC_EVENT, event_id]
R_NVTX_PUSH = 8  # [R_NVTX_PUSH, name]
R_NVTX_POP = 9  # [R_NVTX_POP]
R_SLEEP = 10  # [R_SLEEP, ns]: time.sleep on the host
R_STREAM = 11  # [R_STREAM, device, stream_id, priority]: a stream was created
R_WARN = 12  # [R_WARN, text]: the user side hit something worth reporting in the summary
R_OOM = 13  # [R_OOM, device, requested_bytes, message]: an allocation failed in the script
R_HOST = 14  # [R_HOST, kind, count]: Python-level work with modelled host time (cost/host.py)
R_WORK_WAIT = 15  # [R_WORK_WAIT, work_id, device, stream_id, host_blocks]: Work.wait() on a collective
R_STEP = 16  # [R_STEP]: the script's (first) optimizer finished a step: a training-step marker
R_GROUP = 17  # [R_GROUP, group name, global ranks, backend]: a process group was created (sent with --ranks, phantora/roles.py)
# [R_ROUTING, layer, sub, label, experts, k, counts]: a MoE router's decision (interpose/values/routing.py), sent when
# the counts of (layer, sub, experts) change: tokens routed to each expert, top-k
R_ROUTING = 18
# [R_PYTHON, ns]: CPU time the program spent outside phantora before the next record, on the thread
# that launches GPU work (interpose/host/host_time.py); an R_OP carries its own as a fifth field
R_PYTHON = 19
# DataLoader workers (interpose/host/data_loading.py, engine/data_loading.py):
R_LOADER_START = 20  # [R_LOADER_START, loader, workers, window]: an iterator (or epoch) starts; window: prefetched batches
R_LOADER_BATCH = 21  # [R_LOADER_BATCH, loader, worker, cpu_ns]: the loop takes a batch that cost its worker cpu_ns
R_HOST_SPEED = 22  # [R_HOST_SPEED, bench_ms]: this machine's Python benchmark now (phantora/cost/host_bench.py)
# [R_JOIN, handle, call dict]: made by the server, never sent: a C_COLLECTIVE from a rank whose host
# waits was answered with `handle` at once and joins here, in program order (server.py); a
# Work.wait() on the handle waits for the work it became
R_JOIN = 23
JOIN_HANDLE_BASE = 1 << 40  # handles of such joins start here; work ids stay far below
# [R_PIN_BATCH, loader, idx, python_ns]: a DataLoader's pin-memory thread pinned batch idx; python_ns: its
# Python in the pin (the thread's ops since the previous R_PIN_BATCH, sent with OP_BESIDE, are its ops)
R_PIN_BATCH = 24
# [KEEPALIVE, None, {"busy_s": s}]: not a reply. While the simulator works on one message for long (a
# rollback re-simulating seconds of a large network), it sends this to every rank now and then,
# as long as the network makes progress; a rank waiting for a reply skips it and waits again, so
# its timeout (PHANTORA_CALL_TIMEOUT) counts the simulator's silence, not its work
KEEPALIVE = 0  # call ids start at 1
# CUDA graphs (phantora/engine/graphs.py). Between R_GRAPH_BEGIN and R_GRAPH_END, ops on the
# capturing streams come as R_OP with OP_CAPTURED: recorded into the graph, not run.
R_GRAPH_BEGIN = 30  # [R_GRAPH_BEGIN, graph_id, device, stream_id]: cudaStreamBeginCapture on this stream
R_GRAPH_JOIN = 31  # [R_GRAPH_JOIN, graph_id, device, stream_id]: a stream joined the capture (event wait)
R_GRAPH_END = 32  # [R_GRAPH_END, graph_id]: cudaStreamEndCapture
R_GRAPH_INSTANTIATE = 33  # [R_GRAPH_INSTANTIATE, graph_id]: cudaGraphInstantiate
# [R_GRAPH_REPLAY, graph_id, device, stream_id(, seqs)]: cudaGraphLaunch on this stream; seqs: the sequence
# number each collective captured into the graph gets for this replay, in capture order (none: no collectives)
R_GRAPH_REPLAY = 34
R_GRAPH_RESET = 35  # [R_GRAPH_RESET, graph_id]: the graph was destroyed (reset() or garbage collected)

# R_OP flags: the op's context, for the host-time model (phantora/cost/host.py)
OP_BACKWARD = 1  # run by the autograd engine (backward pass, checkpoint recomputation)
OP_RECORDS_GRAD = 2  # forward op whose output requires grad: an autograd node is recorded
OP_IN_OPTIMIZER = 4  # inside Optimizer.step
OP_IN_MODULE = 8  # forward op inside an nn.Module's forward (model code, not a bare loop)
OP_CAPTURED = 32  # launched on a stream that is capturing a CUDA graph: recorded, not run
OP_COMPILED = 64  # launched by code torch.compile generated: no Python or autograd around it
OP_BESIDE = 128  # run by a thread beside the training loop (a DataLoader's pin-memory thread): not the host timeline's

# --- calls (reply expected) --------------------------------------------------------------------
C_HELLO = 0  # [id, C_HELLO, info dict: rank, local_rank, node, world_size, certain, devices] -> config dict
C_NOW = 1  # [id, C_NOW] -> host clock of this rank in ns since simulation start
C_ELAPSED = 2  # [id, C_ELAPSED, start_event_id, end_event_id] -> milliseconds (float)
C_QUERY_EVENT = 3  # [id, C_QUERY_EVENT, event_id] -> bool: has the event completed by now?
C_QUERY_STREAM = 4  # [id, C_QUERY_STREAM, device, stream_id] -> bool
C_BYE = 5  # [id, C_BYE, exit info] -> None: the process is exiting normally
# [id, C_COLLECTIVE, call dict (engine/collectives.py)] -> work id (a handle, R_JOIN, while the host waits)
C_COLLECTIVE = 6
C_IDENTIFY = 7  # [id, C_IDENTIFY, {rank, local_rank, node, world_size}] -> None: init_process_group's rank

_LEN = struct.Struct("<I")
MAX_MESSAGE = 1 << 30


class ProtocolError(RuntimeError):
    pass


def kept_json(value: object) -> bytes:
    """orjson.dumps(value) in a bytes object of its own size, for JSON that is kept (a dict key, a
    buffered event): orjson's result holds on to its 4 KiB output buffer, so 65,536 short keys
    kept that way cost 260 MiB instead of 5."""
    return compact(orjson.dumps(value))


def compact(data: bytes) -> bytes:
    """A copy of orjson's output at its own size (kept_json), for one looked up before it is kept."""
    return bytes(memoryview(data))


def encode(obj: object) -> bytes:
    body = orjson.dumps(obj)
    return _LEN.pack(len(body)) + body


def send_message(sock: socket.socket, obj: object) -> None:
    sock.sendall(encode(obj))


class MessageBuffer:
    """Reassembles length-prefixed messages from a non-blocking socket's byte stream."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[object]:
        self._buf += data
        out = []
        while len(self._buf) >= 4:
            (n,) = _LEN.unpack_from(self._buf, 0)
            if n > MAX_MESSAGE:
                raise ProtocolError(f"message of {n} bytes exceeds the {MAX_MESSAGE}-byte limit")
            if len(self._buf) < 4 + n:
                break
            out.append(orjson.loads(bytes(self._buf[4 : 4 + n])))
            del self._buf[: 4 + n]
        return out

    @property
    def pending_bytes(self) -> int:
        return len(self._buf)
