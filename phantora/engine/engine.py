"""The simulator's engine: applies the record stream of every rank to its timelines, asks the
cost model for kernel times, answers calls, and writes everything to a trace sink.

How records flow (a -> b: a calls b and imports it; no module imports one above it):

    Engine.apply, join_collective, the queries
      -> host_records           a record's host time; its GPU work, host waits, collective calls
      -> host_waits             synchronize, blocking copies, event queries: the time waited for
      -> placement              GPU work on stream timelines, once the times it needs are known
      -> collective_lifecycle   a placed arrival completes its collective: submitted; ends read
      -> phantora.net           flows on links: provisional ends, rollbacks
    finality (Engine.progress, after each message) sits above them: it proves ends final,
    then re-drives placement and host_waits. Beside the chain: rank_identity (which process is
    which rank) asks collective_lifecycle and host_waits; collective_lifecycle drives mirrors
    (--ranks). The stages write their events to trace_events, the sink at the end of the flow,
    given to each by the Engine (it imports only data: ranks, routing_log, collectives,
    deferred, timeline); the types a RankState holds live in those data modules too.

Calls back up the chain go through a port the Engine wires in, not an import: a collective call
joins in collective_lifecycle (its work id is known at once), which queues its arrival on
placement like any GPU work, and an end a host must read early places its members' arrivals
first (collective_lifecycle.ArrivalQueue; placement implements it).

Records arrive per rank in program order (phantora/protocol.py); `Engine.apply` hands each to
the module that handles it (the list is in Engine's docstring). A rank's records only touch
that rank's timeline, so ranks can be fed in any interleaving.

Collectives do not block the rank that issues them, as NCCL's do not: a rank joins, gets its
work id at once, and runs ahead. GPU work is placed lazily (phantora/engine/deferred.py): work
that depends on a collective's end (a stream that waits on it, the next collective on its
communication stream, a kernel the NCCL kernel may slow) waits on its stream until the end is
read. An end is read when it is final: no collective submitted later can start before it,
because every rank's clock is past it or provably waits for something later
(finality.py). Ranks behind in simulated time therefore still move it, and what depends on
it is placed at the corrected end.

Only a host that must wait (a synchronize, a blocking copy, .item(), an event query) needs an end
before it is final. `sync="optimistic"` reads it then; a later correction to it is a stale
reply: counted, and shown on the simulator track. `sync="conservative"` holds the rank until the
end is final instead, so no reply is ever stale; a rank held for longer than `stall_s` of
wall time without progress is answered optimistically, with a warning, rather than hang.
"""

from __future__ import annotations

import sys
from typing import Any, Callable

from phantora import protocol as P
from phantora.cost import Estimator
from phantora.engine.collective_lifecycle import CollectiveLifecycle
from phantora.engine.collectives import CollectiveMatcher
from phantora.engine.finality import Finality
from phantora.engine.host_records import PYTHON_SLICE_NS, HostRecords
from phantora.engine.host_waits import NOT_YET, HostWaits, NotYet, host_waits_for_copy
from phantora.engine.mirrors import Mirrors, RolesRefuted
from phantora.engine.placement import Placement
from phantora.engine.rank_identity import RankIdentities
from phantora.engine.ranks import CallError, DeferredJoinError, DeviceMemory, RankInfo, RankState, WaitTarget
from phantora.engine.summary import EngineSummary, simulated_end_ns, summarize
from phantora.engine.timeline import TimingConfig
from phantora.engine.trace_events import (HOST_TRACK, NETWORK_PID, SIMULATOR_PID, STEP_TRACK, TraceEvents,
                                          nccl_kernel_name)
from phantora.hardware import GPUSpec
from phantora.net.network import Network
from phantora.roles import RankRoles
from phantora.trace import TraceSink

# Names other modules and tests import from here.
__all__ = ["CallError", "DeferredJoinError", "DeviceMemory", "Engine", "EngineSummary", "HOST_TRACK", "NETWORK_PID",
           "NOT_YET", "NotYet", "RankInfo", "RankState", "SIMULATOR_PID", "STEP_TRACK", "SYNC_MODES",
           "host_waits_for_copy", "nccl_kernel_name"]

SYNC_MODES = ("optimistic", "conservative")


class Engine:
    """The facade the server (phantora/simulator/server.py) calls: records and calls of each
    rank in, answers out. The work is done by one component per responsibility:

      host_records.py          records that launch GPU work or only cost host time
      placement.py             placing GPU work on stream timelines, lazily
      rank_identity.py         which process is which rank (guessed ranks, init_process_group)
      host_waits.py            synchronize, blocking copies, .item(), event/stream queries
      collective_lifecycle.py  join, submit to the network, read the end, failures
      mirrors.py               mirrored ranks (--ranks), which follow their representative's collectives
      finality.py              proving ends final (progress)
      trace_events.py          what is written to the trace sink
      summary.py               EngineSummary

    Below them, the data they share: ranks.py (RankState and the types it holds), deferred.py,
    timeline.py, graphs.py, collectives.py (matching), routing_log.py, data_loading.py; and
    startup.py, the one-off start-up costs host_records and collective_lifecycle charge.
    """

    def __init__(
        self,
        gpu: GPUSpec,
        estimator: Estimator,
        sink: TraceSink,
        timing: TimingConfig | None = None,
        warn: Callable[[str], None] | None = None,
        network: Network | None = None,
        sync: str = "optimistic",
    ) -> None:
        if sync not in SYNC_MODES:
            raise ValueError(f"sync: {sync!r} is not one of {', '.join(SYNC_MODES)}")
        self.gpu = gpu
        self.estimator = estimator
        self.sink = sink
        self.timing = timing or TimingConfig()
        self.network = network
        self.sync = sync
        self.ranks: dict[int, RankState] = {}
        self.warnings: list[str] = []
        self._warn = warn or (lambda msg: print(f"phantora: warning: {msg}", file=sys.stderr, flush=True))
        self.trace = TraceEvents(sink)
        self.placement = Placement(self.timing, self.trace)
        self.collectives = CollectiveLifecycle(self.ranks, network, self.trace, self.placement)
        self.placement.collectives = self.collectives  # they call each other (module docstring)
        self.waits = HostWaits(self.ranks, self.timing, self.trace, self.placement, self.collectives, sync)
        self.finality = Finality(self.ranks, self.timing, self.placement, self.collectives, self.waits, sync)
        self.host = HostRecords(self.timing, estimator, self.trace, self.placement, self.waits, self._warn)
        self.identities = RankIdentities(self.ranks, self.timing, self.trace, self.collectives, self.waits,
                                         gpu.aliases[0].upper(), self.collectives.gpus_per_node)

    # --- state the server and tests read ------------------------------------------------------
    @property
    def matcher(self) -> CollectiveMatcher:
        return self.collectives.matcher

    @property
    def expected_ranks(self) -> int:
        """WORLD_SIZE the ranks announced (the server sets it): nothing is final before all joined."""
        return self.finality.expected_ranks

    @expected_ranks.setter
    def expected_ranks(self, n: int) -> None:
        self.finality.expected_ranks = n

    @property
    def final_ns(self) -> int:
        return self.collectives.final_ns

    @property
    def work_end_ns(self) -> dict[int, int]:
        return self.collectives.work_end_ns

    @property
    def unresolved_works(self) -> set[int]:
        return self.collectives.unresolved_works

    @property
    def stale_replies(self) -> int:
        return self.collectives.stale_replies

    @property
    def largest_stale_error_ns(self) -> int:
        return self.collectives.largest_stale_error_ns

    @property
    def early_reads(self) -> int:
        return self.collectives.early_reads

    @property
    def comm_busy_ns(self) -> int:
        return self.collectives.comm_busy_ns

    @property
    def moved(self) -> dict[int, int]:
        """rank -> provisional id a guessing process was moved to (the server follows, then clears)."""
        return self.identities.moved

    # --- ranks --------------------------------------------------------------------------------
    def add_rank(self, info: RankInfo) -> RankState:
        """A process joins as `info.rank`; one that only guessed a rank another holds joins under a
        provisional id (< 0) until identify_rank (rank_identity.py)."""
        return self.identities.add(info)

    def identify_rank(self, rank: int, new: int, node: int, local_rank: int, world_size: int) -> None:
        """The process known as `rank` called init_process_group as `new` of `world_size`."""
        self.identities.identify(rank, new, node, local_rank)
        self.expected_ranks = max(self.expected_ranks, self.processes_in(world_size))

    # --- mirrored ranks (mirrors.py) ----------------------------------------------------------
    @property
    def mirrors(self) -> Mirrors | None:
        return self.collectives.mirrors

    def mirror_ranks(self, roles: RankRoles, nproc_per_node: int) -> None:
        """Only `roles.representatives` run as processes; the other ranks are mirrored."""
        if roles.mirrored:
            self.collectives.mirrors = Mirrors(roles, nproc_per_node, self.trace, self.gpu.aliases[0].upper())
            self.expected_ranks = len(roles.processes)

    def processes_in(self, world_size: int) -> int:
        """How many rank processes a world of `world_size` ranks has."""
        m = self.mirrors
        return world_size if m is None or m.roles.world_size != world_size else len(m.roles.processes)

    def global_gpu(self, rank: int) -> int:
        return self.collectives.global_gpu(rank)

    # --- records ------------------------------------------------------------------------------
    def apply(self, rank: int, records: list[list[Any]]) -> int:
        """Apply records in order; the number applied. Fewer than all: the rank's host waits for
        a time not known yet (retry the rest after take_unblocked names the rank)."""
        st = self.ranks[rank]
        if st.blocked is not None and not self.waits.resume(st):
            return 0
        host, waits, placement = self.host, self.waits, self.placement
        for i, rec in enumerate(records):
            kind = rec[0]
            if kind == P.R_OP:
                host.op(st, rec[1], rec[2], rec[3], rec[4] if len(rec) > 4 else 0)
            elif kind == P.R_PYTHON:
                host.python(st, int(rec[1]), slice_min_ns=PYTHON_SLICE_NS)
            elif kind == P.R_HOST_SPEED:
                st.timeline.host_speed_probe(float(rec[1]))
            elif kind == P.R_LOADER_START:
                host.loader_start(st, int(rec[1]), int(rec[2]), int(rec[3]))
            elif kind == P.R_LOADER_BATCH:
                host.loader_batch(st, int(rec[1]), int(rec[2]), int(rec[3]))
            elif kind == P.R_PIN_BATCH:
                host.pin_batch(st, int(rec[1]), int(rec[2]), int(rec[3]))
            elif kind == P.R_SIG:
                host.define_sig(st, rec[1], rec[2])
            elif kind == P.R_MEM:
                host.memory(st, rec[1], rec[2], rec[3])
            elif kind == P.R_EVENT_RECORD:
                host.event_record(st, rec[1], rec[2], rec[3])
            elif kind == P.R_EVENT_WAIT:
                host.event_wait(st, rec[1], rec[2], rec[3])
            elif kind == P.R_SYNC_DEVICE:
                waits.wait(st, "cudaDeviceSynchronize", WaitTarget("device", device=rec[1]))
            elif kind == P.R_SYNC_STREAM:
                waits.wait(st, "cudaStreamSynchronize", WaitTarget("stream", stream=placement.stream(st, rec[1], rec[2])))
            elif kind == P.R_SYNC_EVENT:
                waits.wait(st, "cudaEventSynchronize", WaitTarget("event", action=st.event_src.get(rec[1])))
            elif kind == P.R_NVTX_PUSH:
                host.nvtx_push(st, str(rec[1]))
            elif kind == P.R_NVTX_POP:
                host.nvtx_pop(st)
            elif kind == P.R_SLEEP:
                st.timeline.advance_host(int(rec[1]))
            elif kind == P.R_STEP:
                begin = st.step_end_ns
                host.step(st)
                if self.mirrors is not None:
                    self.mirrors.step(rank, st.steps - 1, begin, st.step_end_ns)
                    self.mirrors.witness.step(rank, st.ops, self._warn_once)
            elif kind == P.R_GROUP:
                if self.mirrors is not None:
                    self.mirrors.groups.add(str(rec[1]), tuple(int(r) for r in rec[2]), str(rec[3]) if len(rec) > 3 else "")
            elif kind == P.R_HOST:
                host.host_event(st, str(rec[1]), int(rec[2]))
            elif kind == P.R_WORK_WAIT:
                work = int(rec[1])
                if work >= P.JOIN_HANDLE_BASE:  # 0 (nothing to wait for) if its join failed
                    work = st.join_handles.get(work, 0)
                waits.work_wait(st, work, int(rec[2]), int(rec[3]), bool(rec[4]))
            elif kind == P.R_JOIN:
                st.join_handles[int(rec[1])] = self.join_deferred(st, rec[2])
            elif kind == P.R_STREAM:
                placement.stream(st, rec[1], rec[2])
            elif kind == P.R_ROUTING:
                host.routing(st, rec)
            elif kind == P.R_WARN:
                self._warn_once(str(rec[1]))
            elif P.R_GRAPH_BEGIN <= kind <= P.R_GRAPH_RESET:
                host.graph(st, rec)
            elif kind == P.R_OOM:
                host.oom(st, rec[1], rec[2], rec[3])
            else:
                raise CallError(f"unknown record kind {kind!r} from rank {rank}")
            if st.blocked is not None:
                return i + 1
        return len(records)

    # --- finality and held ranks --------------------------------------------------------------
    def progress(self) -> None:
        """Prove more ends final, read them, place the work that waited for them, and finish the
        host waits and calls that can finish now (take_unblocked names their ranks)."""
        self.finality.progress()
        if not self.finality.closing:
            self.collectives.read_final_mirrored()
            self.collectives.prune_network()

    def host_blocked(self, rank: int) -> bool:
        """Is `rank`'s host waiting for a time not known yet (its later records and calls wait)?"""
        st = self.ranks.get(rank)
        return st is not None and st.blocked is not None

    def blocked(self) -> bool:
        """Is some rank's host or call waiting for an end not known yet?"""
        return bool(self.waits.blocked_ranks())

    def force_blocked(self, waited_s: float) -> None:
        """No progress for `waited_s` of wall time while ranks wait (conservative sync can stall
        when ranks also synchronise outside the simulator, e.g. through the c10d store): answer
        them with the ends as they stand, as the optimistic mode does."""
        ranks = sorted(st.info.rank for st in self.waits.blocked_ranks())
        self._warn_once(f"--sync conservative: rank(s) {ranks} waited {waited_s:.0f} s of wall time for collective "
                        "ends that could not be proven final (ranks may also be waiting on each other outside "
                        "the simulator); they were answered with the ends as they stand, which may be stale")
        self.waits.resume_blocked(force=True)

    def take_unblocked(self) -> set[int]:
        """Ranks whose host wait finished, or whose held call can now be answered."""
        return self.waits.take_unblocked()

    def place_all(self) -> None:
        """Place all waiting work that can be, reading the ends it needs, final or not."""
        self.placement.place_waiting(self.ranks, force=True)

    def read_all_collectives(self) -> None:
        """Place all waiting work, reading every end (the run is over: nothing can arrive
        before them). Collectives some member never joined never run. Conservative sync reads
        each end once it is proven final; optimistic sync reads them as the placement needs
        them, in stream order, like a host that waits (a later submission that moves one is a
        correction, counted as a stale reply), but no host waited for them: they do not count
        as early reads."""
        self.collectives.drop_unjoined()
        self.finality.closing = True  # no rank calls anything any more; what they called still counts
        self.progress()
        early_reads = self.collectives.early_reads
        self.place_all()
        self.collectives.read_all()
        self.collectives.early_reads = early_reads

    # --- calls --------------------------------------------------------------------------------
    def now(self, rank: int) -> int:
        return self.ranks[rank].timeline.host_ns

    def elapsed_ms(self, rank: int, start_event: int, end_event: int) -> float | NotYet:
        return self.waits.elapsed_ms(self.ranks[rank], start_event, end_event)

    def query_event(self, rank: int, event_id: int) -> bool | NotYet:
        return self.waits.query_event(self.ranks[rank], event_id)

    def query_stream(self, rank: int, device: int, stream_id: int) -> bool | NotYet:
        return self.waits.query_stream(self.ranks[rank], device, stream_id)

    def join_collective(self, rank: int, wire: dict[str, Any]) -> int:
        """One rank calls a collective: its work id, at once. CollectiveMismatch once the
        members disagree (collective_lifecycle.py)."""
        return self.collectives.join(self.ranks[rank], wire)

    def join_deferred(self, st: RankState, wire: dict[str, Any]) -> int:
        """A collective the rank called while its host waited (R_JOIN): its process already
        has a handle, so an error reaches it at its next call (DeferredJoinError)."""
        try:
            return self.collectives.join(st, wire)
        except RolesRefuted:  # not the program's error: the launcher starts again (--ranks auto)
            raise
        except CallError as e:
            raise DeferredJoinError(str(e)) from None

    def collective_end_ns(self, work: int) -> int | None:
        """When collective `work` completes (reading it from the network, final or not); None
        while some member has not joined it, or for one that never ran."""
        end = self.collectives.end(work, force=True)
        return None if work in self.collectives.dropped else end

    def abandon_collectives(self, rank: int) -> list[tuple[list[int], str]]:
        """`rank` ended: every collective it never joined fails for the members waiting in it."""
        return self.collectives.abandon(rank)

    def overdue_collectives(self, timeout_s: float) -> list[tuple[list[int], str]]:
        return self.collectives.overdue(timeout_s)

    # --- end ----------------------------------------------------------------------------------
    def finish_rank(self, rank: int) -> None:
        st = self.ranks[rank]
        if st.finished:
            return
        st.finished = True
        self.identities.settle(st)
        self.host.close_nvtx(st)

    def summary(self) -> EngineSummary:
        self.read_all_collectives()
        c = self.collectives
        s = summarize(self.ranks, self.host.unknown_ops, self.warnings, self.host.kernels_by_estimator,
                      c.comm_busy_ns, c.rollbacks, c.stale_replies, c.largest_stale_error_ns, c.early_reads)
        if self.mirrors is not None:
            s.mirrored = len(self.mirrors.ranks)
            s.representatives = self.mirrors.roles.processes
            lagging = max(self.mirrors.ranks.values(), key=lambda m: m.lag_ns, default=None)
            if lagging is not None and lagging.lag_ns > 0:
                s.mirror_lag_ns, s.mirror_lag_rank = lagging.lag_ns, lagging.rank
        return s

    def give_up_collectives(self) -> int:
        """The simulator failed or the run was interrupted: collectives whose end was not read
        never ran (see CollectiveLifecycle.give_up); how many."""
        return self.collectives.give_up()

    def close(self, metadata: dict[str, Any]) -> None:
        try:
            self.read_all_collectives()
        except Exception as e:  # the trace must still close on every path
            self._warn(f"collectives not read from the network: {type(e).__name__}: {e}")
            self.give_up_collectives()
            try:  # what waited on them is placed as after a collective that never ran
                self.read_all_collectives()
            except Exception as e2:
                self._warn(f"work left unplaced: {type(e2).__name__}: {e2}")
        self.collectives.write_unrun_launches()  # collectives still waiting
        for r in list(self.ranks):
            self.finish_rank(r)
        try:
            self.collectives.write_link_counters(simulated_end_ns(self.ranks.values()))
        except Exception as e:  # the trace must still close on every path
            self._warn(f"link counters not written: {type(e).__name__}: {e}")
        self.trace.close(metadata)

    def warn(self, msg: str) -> None:
        """A warning for the summary (printed once)."""
        self._warn_once(msg)

    def _warn_once(self, msg: str) -> None:
        if msg not in self.warnings:
            self.warnings.append(msg)
            self._warn(msg)
