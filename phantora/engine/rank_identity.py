"""Which process is which rank: ranks join, and a process whose rank was only a guess learns it.

A process knows its rank for certain from torch's launch environment (RANK, or Lightning-style
NODE_RANK / LOCAL_RANK); one that has neither (mp.spawn children, a script that passes the rank
to init_process_group) guesses and says so (RankInfo.certain False). Guesses may collide: the
second guesser joins under a provisional id (< 0) until init_process_group names its rank
(C_IDENTIFY), and a certain claimant displaces a guessing holder the same way. `moved` tells the
server which processes moved, so it can follow them.

A rank's trace pid is fixed when it joins (rank + 1 when free), so its slices stay in one trace
process however often it is re-keyed; its process is named once its rank is certain.
"""

from __future__ import annotations

from phantora.engine.collective_lifecycle import CollectiveLifecycle
from phantora.engine.host_waits import HostWaits
from phantora.engine.ranks import CallError, RankInfo, RankState
from phantora.engine.timeline import RankTimeline, TimingConfig
from phantora.engine.trace_events import PROVISIONAL_PID_BASE, TraceEvents


class RankIdentities:
    def __init__(self, ranks: dict[int, RankState], timing: TimingConfig, trace: TraceEvents,
                 collectives: CollectiveLifecycle, waits: HostWaits, gpu_name: str, gpus_per_node: int) -> None:
        self.ranks = ranks  # shared with the engine's other components: re-keyed in place
        self.timing = timing
        self.trace = trace
        self.collectives = collectives
        self.waits = waits
        self.gpu_name = gpu_name
        self.gpus_per_node = gpus_per_node
        self.moved: dict[int, int] = {}  # rank -> provisional id it was moved to (the server follows, then clears)
        self._trace_pids: set[int] = set()
        self._provisionals = 0

    def add(self, info: RankInfo) -> RankState:
        """A process joins as `info.rank`. A process whose rank is only a guess (info.certain
        False) and finds it taken joins under a provisional id (< 0) until init_process_group
        names its rank (identify); a certain claimant displaces a guessing holder so."""
        holder = self.ranks.get(info.rank)
        if holder is not None:
            if info.certain and holder.info.certain:
                raise CallError(_claim_error(info.rank, holder.info.pid, info.pid))
            if not info.certain:
                info.rank = self._provisional_id()
            else:
                self.moved[holder.info.rank] = self._move(holder, self._provisional_id())
        free = info.rank >= 0 and info.rank + 1 not in self._trace_pids
        info.trace_pid = info.rank + 1 if free else PROVISIONAL_PID_BASE + len(self._trace_pids)
        self._trace_pids.add(info.trace_pid)
        state = RankState(info, RankTimeline(info.rank, self.timing))
        self.ranks[info.rank] = state
        if info.certain:
            self._name(state)  # the process, and its host track
        else:
            self.trace.host_track(info)  # named when identify or settle makes it certain
        return state

    def identify(self, rank: int, new: int, node: int, local_rank: int) -> None:
        """The process known as `rank` called init_process_group as `new`: what torch uses from
        now on. A process that only guessed `new` moves to a provisional id (`moved` says where);
        one that is certain of it is an error."""
        st = self.ranks[rank]
        if new != rank:
            holder = self.ranks.get(new)
            if holder is not None:
                if holder.info.certain:
                    raise CallError(_claim_error(new, holder.info.pid, st.info.pid))
                self.moved[new] = self._move(holder, self._provisional_id())
            self._move(st, new)
        st.info.node, st.info.local_rank, st.info.certain = node, local_rank, True
        self._name(st)

    def settle(self, st: RankState) -> None:
        """The process ended without calling init_process_group: its guess stands."""
        if not st.info.certain:
            st.info.certain = True
            self._name(st)

    def _provisional_id(self) -> int:
        self._provisionals += 1
        return -self._provisionals

    def _move(self, st: RankState, new: int) -> int:
        """Re-key a rank that has not called any collective yet (its trace pid stays)."""
        old = st.info.rank
        if st.collectives or any(r == old for (_, r) in self.collectives.arrivals):
            raise CallError(f"rank {old} already called collectives under that rank; it cannot become rank {new}")
        del self.ranks[old]
        st.info.rank = st.timeline.rank = new
        self.ranks[new] = st
        self.waits.rekey(old, new)
        return new

    def _name(self, st: RankState) -> None:
        self.trace.rank(st.info, self.gpu_name, self.gpus_per_node, list(st.timeline.streams.values()))


def _claim_error(rank: int, pid_a: int, pid_b: int) -> str:
    return (f"two processes claim rank {rank} (pids {pid_a} and {pid_b}); each rank process must have a "
            "distinct rank: RANK as torchrun sets it, or the rank passed to init_process_group")
