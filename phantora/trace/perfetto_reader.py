"""Read a Perfetto protobuf trace back as Chrome-JSON-shaped events.

`read_pftrace(path)` decodes the TrackEvent traces phantora writes (perfetto.py) into the event
dicts chrome.py writes for the same run (built by chrome.py's own functions): "M" process and
thread names and sort indices, "X" slices with their args and bind_id flows, "i" instants, "C"
counters, "s"/"f" collective flows, times in microseconds. `load_pftrace(path)` returns the
whole trace as `{"traceEvents": [...], "metadata": {...}}`, the shape of a loaded JSON trace.

It follows the trace processor's rules, so it reads any trace the way Perfetto would: interned
strings per packet sequence (reset on SEQ_INCREMENTAL_STATE_CLEARED), events sorted per track by
timestamp and then file position before begins and ends are paired, args from debug annotations
(nested dicts and arrays included) of the begin and the end, counter values of a packet's
`extra_*counter_values` taken with its main value. A counter track whose parent is a named
group track (perfetto.py writes one per JSON counter event name) reads back as one "C" event
named after the group with one key per track. Whole-trace memory: slices are paired once all
packets are read.
"""

from __future__ import annotations

import gzip
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from google.protobuf.message import DecodeError
from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import DebugAnnotation, TracePacket, TrackEvent

from phantora.trace.chrome import (counter_event, flow_events, instant_event, process_events, slice_event,
                                   thread_events)
from phantora.trace.perfetto import COLLECTIVE_FLOW_BIT, FLOW_NAME_SEQUENCE_ID


class PftraceFormatError(ValueError):
    """The file is not a (complete) Perfetto protobuf trace."""


_BEGIN, _END, _INSTANT, _COUNTER = (TrackEvent.TYPE_SLICE_BEGIN, TrackEvent.TYPE_SLICE_END,
                                    TrackEvent.TYPE_INSTANT, TrackEvent.TYPE_COUNTER)
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


def read_pftrace(path: str | Path) -> Iterator[dict[str, Any]]:
    """The events of a .pftrace as Chrome JSON event dicts (see the module docstring)."""
    yield from _Decoder(Path(path)).events()


def load_pftrace(path: str | Path) -> dict[str, Any]:
    """The whole trace: {"traceEvents": [...], "metadata": {...}, "displayTimeUnit": "ns"}."""
    decoder = _Decoder(Path(path))
    events = list(decoder.events())
    return {"traceEvents": events, "metadata": decoder.metadata, "displayTimeUnit": "ns"}


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
        self._counters: list[tuple[int, list[tuple[int, float]]]] = []  # (ts, [(track uuid, value)])
        self._named: dict[tuple[str, int, int], tuple[str, int]] = {}  # M events written, by (kind, pid, tid)
        self.unmatched_ends = 0
        self.unterminated_slices = 0

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
                    hit = cache[encoded] = (self._arg_name(ann, interned), value if shared else orjson.dumps(value),
                                            shared)
                args[hit[0]] = hit[1] if hit[2] else orjson.loads(hit[1])
        self._events[ev.track_uuid].append(_TrackEventRecord(
            pkt.timestamp, position, kind, name, cats[0] if len(cats) == 1 else ",".join(cats), args,
            list(ev.flow_ids) if ev.flow_ids else [],
            list(ev.terminating_flow_ids) if ev.terminating_flow_ids else []))

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

    def _counter_events(self) -> Iterator[dict[str, Any]]:
        for ts, values in self._counters:
            by_event: dict[tuple[int, str], dict[str, Any]] = {}
            for uuid, value in values:
                track = self._tracks.get(uuid)
                name = (track.name if track else None) or ""
                group = self._tracks.get(track.parent) if track else None
                if group is not None and group.name is not None and not group.counter and group.pid is None \
                        and name.startswith(group.name + " "):
                    event_name, key = group.name, name[len(group.name) + 1:]
                else:
                    event_name, key = name, "value"
                pid = self._owner(uuid)[0]
                by_event.setdefault((pid, event_name), {})[key] = value
            for (pid, event_name), args in by_event.items():
                yield counter_event(pid, event_name, ts, args)

    def _slice_events(self) -> Iterator[dict[str, Any]]:
        flow_names = self._sequences[FLOW_NAME_SEQUENCE_ID].names if FLOW_NAME_SEQUENCE_ID in self._sequences else {}
        sources: dict[int, tuple[int, int, int]] = {}
        targets: dict[int, tuple[int, int, int]] = {}
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
                    self._note_flows(r, (pid, tid, r.ts), sources, targets)
                    continue
                if not stack:
                    self.unmatched_ends += 1
                    continue
                begin = stack.pop()
                args = {**begin.args, **r.args}
                place = (pid, tid, begin.ts)
                flow_out = next((f for f in begin.flow_ids if not f & COLLECTIVE_FLOW_BIT), None)
                flow_in = next((f for f in begin.terminating_flow_ids if not f & COLLECTIVE_FLOW_BIT), None)
                self._note_flows(begin, place, sources, targets)
                yield slice_event(pid, tid, begin.name, begin.ts, r.ts - begin.ts, begin.cat, args or None,
                                  flow_out, flow_in)
            self.unterminated_slices += len(stack)
        for fid, src in sources.items():
            dst = targets.get(fid)
            if dst is not None:
                yield from flow_events(fid & ~COLLECTIVE_FLOW_BIT, flow_names.get(fid, ""), src, dst)

    @staticmethod
    def _note_flows(r: _TrackEventRecord, place: tuple[int, int, int], sources: dict[int, tuple[int, int, int]],
                    targets: dict[int, tuple[int, int, int]]) -> None:
        for f in r.flow_ids:
            if f & COLLECTIVE_FLOW_BIT:
                sources[f] = place
        for f in r.terminating_flow_ids:
            if f & COLLECTIVE_FLOW_BIT:
                targets[f] = place
