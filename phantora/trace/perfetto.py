"""Native Perfetto protobuf traces (`phantora trace -o run.pftrace`): writer and reader.

The file is a `Trace` proto (perfetto_trace.proto, PyPI package `perfetto`): a stream of
`TracePacket`s carrying TrackEvents, the format the Perfetto SDK writes. `PerfettoProtoSink`
writes in it what the Chrome JSON output holds (chrome.py); `read_pftrace` / `load_pftrace`
decode it back to the same JSON events. Choices, and why:

Track tree. `phantora query` runs the same SQL on a .json and a .pftrace through Perfetto's
tables (process, thread, thread_track, process_counter_track, ...), so every pid/tid of the JSON
keeps its identity: a rank (and the simulator and network processes) is a track with a
`ProcessDescriptor` (pid, name), its host and CUDA stream tracks are tracks with a
`ThreadDescriptor` (pid, tid, name) whose parent is the process track. The trace processor
gives a `ProcessDescriptor` track no parent (TrackEventTracker::ReserveDescriptorProcessTrack
takes none; a process track is always a root), so ranks cannot be nested under "node" or
"cluster" tracks without ceasing to be processes. Node and cluster grouping is therefore
expressed the way the JSON does it: the process name ("rank 3 · node 0 · GPU 3 · H100") and its
sort index (the rank, node-major), written as `legacy_sort_index`, which the trace processor
stores as `process_sort_index_hint` / `thread_sort_index_hint`, the same args the JSON's
process_sort_index / thread_sort_index events become and the args the UI orders by; the cluster
itself is described in the metadata. Below a process the tree is explicit: each counter event
name ("cuda:0 memory", "link nvlink0") is a group track (a child of the process) whose children
are one counter track per value ("cuda:0 memory allocated", "cuda:0 memory reserved": the names
the JSON importer gives those counters), so memory counters sit under their GPU and link
counters under the "network" process, and rollback instants under the simulator process. A
counter event is one TYPE_COUNTER packet per value, written one after the other (not one packet
with `extra_counter_values`, which older trace processors ignore); the reader joins them again.

Metadata. The JSON's top-level "metadata" dict goes where Chrome's own protobuf traces keep it:
`ChromeEventBundle.metadata` (one `ChromeMetadata` per key: strings, ints and bools as such,
anything else as JSON), which the trace processor files in its `metadata` table.

Slices. TrackEvent has no complete event, so each slice is a SLICE_BEGIN and a SLICE_END, and
those must nest per track. The engine writes a slice when it ends, and on each track in order of
start time (TraceSink's contract), except slices it announces with `open_slice` when they start:
an nvtx range (it may enclose what follows; its begin is written then, its end when it closes)
and a collective's host call (its end is known but its args and its link to the NCCL kernel
come only once the collective has run, after later host slices). Each track keeps a small heap
of events not yet written and a watermark, the latest start seen: an event earlier than the
watermark can no longer be preceded by anything still to come, so it is written; events at or
after it wait. The events at the start and end times of an announced host call wait (parked)
until it is written, while later ones go on; its begin, written then, carries its args and
flows as any slice's does. Memory per track is therefore the slices in flight (usually one or
two), not the run, and the file is in time order per track but for those parked events. Events
at one timestamp are written in the order that makes them nest the way the JSON importer nests
complete events (longer first, ends before begins, zero-length slices inside a slice that starts
with them), because the trace processor sorts packets by timestamp and keeps file order among
equal timestamps (TraceSorter sorts by timestamp, then position). A slice that breaks the
contract (starts before its track's watermark) is still written, with correct timestamps; only
its nesting among equal timestamps may differ, and it is counted in `late_slices`.

Flows. The host-op -> kernel arrows (JSON bind_id) are TrackEvent flows: the flow id on the op's
begin, the same id as a terminating flow id on the kernel's. A collective's participant arrows
(JSON v1 "s"/"f") are TrackEvent flows too, in their own id space (`COLLECTIVE_FLOW_BIT`),
attached to the begins of the slices they connect, which are still unwritten when the engine
reports the flow (it does so right after writing them). The ids go in `flow_ids_old` /
`terminating_flow_ids_old` (varints): current trace processors read them when the fixed64
`flow_ids` are absent (TrackEventParser::MaybeParseTrackEventFlows) and older ones read only
them. The trace processor meets flow ids in time order and drops an arrow whose terminating id
it meets before its start, so a collective arrow whose destination slice starts before its
source's (a receive waiting for its send) carries the id as a plain flow id on both begins: the
trace processor starts the arrow at the first and continues it to the second (ordering the two
ends by their slices' start times, as it does for the JSON's "s"/"f" pair). TrackEvent flows
have no name and bind to slices, not times; each collective arrow's JSON "s"/"f" events (name,
places, times) are kept, for the reader, as a small JSON record in an interned event name (iid
= flow id) on a second packet sequence that no event refers to, which the trace processor
ignores.

Interning. Event names, categories and debug-annotation names are interned per sequence
(`interned_data` + `sequence_flags`), each stored once; the tables are capped (`_INTERN_LIMIT`),
after which new strings are written inline, so memory stays bounded. String values stay inline:
interned ones (`string_value_iid`) are lost on older trace processors, and interning them saved
only 12% of a GPT trace. Every packet carries `trusted_packet_sequence_id` (the trace processor
drops events without one).

Streaming. Packets are appended to `<path>.partial` as they are produced and the file is renamed
on `close`, which the simulator calls on every exit path; a closed file is a complete trace.

Reading. `read_pftrace` follows the trace processor's rules, so it reads any TrackEvent trace of
this shape the way Perfetto would: interned strings per packet sequence (reset on
SEQ_INCREMENTAL_STATE_CLEARED), events sorted per track by timestamp and then file position
before begins and ends are paired, args from the debug annotations (nested dicts and arrays
included) of a slice's begin and end. A counter track whose parent is a named group track reads
back as a key of one "C" event named after the group; consecutive values of one group at one
timestamp (and `extra_*counter_values` of a packet) make one event. The whole file is decoded in
memory, as the JSON loader does.
"""

from __future__ import annotations

import gzip
import heapq
import math
import os
import struct
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import orjson
from google.protobuf.message import DecodeError
from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import (ChromeEventBundle, DebugAnnotation, InternedData,
                                                               TracePacket, TrackDescriptor, TrackEvent)

from phantora.protocol import compact, kept_json
from phantora.trace.chrome import (counter_event, flow_events, instant_event, process_events, slice_event,
                                   thread_events)

# Packet sequences: all events on one; the collective flows' records on another (see above).
EVENT_SEQUENCE_ID = 1
FLOW_RECORD_SEQUENCE_ID = 2
# Flow-id space of collective participant arrows, apart from the engine's bind ids.
COLLECTIVE_FLOW_BIT = 1 << 63

_BEGIN, _END, _INSTANT, _COUNTER = (TrackEvent.TYPE_SLICE_BEGIN, TrackEvent.TYPE_SLICE_END,
                                    TrackEvent.TYPE_INSTANT, TrackEvent.TYPE_COUNTER)
_NESTED_ARRAY = DebugAnnotation.NestedValue.ARRAY
_NESTED_DICT = DebugAnnotation.NestedValue.DICT

_INTERN_LIMIT = 1 << 17  # strings per intern table; beyond it new strings are written inline
_ANNOTATION_CACHE_LIMIT = 1 << 16  # cached encodings of (arg name, value) pairs
_WRITE_BUFFER = 1 << 20
_INT64_MIN, _INT64_MAX, _UINT64_MAX = -(1 << 63), (1 << 63) - 1, (1 << 64) - 1
_OPEN = -(1 << 62)  # sort key of an open slice's unknown (-duration): outermost at its start

# Phase of an event in its timestamp's group: ends, then begins, then zero-length slices and
# instants (the nesting the JSON importer gives complete events with equal timestamps).
_PHASE_END, _PHASE_BEGIN, _PHASE_POINT = 0, 1, 2


def _varint_slow(n: int) -> bytes:
    out = []
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


_SMALL_VARINTS = [_varint_slow(i) for i in range(1 << 14)]  # one and two bytes: lengths, ids


def _varint(n: int) -> bytes:
    return _SMALL_VARINTS[n] if 0 <= n < 0x4000 else _varint_slow(n)


def _key(field_number: int, wire_type: int) -> bytes:
    return _varint((field_number << 3) | wire_type)


# Packets are assembled from their fields' encodings (protobuf wire format: key, then varint or
# length-delimited bytes) around payloads serialized by the perfetto_trace_pb2 messages: the
# envelope of every packet is the same few fields, and building a TracePacket message for each
# one cost as much as its whole payload. Field numbers come from the generated protos.
_VARINT, _LEN = 0, 2
_TRACE_PACKET_KEY = _key(1, _LEN)  # Trace.packet: a trace is a stream of these
_TIMESTAMP_KEY = _key(TracePacket.TIMESTAMP_FIELD_NUMBER, _VARINT)
_SEQUENCE_KEY = _key(TracePacket.TRUSTED_PACKET_SEQUENCE_ID_FIELD_NUMBER, _VARINT)
_FLAGS_KEY = _key(TracePacket.SEQUENCE_FLAGS_FIELD_NUMBER, _VARINT)
_FIRST_ON_SEQUENCE = (_key(TracePacket.FIRST_PACKET_ON_SEQUENCE_FIELD_NUMBER, _VARINT) + b"\x01"
                      + _key(TracePacket.PREVIOUS_PACKET_DROPPED_FIELD_NUMBER, _VARINT) + b"\x01")
_TRACK_EVENT_KEY = _key(TracePacket.TRACK_EVENT_FIELD_NUMBER, _LEN)
_TRACK_DESCRIPTOR_KEY = _key(TracePacket.TRACK_DESCRIPTOR_FIELD_NUMBER, _LEN)
_CHROME_EVENTS_KEY = _key(TracePacket.CHROME_EVENTS_FIELD_NUMBER, _LEN)
_INTERNED_DATA_KEY = _key(TracePacket.INTERNED_DATA_FIELD_NUMBER, _LEN)
_DEBUG_ANNOTATIONS_KEY = _key(TrackEvent.DEBUG_ANNOTATIONS_FIELD_NUMBER, _LEN)
_FLOW_ID_KEY = _key(TrackEvent.FLOW_IDS_OLD_FIELD_NUMBER, _VARINT)
_TERMINATING_FLOW_ID_KEY = _key(TrackEvent.TERMINATING_FLOW_IDS_OLD_FIELD_NUMBER, _VARINT)
_COUNTER_VALUE_KEY = _key(TrackEvent.COUNTER_VALUE_FIELD_NUMBER, _VARINT)
_DOUBLE_COUNTER_VALUE_KEY = _key(TrackEvent.DOUBLE_COUNTER_VALUE_FIELD_NUMBER, 1)  # 64-bit
_FLAGS_FIRST = _FLAGS_KEY + _varint(TracePacket.SEQ_INCREMENTAL_STATE_CLEARED | TracePacket.SEQ_NEEDS_INCREMENTAL_STATE)
_FLAGS_NEXT = _FLAGS_KEY + _varint(TracePacket.SEQ_NEEDS_INCREMENTAL_STATE)


@dataclass(eq=False)
class _Slice:
    """One slice or instant waiting on its track's heap until its events are written."""

    seq: int  # arrival order on the track: breaks ties between identical intervals
    name: str
    cat: str
    start: int
    dur: int | None  # None while an open slice has not ended
    args: dict[str, Any] | None = None
    flow_ids: list[int] = field(default_factory=list)
    terminating_flow_ids: list[int] = field(default_factory=list)
    # An open slice's args and flows arrive when it is written: they go on its begin when that
    # is still waiting, else on its end event.
    end_args: dict[str, Any] | None = None
    end_flow_ids: list[int] = field(default_factory=list)
    end_terminating_flow_ids: list[int] = field(default_factory=list)
    announced_end: int | None = None  # an open slice's end, when open_slice gave it
    blocking: tuple[int, ...] = ()  # the times whose events wait for this open slice
    begin_written: bool = False
    instant: bool = False


@dataclass(eq=False)
class _ThreadTrack:
    uuid: int
    end_event: bytes  # this track's TrackEvent SLICE_END without args, serialized once
    watermark: int = -1  # latest start seen: nothing still to come starts earlier
    last_ts: int = 0  # latest timestamp seen (where still-open slices end on close)
    heap: list[tuple[Any, ...]] = field(default_factory=list)
    opens: dict[tuple[str, int], list[_Slice]] = field(default_factory=dict)
    # Start and end of open slices announced with their end: the events at such a time wait
    # (parked) until the slice is written, so that its begin can carry its args and flows and
    # its begin and end take their places among the other events at those times.
    blocked: dict[int, int] = field(default_factory=dict)  # time -> open slices blocking it
    parked: dict[int, list[tuple[Any, ...]]] = field(default_factory=dict)
    seq: int = 0


class PerfettoProtoSink:
    """A TraceSink writing a native Perfetto protobuf trace (see the module docstring)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._partial = path.with_name(path.name + ".partial")
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file: IO[bytes] = open(self._partial, "wb", buffering=_WRITE_BUFFER)
        self._uuids = 0
        self._processes: dict[int, int] = {}  # pid -> process track uuid
        self._threads: dict[tuple[int, int], _ThreadTrack] = {}
        self._counter_groups: dict[tuple[int, str], int] = {}
        self._counter_tracks: dict[tuple[int, str, str], int] = {}
        self._counter_events: dict[int, bytes] = {}  # counter track -> its TrackEvent without a value
        self._sequence_heads: dict[int, bytes] = {}  # sequence id -> its packets' id and flags fields
        # Intern tables of the event sequence (string -> iid); new entries go into `_interned`,
        # which is written with the packet being built (the first one that uses them).
        self._names: dict[str, int] = {}
        self._cats: dict[str, int] = {}
        self._arg_names: dict[str, int] = {}
        self._interned = InternedData()
        self._interned_new = False
        # Scratch messages, cleared and refilled for each packet.
        self._event = TrackEvent()
        self._annotation = DebugAnnotation()
        self._annotation_cache: dict[tuple[Any, bytes], bytes] = {}
        self._begin_events: dict[tuple[int, int, str, str], bytes] = {}
        self.packets_written = 0
        self.bytes_written = 0
        self.late_slices = 0  # slices that started before their track's watermark
        self.unbound_flows = 0  # collective flows whose slices were already written
        self.unclosed_slices = 0  # open slices still open on close (ended at their track's last event)
        self.closed = False

    # --- packets --------------------------------------------------------------------------------
    def _write(self, payload_key: bytes, payload: bytes, ts: int | None = None,
               sequence: int = EVENT_SEQUENCE_ID, interned: bytes = b"") -> None:
        """One TracePacket: `payload` (a serialized message) under `payload_key`, the packet's
        timestamp, sequence id and flags, and the strings interned while building it."""
        head = self._sequence_heads.get(sequence)
        if head is None:  # the first packet of a sequence starts its incremental (interning) state
            self._sequence_heads[sequence] = _SEQUENCE_KEY + _varint(sequence) + _FLAGS_NEXT
            head = _SEQUENCE_KEY + _varint(sequence) + _FLAGS_FIRST + _FIRST_ON_SEQUENCE
        if self._interned_new and sequence == EVENT_SEQUENCE_ID:  # (the intern tables are that sequence's)
            interned = self._interned.SerializeToString()
            self._interned.Clear()
            self._interned_new = False
        packet = head if ts is None else _TIMESTAMP_KEY + _varint(ts) + head
        if payload_key:
            packet += payload_key + _varint(len(payload)) + payload
        if interned:
            packet += _INTERNED_DATA_KEY + _varint(len(interned)) + interned
        framed = _TRACE_PACKET_KEY + _varint(len(packet)) + packet
        self._file.write(framed)
        self.packets_written += 1
        self.bytes_written += len(framed)

    def _intern(self, table: dict[str, int], value: str) -> int:
        """The iid of `value`, 0 when the table is full (write it inline then)."""
        iid = table.get(value)
        if iid is not None:
            return iid
        if len(table) >= _INTERN_LIMIT:
            return 0
        iid = table[value] = len(table) + 1
        self._interned_new = True
        interned = self._interned
        if table is self._names:
            interned.event_names.add(iid=iid, name=value)
        elif table is self._cats:
            interned.event_categories.add(iid=iid, name=value)
        else:
            interned.debug_annotation_names.add(iid=iid, name=value)
        return iid

    # --- tracks ---------------------------------------------------------------------------------
    def _next_uuid(self) -> int:
        self._uuids += 1
        return self._uuids

    def _process_track(self, pid: int, name: str | None = None, sort_index: int = 0) -> int:
        """The uuid of `pid`'s process track. Its descriptor is written when the track is
        created (named if `name` is given) and again whenever a name is given."""
        uuid = self._processes.get(pid)
        if uuid is not None and name is None:
            return uuid
        if uuid is None:
            uuid = self._processes[pid] = self._next_uuid()
        desc = TrackDescriptor(uuid=uuid)
        desc.process.pid = pid
        if name is not None:
            desc.process.process_name = name
            desc.process.legacy_sort_index = sort_index
        self._write(_TRACK_DESCRIPTOR_KEY, desc.SerializeToString())
        return uuid

    def _thread_track(self, pid: int, tid: int, name: str | None = None, sort_index: int = 0) -> _ThreadTrack:
        """The thread track (pid, tid), a child of its process track; descriptor as above."""
        track = self._threads.get((pid, tid))
        if track is not None and name is None:
            return track
        parent = self._process_track(pid)
        if track is None:
            uuid = self._next_uuid()
            track = self._threads[(pid, tid)] = _ThreadTrack(
                uuid, TrackEvent(type=_END, track_uuid=uuid).SerializeToString())
        desc = TrackDescriptor(uuid=track.uuid, parent_uuid=parent)
        desc.thread.pid = pid
        desc.thread.tid = tid
        if name is not None:
            desc.thread.thread_name = name
            desc.thread.legacy_sort_index = sort_index
        self._write(_TRACK_DESCRIPTOR_KEY, desc.SerializeToString())
        return track

    def _counter_track(self, pid: int, name: str, key: str) -> int:
        uuid = self._counter_tracks.get((pid, name, key))
        if uuid is not None:
            return uuid
        group = self._counter_groups.get((pid, name))
        if group is None:
            group = self._counter_groups[(pid, name)] = self._next_uuid()
            desc = TrackDescriptor(uuid=group, parent_uuid=self._process_track(pid), name=name)
            self._write(_TRACK_DESCRIPTOR_KEY, desc.SerializeToString())
        uuid = self._counter_tracks[(pid, name, key)] = self._next_uuid()
        self._counter_events[uuid] = TrackEvent(type=_COUNTER, track_uuid=uuid).SerializeToString()
        # Named as Perfetto's JSON importer names this counter ("<event name> <key>").
        desc = TrackDescriptor(uuid=uuid, parent_uuid=group, name=f"{name} {key}")
        desc.counter.SetInParent()
        self._write(_TRACK_DESCRIPTOR_KEY, desc.SerializeToString())
        return uuid

    # --- TraceSink --------------------------------------------------------------------------------
    def process(self, pid: int, name: str, sort_index: int) -> None:
        self._process_track(pid, name, sort_index)

    def thread(self, pid: int, tid: int, name: str, sort_index: int) -> None:
        self._thread_track(pid, tid, name, sort_index)

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
        track = self._thread_track(pid, tid)
        waiting = track.opens.get((name, ts_ns))
        if waiting:
            self._end_open(track, waiting.pop(), dur_ns, args, flow_out, flow_in)  # nvtx ranges close last-opened first
            if not waiting:
                del track.opens[(name, ts_ns)]
        else:
            s = self._new_slice(track, name, cat, ts_ns, dur_ns, args)
            if flow_out is not None:
                s.flow_ids.append(flow_out)
            elif flow_in is not None:
                s.terminating_flow_ids.append(flow_in)
            if dur_ns > 0:
                self._push(track, (ts_ns, _PHASE_BEGIN, -dur_ns, s.seq), s)
                self._push(track, (ts_ns + dur_ns, _PHASE_END, -ts_ns, -s.seq), s)
            else:
                self._push(track, (ts_ns, _PHASE_POINT, s.seq, 0), s)
        self._advance(track, ts_ns)

    def open_slice(self, pid: int, tid: int, name: str, ts_ns: int, cat: str, end_ns: int | None = None) -> None:
        track = self._thread_track(pid, tid)
        s = self._new_slice(track, name, cat, ts_ns, None, None)
        track.opens.setdefault((name, ts_ns), []).append(s)
        if end_ns is None:  # may enclose what comes until it ends: outermost at its start
            self._push(track, (ts_ns, _PHASE_BEGIN, _OPEN, s.seq), s)
        else:
            s.announced_end = end_ns
            s.blocking = (ts_ns, end_ns) if end_ns > ts_ns else (ts_ns,)
            for t in s.blocking:
                track.blocked[t] = track.blocked.get(t, 0) + 1
            if end_ns > ts_ns:
                self._push(track, (ts_ns, _PHASE_BEGIN, ts_ns - end_ns, s.seq), s)
            else:  # zero length: its begin waits at the blocked time with the rest
                self._push(track, (ts_ns, _PHASE_POINT, s.seq, 0), s)
        self._advance(track, ts_ns)

    def instant(self, pid: int, tid: int, name: str, ts_ns: int, cat: str, args: dict[str, Any] | None = None) -> None:
        track = self._thread_track(pid, tid)
        track.seq += 1
        s = _Slice(track.seq, name, cat, ts_ns, 0, args, instant=True)
        self._push(track, (ts_ns, _PHASE_POINT, s.seq, 0), s)
        if ts_ns >= track.watermark:
            self._advance(track, ts_ns)
        else:  # instants may come out of order (rollbacks go back in time): written as they come
            self._flush(track)

    def counter(self, pid: int, name: str, ts_ns: int, values: dict[str, float]) -> None:
        tracks = [(self._counter_track(pid, name, str(key)), value) for key, value in values.items()
                  if value is not None]
        for uuid, value in tracks:  # one after the other: the reader joins them into one event
            # Integers stay integers (counter_value), as they do in the JSON.
            if isinstance(value, int) and _INT64_MIN <= value <= _INT64_MAX:
                encoded = _COUNTER_VALUE_KEY + _varint(value & _UINT64_MAX)  # int64: two's complement
            else:
                encoded = _DOUBLE_COUNTER_VALUE_KEY + struct.pack("<d", value)
            self._write(_TRACK_EVENT_KEY, self._counter_events[uuid] + encoded, ts_ns)

    def flow(self, flow_id: int, name: str, src: tuple[int, int, int], dst: tuple[int, int, int]) -> None:
        source, target = self._enclosing(src), self._enclosing(dst)
        if source is None or target is None:
            self.unbound_flows += 1
            return
        fid = COLLECTIVE_FLOW_BIT | flow_id
        source.flow_ids.append(fid)
        # A destination that starts first would meet a terminating id before the arrow's start; one
        # that starts at the same time may be met first too (the trace processor orders equal
        # timestamps of different sequences as it likes: a 2-rank all-reduce starting at the same
        # ns on both ranks lost its arrow in some runs), so only a later one terminates it.
        (target.terminating_flow_ids if target.start > source.start else target.flow_ids).append(fid)
        record = InternedData()
        record.event_names.add(iid=fid, name=orjson.dumps({"name": name, "src": src, "dst": dst}).decode())
        self._write(b"", b"", sequence=FLOW_RECORD_SEQUENCE_ID, interned=record.SerializeToString())

    def flush(self) -> None:
        """Packets written so far to disk (packets held for ordering stay held): a protobuf
        trace cut between packets is read up to the last whole one."""
        if not self.closed:
            self._file.flush()

    def close(self, metadata: dict[str, Any]) -> None:
        if self.closed:
            return
        self.closed = True
        for track in self._threads.values():
            for waiting in list(track.opens.values()):
                for s in waiting:
                    self.unclosed_slices += 1
                    end = s.announced_end if s.announced_end is not None else max(track.last_ts, s.start)
                    self._end_open(track, s, end - s.start, None, None, None)
            track.opens.clear()
            track.watermark = math.inf  # type: ignore[assignment]
            self._flush(track)
        bundle = ChromeEventBundle()
        for key, value in metadata.items():
            entry = bundle.metadata.add(name=str(key))
            if isinstance(value, bool):
                entry.bool_value = value
            elif isinstance(value, int) and _INT64_MIN <= value <= _INT64_MAX:
                entry.int_value = value
            elif isinstance(value, str):
                entry.string_value = value
            else:
                entry.json_value = orjson.dumps(value).decode()
        self._write(_CHROME_EVENTS_KEY, bundle.SerializeToString())
        self._file.close()
        os.replace(self._partial, self.path)

    # --- ordering ---------------------------------------------------------------------------------
    def _new_slice(self, track: _ThreadTrack, name: str, cat: str, start: int, dur: int | None,
                   args: dict[str, Any] | None) -> _Slice:
        if start < track.watermark:
            self.late_slices += 1
        track.seq += 1
        return _Slice(track.seq, name, cat, start, dur, args)

    def _end_open(self, track: _ThreadTrack, s: _Slice, dur: int, args: dict[str, Any] | None,
                  flow_out: int | None, flow_in: int | None) -> None:
        s.dur = dur
        flow_ids, terminating = ((s.flow_ids, s.terminating_flow_ids) if not s.begin_written
                                 else (s.end_flow_ids, s.end_terminating_flow_ids))
        if flow_out is not None:
            flow_ids.append(flow_out)
        elif flow_in is not None:
            terminating.append(flow_in)
        if s.begin_written:
            s.end_args = args
        else:
            s.args = args
        if not (dur == 0 and not s.begin_written):  # else its begin, still waiting, writes the end too
            self._push(track, (s.start + dur, _PHASE_END, -s.start, -s.seq), s)
        for t in s.blocking:
            left = track.blocked.pop(t) - 1
            if left:
                track.blocked[t] = left
            else:  # the events that waited at that time may go now, in their order
                for entry in track.parked.pop(t, ()):
                    heapq.heappush(track.heap, entry)
        self._flush(track)

    def _push(self, track: _ThreadTrack, key: tuple[int, int, int, int], s: _Slice) -> None:
        heapq.heappush(track.heap, (*key, s))
        end = s.start + (s.dur or 0)
        if end > track.last_ts:
            track.last_ts = end

    def _advance(self, track: _ThreadTrack, start: int) -> None:
        if start > track.watermark:
            track.watermark = start
        self._flush(track)

    def _flush(self, track: _ThreadTrack) -> None:
        heap = track.heap
        while heap and heap[0][0] < track.watermark:
            entry = heapq.heappop(heap)
            ts, phase, _, _, s = entry
            if ts in track.blocked:
                track.parked.setdefault(ts, []).append(entry)
                continue
            if phase == _PHASE_END:
                self._write_end(track, ts, s)
            else:
                self._write_begin(track, _INSTANT if s.instant else _BEGIN, ts, s)
                s.begin_written = True
                if s.dur == 0 and not s.instant:  # zero-length (or an open slice that ended at once)
                    self._write_end(track, ts, s)

    def _enclosing(self, place: tuple[int, int, int]) -> _Slice | None:
        """The innermost slice on track place[:2] that contains time place[2] and whose begin
        is not written yet (flow ids go on the begin)."""
        track = self._threads.get((place[0], place[1]))
        if track is None:
            return None
        ts = place[2]
        best: _Slice | None = None
        for entry in [*track.heap, *(e for parked in track.parked.values() for e in parked)]:
            s = entry[4]
            if s.instant or s.begin_written or entry[1] == _PHASE_END:
                continue
            if s.start <= ts and (s.dur is None or ts <= s.start + s.dur):
                if best is None or (s.start, s.seq) > (best.start, best.seq):
                    best = s
        return best

    # --- events ---------------------------------------------------------------------------------
    def _write_begin(self, track: _ThreadTrack, kind: int, ts: int, s: _Slice) -> None:
        # The event's type, track, name and category repeat: serialized once (the first time
        # also interns the name and category, into this packet), then reused.
        key = (track.uuid, kind, s.name, s.cat)
        payload = self._begin_events.get(key)
        if payload is None:
            ev = self._event
            ev.Clear()
            ev.type = kind
            ev.track_uuid = track.uuid
            iid = self._intern(self._names, s.name)
            if iid:
                ev.name_iid = iid
            else:
                ev.name = s.name
            iid = self._intern(self._cats, s.cat)
            if iid:
                ev.category_iids.append(iid)
            else:
                ev.categories.append(s.cat)
            payload = ev.SerializeToString()
            if len(self._begin_events) >= _ANNOTATION_CACHE_LIMIT:
                self._begin_events.clear()
            self._begin_events[key] = payload
        # Fields of a message may come in any order: flows and args follow.
        for fid in s.flow_ids:
            payload += _FLOW_ID_KEY + _varint(fid)
        for fid in s.terminating_flow_ids:
            payload += _TERMINATING_FLOW_ID_KEY + _varint(fid)
        if s.args:
            payload += self._annotations(s.args)
        self._write(_TRACK_EVENT_KEY, payload, ts)

    def _write_end(self, track: _ThreadTrack, ts: int, s: _Slice) -> None:
        payload = track.end_event
        # The trace processor binds the flows of an end event to the slice it ends.
        for fid in s.end_flow_ids:
            payload += _FLOW_ID_KEY + _varint(fid)
        for fid in s.end_terminating_flow_ids:
            payload += _TERMINATING_FLOW_ID_KEY + _varint(fid)
        if s.end_args:
            payload += self._annotations(s.end_args)
        self._write(_TRACK_EVENT_KEY, payload, ts)

    def _annotations(self, args: dict[str, Any]) -> bytes:
        """`args` as serialized TrackEvent.debug_annotations fields, to append to an event.

        Most (name, value) pairs repeat from event to event (op, dtypes, shapes, estimator...), so
        each pair's encoding is cached, keyed by its JSON text (which tells 1 from 1.0 and true);
        interned ids in a cached encoding stay valid because the intern tables only grow."""
        out = []
        cache = self._annotation_cache
        for key, value in args.items():
            cache_key = (key, orjson.dumps(value))  # only a key that is kept is copied (compact)
            encoded = cache.get(cache_key)
            if encoded is None:
                ann = self._annotation
                ann.Clear()
                self._set_name(ann, key)
                self._set_value(ann, value)
                data = ann.SerializeToString()
                encoded = _DEBUG_ANNOTATIONS_KEY + _varint(len(data)) + data
                if len(cache) >= _ANNOTATION_CACHE_LIMIT:
                    cache.clear()
                cache[(key, compact(cache_key[1]))] = encoded
            out.append(encoded)
        return b"".join(out)

    def _set_name(self, ann: DebugAnnotation, key: Any) -> None:
        name = str(key)
        iid = self._intern(self._arg_names, name)
        if iid:
            ann.name_iid = iid
        else:
            ann.name = name

    def _set_value(self, ann: DebugAnnotation, value: Any) -> None:
        """Debug-annotation value of a JSON-able arg. None (and NaN/inf, which orjson writes as
        null) leaves the value unset, which the trace processor skips as the JSON importer
        skips null; empty lists/dicts are typed nested values so they read back as such."""
        if value is None:
            return
        if isinstance(value, bool):
            ann.bool_value = value
        elif isinstance(value, int):
            if _INT64_MIN <= value <= _INT64_MAX:
                ann.int_value = value
            elif 0 <= value <= _UINT64_MAX:
                ann.uint_value = value
            else:
                ann.legacy_json_value = str(value)
        elif isinstance(value, float):
            if math.isfinite(value):
                ann.double_value = value
        elif isinstance(value, str):
            ann.string_value = value
        elif isinstance(value, (list, tuple)):
            if not value:
                ann.nested_value.nested_type = _NESTED_ARRAY
            for item in value:
                self._set_value(ann.array_values.add(), item)
        elif isinstance(value, dict):
            if not value:
                ann.nested_value.nested_type = _NESTED_DICT
            for k, item in value.items():
                entry = ann.dict_entries.add()
                self._set_name(entry, k)
                self._set_value(entry, item)
        else:
            ann.string_value = str(value)


# --- reading ---------------------------------------------------------------------------------------

class PftraceFormatError(ValueError):
    """The file is not a (complete) Perfetto protobuf trace."""


_NESTED = DebugAnnotation.NestedValue


@dataclass
class _Interned:
    """One packet sequence's interned strings (kind -> iid -> string)."""

    names: dict[int, str] = field(default_factory=dict)
    cats: dict[int, str] = field(default_factory=dict)
    arg_names: dict[int, str] = field(default_factory=dict)
    strings: dict[int, str] = field(default_factory=dict)
    # Decoded debug annotations by their encoding (valid while these tables are): the same
    # (name, value) pairs repeat from event to event. Values are kept as JSON when they are
    # lists or dicts, so that each event gets its own copy.
    annotations: dict[bytes, tuple[str, Any, bool]] = field(default_factory=dict)


@dataclass
class _Track:
    uuid: int
    parent: int = 0
    name: str | None = None
    pid: int | None = None
    tid: int | None = None
    counter: bool = False


@dataclass(slots=True)
class _TrackEventRecord:
    ts: int
    position: int  # packet index in the file: ties at one timestamp keep file order
    kind: int
    name: str
    cat: str
    args: dict[str, Any]
    flow_ids: list[int]
    terminating_flow_ids: list[int]


@dataclass
class PftraceEvents:
    """A decoded .pftrace: iterate it for the Chrome JSON event dicts; `metadata` is the JSON's
    top-level metadata dict."""

    events: list[dict[str, Any]]
    metadata: dict[str, Any]

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return iter(self.events)


def read_pftrace(path: str | Path) -> PftraceEvents:
    """The events of a .pftrace as Chrome JSON event dicts, and its metadata (see the module
    docstring). PftraceFormatError, naming the file, when it is not one."""
    decoder = _Decoder(Path(path))
    events = list(decoder.events())
    return PftraceEvents(events, decoder.metadata)


def load_pftrace(path: str | Path) -> dict[str, Any]:
    """The whole trace in the shape of a loaded Chrome JSON trace:
    {"traceEvents": [...], "metadata": {...}}."""
    trace = read_pftrace(path)
    return {"traceEvents": trace.events, "metadata": trace.metadata}


def _varint_at(buf: bytes, i: int, path: Path) -> tuple[int, int]:
    """The varint at buf[i:] and the index after it."""
    result, shift = 0, 0
    while True:
        if i >= len(buf):
            raise PftraceFormatError(f"{path}: the trace ends in the middle of a packet (truncated file?)")
        b = buf[i]
        i += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, i
        shift += 7
        if shift > 63:
            raise PftraceFormatError(f"{path}: not a Perfetto protobuf trace (bad varint at byte {i})")


def _packets(buf: bytes, path: Path) -> Iterator[bytes]:
    """The TracePacket payloads of a Trace (its field 1); other top-level fields are skipped."""
    i, n = 0, len(buf)
    while i < n:
        tag, i = _varint_at(buf, i, path)
        field_number, wire_type = tag >> 3, tag & 7
        if wire_type == 2:
            size, i = _varint_at(buf, i, path)
            if i + size > n:
                raise PftraceFormatError(f"{path}: the trace ends in the middle of a packet (truncated file?)")
            if field_number == 1:
                yield buf[i:i + size]
            elif i == 0:
                break
            i += size
        elif wire_type == 0:
            _, i = _varint_at(buf, i, path)
        elif wire_type in (1, 5):
            i += 8 if wire_type == 1 else 4
        else:
            raise PftraceFormatError(f"{path}: not a Perfetto protobuf trace (wire type {wire_type} at byte {i})")
        if field_number == 0:
            raise PftraceFormatError(f"{path}: not a Perfetto protobuf trace (field 0 at byte {i})")
    if i > n:
        raise PftraceFormatError(f"{path}: the trace ends in the middle of a packet (truncated file?)")


class _Decoder:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.metadata: dict[str, Any] = {}
        self._sequences: dict[int, _Interned] = defaultdict(_Interned)
        self._tracks: dict[int, _Track] = {}
        self._events: dict[int, list[_TrackEventRecord]] = defaultdict(list)
        self._counters: list[tuple[int, list[tuple[int, float]]]] = []  # (ts, [(track uuid, value)]) per packet
        self._named: dict[tuple[str, int, int], tuple[str, int]] = {}  # M events written, by (kind, pid, tid)
        self.unmatched_ends = 0
        self.unterminated_slices = 0
        self.unreadable_flow_records = 0

    def _read(self) -> bytes:
        try:
            data = self.path.read_bytes()
        except OSError as e:
            raise PftraceFormatError(f"{self.path}: cannot read the trace ({e.strerror})") from None
        if data[:2] == b"\x1f\x8b":
            try:
                data = gzip.decompress(data)
            except (OSError, EOFError) as e:
                raise PftraceFormatError(f"{self.path}: cannot read the trace ({e})") from None
        if not data.startswith(b"\n"):  # Trace.packet (field 1, length-delimited) comes first
            raise PftraceFormatError(f"{self.path}: not a Perfetto protobuf trace (it does not start with a packet)")
        return data

    def events(self) -> Iterator[dict[str, Any]]:
        for position, data in enumerate(_packets(self._read(), self.path)):
            yield from self._packet(position, data)
        yield from self._counter_events()
        yield from self._slice_events()

    # --- packets --------------------------------------------------------------------------------
    def _packet(self, position: int, data: bytes) -> Iterator[dict[str, Any]]:
        try:
            pkt = TracePacket.FromString(data)
        except DecodeError:
            raise PftraceFormatError(f"{self.path}: packet {position} is not a valid TracePacket") from None
        seq_id = pkt.trusted_packet_sequence_id
        if pkt.sequence_flags & TracePacket.SEQ_INCREMENTAL_STATE_CLEARED or pkt.incremental_state_cleared:
            self._sequences[seq_id] = _Interned()
        if pkt.HasField("interned_data"):
            self._intern(self._sequences[seq_id], pkt)
        which = pkt.WhichOneof("data")
        if which == "track_descriptor":
            yield from self._descriptor(pkt)
        elif which == "track_event":
            self._track_event(position, pkt, self._sequences[seq_id])
        elif which == "chrome_events":
            for entry in pkt.chrome_events.metadata:
                self.metadata[entry.name] = self._metadata_value(entry)

    @staticmethod
    def _intern(table: _Interned, pkt: TracePacket) -> None:
        interned = pkt.interned_data
        for e in interned.event_names:
            table.names[e.iid] = e.name
        for c in interned.event_categories:
            table.cats[c.iid] = c.name
        for n in interned.debug_annotation_names:
            table.arg_names[n.iid] = n.name
        for s in interned.debug_annotation_string_values:
            table.strings[s.iid] = s.str.decode()

    @staticmethod
    def _metadata_value(entry: Any) -> Any:
        which = entry.WhichOneof("value")
        if which == "json_value":
            return orjson.loads(entry.json_value)
        return getattr(entry, which) if which else None

    def _descriptor(self, pkt: TracePacket) -> Iterator[dict[str, Any]]:
        desc = pkt.track_descriptor
        track = self._tracks.get(desc.uuid) or _Track(desc.uuid)
        self._tracks[desc.uuid] = track
        track.parent = desc.parent_uuid
        if desc.HasField("name"):
            track.name = desc.name
        if desc.HasField("counter"):
            track.counter = True
        if desc.HasField("thread"):
            t = desc.thread
            track.pid, track.tid = t.pid, t.tid
            if t.HasField("thread_name"):
                yield from self._name_events("thread", t.pid, t.tid, t.thread_name, t.legacy_sort_index)
        elif desc.HasField("process"):
            p = desc.process
            track.pid, track.tid = p.pid, None
            if p.HasField("process_name"):
                yield from self._name_events("process", p.pid, 0, p.process_name, p.legacy_sort_index)

    def _name_events(self, kind: str, pid: int, tid: int, name: str, sort_index: int) -> Iterator[dict[str, Any]]:
        # A descriptor repeated unchanged (Perfetto writers re-emit them) names nothing new.
        if self._named.get((kind, pid, tid)) == (name, sort_index):
            return
        self._named[(kind, pid, tid)] = (name, sort_index)
        yield from (process_events(pid, name, sort_index) if kind == "process"
                    else thread_events(pid, tid, name, sort_index))

    def _track_event(self, position: int, pkt: TracePacket, interned: _Interned) -> None:
        ev = pkt.track_event
        kind = ev.type
        if kind == _COUNTER:
            values: list[tuple[int, float]] = []
            if ev.HasField("counter_value"):
                values.append((ev.track_uuid, ev.counter_value))
            elif ev.HasField("double_counter_value"):
                values.append((ev.track_uuid, ev.double_counter_value))
            values += zip(ev.extra_counter_track_uuids, ev.extra_counter_values)
            values += zip(ev.extra_double_counter_track_uuids, ev.extra_double_counter_values)
            self._counters.append((pkt.timestamp, values))
            return
        if kind not in (_BEGIN, _END, _INSTANT):
            return
        name_iid = ev.name_iid
        name = interned.names.get(name_iid, "") if name_iid else ev.name
        cats = [interned.cats.get(i, "") for i in ev.category_iids]
        if ev.categories:
            cats += ev.categories
        args: dict[str, Any] = {}
        if ev.debug_annotations:
            cache = interned.annotations
            for ann in ev.debug_annotations:
                encoded = ann.SerializeToString()
                hit = cache.get(encoded)
                if hit is None:
                    value = self._value(ann, interned)
                    shared = value is None or isinstance(value, (str, int, float))
                    hit = cache[encoded] = (self._arg_name(ann, interned), value if shared else kept_json(value),
                                            shared)
                args[hit[0]] = hit[1] if hit[2] else orjson.loads(hit[1])
        self._events[ev.track_uuid].append(_TrackEventRecord(
            pkt.timestamp, position, kind, name, cats[0] if len(cats) == 1 else ",".join(cats), args,
            # As the trace processor does: the fixed64 ids when present, else the varint ones.
            list(ev.flow_ids or ev.flow_ids_old), list(ev.terminating_flow_ids or ev.terminating_flow_ids_old)))

    @staticmethod
    def _arg_name(ann: DebugAnnotation, interned: _Interned) -> str:
        return interned.arg_names.get(ann.name_iid, "") if ann.HasField("name_iid") else ann.name

    def _value(self, ann: DebugAnnotation, interned: _Interned) -> Any:
        which = ann.WhichOneof("value")
        if which is None:
            if ann.dict_entries:
                return {self._arg_name(e, interned): self._value(e, interned) for e in ann.dict_entries}
            if ann.array_values:
                return [self._value(v, interned) for v in ann.array_values]
            return None
        if which == "string_value_iid":
            return interned.strings.get(ann.string_value_iid, "")
        if which == "nested_value":
            return self._nested(ann.nested_value)
        if which == "legacy_json_value":
            return orjson.loads(ann.legacy_json_value)
        return getattr(ann, which)

    def _nested(self, value: Any) -> Any:
        if value.nested_type == _NESTED.ARRAY:
            return [self._nested(v) for v in value.array_values]
        if value.nested_type == _NESTED.DICT:
            return {k: self._nested(v) for k, v in zip(value.dict_keys, value.dict_values)}
        for kind in ("bool_value", "int_value", "double_value", "string_value"):
            if value.HasField(kind):
                return getattr(value, kind)
        return None

    # --- resolution -------------------------------------------------------------------------------
    def _owner(self, uuid: int) -> tuple[int, int]:
        """(pid, tid) of the track: its own thread/process descriptor or its nearest ancestor's."""
        seen = 0
        track = self._tracks.get(uuid)
        while track is not None and seen < 32:
            if track.pid is not None:
                return track.pid, track.tid or 0
            track = self._tracks.get(track.parent)
            seen += 1
        return 0, 0

    def _counter_key(self, uuid: int) -> tuple[int, str, str, int]:
        """(pid, event name, key, group uuid) of a counter track: a track under a named group
        track is the key named by the rest of its name; any other is its own event's "value"."""
        track = self._tracks.get(uuid)
        name = (track.name if track else None) or ""
        group = self._tracks.get(track.parent) if track else None
        if group is not None and group.name and not group.counter and group.pid is None \
                and name.startswith(group.name + " "):
            return self._owner(uuid)[0], group.name, name[len(group.name) + 1:], group.uuid
        return self._owner(uuid)[0], name, "value", uuid

    def _counter_events(self) -> Iterator[dict[str, Any]]:
        # Values of one group at one timestamp, one after the other, are one JSON "C" event; a
        # key seen again starts the next event.
        current: tuple[int, int, int, str] | None = None  # (group, ts, pid, event name)
        values: dict[str, Any] = {}
        for ts, packet_values in self._counters:
            for uuid, value in packet_values:
                pid, event_name, key, group = self._counter_key(uuid)
                if current != (group, ts, pid, event_name) or key in values:
                    if current is not None:
                        yield counter_event(current[2], current[3], current[1], values)
                    current, values = (group, ts, pid, event_name), {}
                values[key] = value
        if current is not None:
            yield counter_event(current[2], current[3], current[1], values)

    def _slice_events(self) -> Iterator[dict[str, Any]]:
        for uuid, records in self._events.items():
            pid, tid = self._owner(uuid)
            records.sort(key=lambda r: (r.ts, r.position))
            stack: list[_TrackEventRecord] = []
            for r in records:
                if r.kind == _BEGIN:
                    stack.append(r)
                    continue
                if r.kind == _INSTANT:
                    yield instant_event(pid, tid, r.name, r.ts, r.cat, r.args or None)
                    continue
                if not stack:
                    self.unmatched_ends += 1
                    continue
                begin = stack.pop()
                args = {**begin.args, **r.args}
                # Flows and args of a slice may be on its begin or on its end.
                flow_out = next((f for f in begin.flow_ids + r.flow_ids if not f & COLLECTIVE_FLOW_BIT), None)
                flow_in = next((f for f in begin.terminating_flow_ids + r.terminating_flow_ids
                                if not f & COLLECTIVE_FLOW_BIT), None)
                yield slice_event(pid, tid, begin.name, begin.ts, r.ts - begin.ts, begin.cat, args or None,
                                  flow_out, flow_in)
            self.unterminated_slices += len(stack)
        # Collective arrows: their JSON events, as the writer recorded them next to the flow ids
        # it put on the slices they link.
        flow_records = self._sequences[FLOW_RECORD_SEQUENCE_ID].names if FLOW_RECORD_SEQUENCE_ID in self._sequences \
            else {}
        for fid, text in flow_records.items():
            try:
                record = orjson.loads(text)
                src: tuple[int, int, int] = tuple(record["src"])  # type: ignore[assignment]
                dst: tuple[int, int, int] = tuple(record["dst"])  # type: ignore[assignment]
                yield from flow_events(fid & ~COLLECTIVE_FLOW_BIT, str(record["name"]), src, dst)
            except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
                self.unreadable_flow_records += 1
