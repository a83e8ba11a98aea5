"""The simulator's socket server: one thread, one selector, every rank process's connection.

Rank processes connect to a Unix domain socket inside a private (0700) temporary directory;
nothing listens on the network. Each message carries a batch of records and at most one call
(phantora/protocol.py). Everything runs on the thread that calls `serve`, so the engine needs
no locks.

A rank whose host waits for a time the engine cannot know yet (Engine.apply: a collective some
member has not joined; with --sync conservative, an end not proven final) is held: its later
messages queue in `held` and its calls wait for their replies, until the engine can go on. The
rank's process itself only stops at its next call. Held ranks that see no progress for
`stall_s` of wall time are answered with the ends as they stand (Engine.force_blocked).
"""

from __future__ import annotations

import contextlib
import gc
import os
import selectors
import socket
import sys
import tempfile
import threading
import time
import traceback
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

from phantora import protocol as P
from phantora.engine.collectives import CollectiveMismatch
from phantora.engine.engine import NOT_YET, CallError, DeferredJoinError, Engine, RankInfo
from phantora.engine.mirrors import RolesRefuted
from phantora.simulator.failure import SimulatorFailure
from phantora.simulator.progress import REFRESH_S, Progress, RunStatus

FLUSH_S = 1.0  # the trace reaches the disk at least this often (a killed run leaves a readable prefix)

_HELD = object()  # a call that cannot be answered until a collective completes
_PARKED = object()  # the store host's goodbye, answered once the other rank processes are done

# The simulator allocates flows, events and records by the million and keeps many of them for the
# run. Under CPython's default thresholds (700, 10, 10) its collector ran 50,832 young and 204 full
# collections in one step of DeepSeek-V3 671B at 128 GPUs (EP 64, --ranks auto). Young cyclic
# garbage still goes (1.7-1.8 M objects collected either way); full collections come 100x rarer.
SERVE_GC_THRESHOLD = (100_000, 10, 10)


@contextlib.contextmanager
def fewer_collections(threshold: tuple[int, int, int] = SERVE_GC_THRESHOLD) -> Iterator[None]:
    """The cyclic collector's thresholds raised while the simulator serves, then restored."""
    before = gc.get_threshold()
    gc.set_threshold(*threshold)
    try:
        yield
    finally:
        gc.set_threshold(*before)


# While one message keeps the simulator busy longer than this, the ranks get a keepalive this often
# (protocol.KEEPALIVE), as long as the network progresses: a rollback that re-simulates seconds of a
# 64-GPU pipeline took over 10 minutes, and every rank failed at its 600 s call timeout.
KEEPALIVE_S = 30.0


@dataclass
class Connection:
    sock: socket.socket
    buffer: P.MessageBuffer = field(default_factory=P.MessageBuffer)
    rank: int | None = None
    pid: int | None = None
    said_bye: bool = False


class SimulatorServer:
    def __init__(self, engine: Engine, hello_reply: dict[str, Any] | None = None,
                 collective_timeout_s: float = 300.0, stall_s: float = 30.0,
                 keepalive_s: float = KEEPALIVE_S) -> None:
        self.engine = engine
        # sends come from the serving thread and the keepalive thread; _busy_since: when the
        # serving thread started on the messages it is handling (None between them)
        self._send_lock = threading.Lock()
        self._busy_since: float | None = None
        self._keepalive_stop = threading.Event()
        self._keepalive = threading.Thread(target=self._keep_alive, args=(keepalive_s,),
                                           name="phantora-keepalive", daemon=True)
        self._keepalive.start()
        self.collective_timeout_s = collective_timeout_s
        self.stall_s = stall_s
        self._last_message = time.monotonic()
        self.held: dict[int, deque[tuple[Connection, list[Any], Any]]] = {}  # rank -> (conn, records, call) held
        self.failed: dict[int, str] = {}  # rank -> collective failure, the answer to its next call
        self.rank_errors: list[str] = []  # collective failures (mismatch, missing rank), shown in the summary
        self._next_overdue_check = 0.0
        # Collective waits are timed in the wall time the server spends waiting for the ranks
        # (select), not in the time it spends simulating: when the simulator is the bottleneck,
        # a member late to a collective is waiting for its answers, not missing.
        self.waited_s = 0.0
        engine.matcher.clock = lambda: self.waited_s
        self._heard: dict[int, float] = {}  # rank process -> waited_s when it last sent anything
        engine.matcher.heard = self._heard_from
        self.hello_reply = hello_reply or {}
        self.tmpdir = Path(tempfile.mkdtemp(prefix="phantora-"))
        os.chmod(self.tmpdir, 0o700)
        self.socket_path = str(self.tmpdir / "sim.sock")
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(self.socket_path)
        self._listener.listen(256)
        self._listener.setblocking(False)
        self._sel = selectors.DefaultSelector()
        self._sel.register(self._listener, selectors.EVENT_READ, None)
        self.connections: list[Connection] = []
        self.internal_errors: list[str] = []
        self.ranks_seen: set[int] = set()
        self.failure: SimulatorFailure | None = None  # the simulator's own failure, which ends the run
        # --ranks auto: a refuted choice of representatives ends the run unanswered (the launcher
        # stops the ranks and starts again with the representatives it names) when this is set
        self.restart_when_refuted = False
        self.refuted: RolesRefuted | None = None
        # Collectives a rank left waiting when it ended are failed after this delay, so that a
        # launcher that stops every rank when one fails (torchrun, launch.py) stops the waiting
        # ranks first: they are victims, and must not each print a traceback of the consequence.
        self.abandon_grace_s = 0.0
        self._deferred: list[tuple[float, int]] = []  # (when, rank that ended) abandonments to apply
        self.stopping = False  # the launcher is stopping every rank: waits left open are moot
        self.progress: Progress | None = None  # set by the launcher: status line, periodic lines, notices
        self.ranks_expected = 0  # rank processes the launcher started (0: unknown)
        self._started = time.monotonic()
        self._next_tick = 0.0
        self._next_flush = 0.0
        self._last_seen: dict[int, float] = {}  # rank -> when it last sent anything
        self._join_handles = 0  # collectives answered before they joined (_answer_join)
        # The goodbye (connection, call id) of the process that hosts the program's c10d store
        # (rank 0 where no agent holds it: workers phantora starts itself, env:// by hand). It is
        # answered once every other rank process is done, as torchrun's agent keeps its store
        # until the workers exit: ranks run at their own wall speed here, and one still using the
        # store (phantora carries values through it) failed with "Broken pipe" when rank 0 left.
        # A host leaving on an uncaught exception is not held: its failure stops the others.
        self._store_host: tuple[Connection, int] | None = None

    def _heard_from(self, rank: int) -> float:
        """When `rank` last sent anything (waited_s): a mirrored rank through its representative."""
        mirrors = self.engine.mirrors
        if mirrors is not None and rank in mirrors:
            rank = mirrors.ranks[rank].representative
        return self._heard.get(rank, float("-inf"))

    # --- loop ---------------------------------------------------------------------------------
    def serve(self, keep_going: Callable[[], bool], poll_s: float = 0.05) -> None:
        """Serve until keep_going() is false, then drain what connected processes already sent."""
        with fewer_collections():
            while self.failure is None and self.refuted is None and keep_going():
                self._guarded_poll(poll_s)
            if self.refuted is not None:
                return
            deadline = time.monotonic() + 2.0
            while self.failure is None and self.open_connections() and time.monotonic() < deadline:
                if not self._guarded_poll(0.05):
                    break

    # --- the simulator's own failures -----------------------------------------------------------
    def _guarded_poll(self, timeout: float) -> bool:
        try:
            return self._poll(timeout)
        except Exception as e:  # a bug in the simulator: end the run (launch.py stops the ranks)
            self._simulator_failed(e, "serving the ranks")
            return False

    def _simulator_failed(self, exc: Exception, during: str) -> None:
        """Remember the first failure; serve() stops at once. Ranks get no answer: they are
        stopped by the launcher, so no rank prints a traceback of a consequence."""
        if self.failure is None:
            self.failure = SimulatorFailure.from_exception(exc, during)

    def open_connections(self) -> int:
        return sum(1 for c in self.connections if c.sock.fileno() >= 0)

    def _poll(self, timeout: float) -> bool:
        before = time.monotonic()
        events = self._sel.select(timeout)
        self.waited_s += time.monotonic() - before
        self._busy_since = time.monotonic()
        try:
            for key, _ in events:
                if key.data is None:
                    self._accept()
                else:
                    self._read(key.data)
        finally:
            self._busy_since = None
        now = time.monotonic()
        if events:
            self._last_message = now
        if now >= self._next_tick:
            self._next_tick = now + REFRESH_S
            self._tick(now)
        if self._deferred:
            self._fail_deferred(now)
        if self.engine.matcher.pending and now > self._next_overdue_check:
            self._next_overdue_check = now + 1.0
            self._fail_collectives(self.engine.overdue_collectives(self.collective_timeout_s))
        if (self.engine.sync == "conservative" and self.held and now - self._last_message > self.stall_s
                and self.engine.blocked()):
            self.engine.force_blocked(now - self._last_message)
            self._last_message = now
            self._resume_unblocked()
        return bool(events)

    def _fail_collectives(self, failures: list[tuple[list[int], str]]) -> None:
        for i, (ranks, message) in enumerate(failures):
            self.rank_errors.append(message)
            if i == 0:  # one line per cause; the rest are counted (summary)
                more = f" (and {len(failures) - 1} more collective(s) of the same cause)" if len(failures) > 1 else ""
                print(f"phantora: {message}{more}", file=sys.stderr, flush=True)
            for r in ranks:
                self._fail_rank(r, message)

    def _abandoned(self, rank: int) -> None:
        """`rank` ended: the collectives it never joined fail for their waiting members (now, or
        after abandon_grace_s unless the launcher stops everyone first). Until then they stay
        pending, so their waiting members stay held: no wait on them is answered as done."""
        if self.stopping:
            return
        if self.abandon_grace_s > 0:
            self._deferred.append((time.monotonic() + self.abandon_grace_s, rank))
        else:
            self._fail_collectives(self.engine.abandon_collectives(rank))

    def _fail_deferred(self, now: float) -> None:
        due = [rank for t, rank in self._deferred if t <= now]
        self._deferred = [(t, rank) for t, rank in self._deferred if t > now]
        for rank in due:
            self._fail_collectives(self.engine.abandon_collectives(rank))
        if due:
            self._resume_unblocked()

    # --- while it runs: the trace on disk, the status, possible hangs ---------------------------
    def _tick(self, now: float) -> None:
        if now >= self._next_flush:
            self._next_flush = now + FLUSH_S
            self.engine.sink.flush()
        if self.progress is None:
            return
        self.progress.update(self.run_status(now))
        self._notice_long_waits(now, self.progress)

    def run_status(self, now: float) -> RunStatus:
        ranks = self.engine.ranks
        return RunStatus(
            ranks_expected=self.ranks_expected or self.engine.expected_ranks, ranks_connected=len(ranks),
            ranks_done=sum(1 for st in ranks.values() if st.finished),
            steps={r: st.steps for r, st in ranks.items() if st.steps},
            simulated_ns=max((st.timeline.host_ns for st in ranks.values()), default=0), wall_s=now - self._started)

    def _notice_long_waits(self, now: float, progress: Progress) -> None:
        """A collective waiting for a missing member, and a rank that sends nothing, for longer
        than progress.every_s: each said once, naming the rank."""
        limit = progress.every_s
        for p in list(self.engine.matcher.pending.values()):
            waited = self.waited_s - p.first_wall_s
            if waited > limit:
                call = next(iter(p.arrivals.values()))
                progress.notice(f"wait {p.key}", f"{call.describe()} (collective #{call.seq} of group "
                                f"{list(call.group)}, called at {call.site}) has waited {waited:.0f} s "
                                f"for rank(s) {p.missing()}; it fails once they have sent nothing for "
                                f"--collective-timeout {self.collective_timeout_s:.0f} s")
        pids = {c.rank: c.pid for c in self.connections if c.rank is not None}
        for rank, seen in self._last_seen.items():
            st = self.engine.ranks.get(rank)
            if (now - seen <= limit or st is None or st.finished or rank in self.failed or rank in self.held
                    or self.engine.host_blocked(rank)):
                continue
            pid = pids.get(rank)
            progress.notice(f"idle {rank} {seen}", f"rank {rank} (pid {pid}) has sent nothing for {now - seen:.0f} s "
                            "(no CUDA work, collective or clock read): it is running pure Python or is stuck outside "
                            f"the GPU; `py-spy dump --pid {pid}` shows where")

    def stop(self) -> None:
        """The launcher stops every rank: fail no waiting rank for what the others left undone."""
        self.stopping = True
        self._deferred.clear()
        self._release_store_host(now=True)

    def _others_running(self, host: Connection) -> bool:
        return any(c is not host and c.rank is not None and not c.said_bye and c.sock.fileno() >= 0
                   for c in self.connections)

    def _release_store_host(self, now: bool = False) -> None:
        """Answer the store host's goodbye once no other rank process runs (or `now`)."""
        if self._store_host is None:
            return
        conn, call_id = self._store_host
        if not now and self._others_running(conn):
            return
        self._store_host = None
        if conn.sock.fileno() >= 0:
            self._reply(conn, call_id, True, None)

    def _fail_rank(self, rank: int, message: str) -> None:
        """The rank's next call (or the one it is held in) raises `message`; records it sends
        from now on are dropped: what it computes after a failed collective is meaningless."""
        self.failed.setdefault(rank, message)
        for conn, _records, call in self.held.pop(rank, ()):
            if call is not None and call[1] != P.C_BYE:
                self._reply(conn, call[0], False, message)
            elif call is not None:
                self._handle_failed(conn, call)

    def _accept(self) -> None:
        try:
            sock, _ = self._listener.accept()
        except BlockingIOError:
            return
        sock.setblocking(False)
        conn = Connection(sock)
        self.connections.append(conn)
        self._sel.register(sock, selectors.EVENT_READ, conn)

    def _close(self, conn: Connection) -> None:
        try:
            self._sel.unregister(conn.sock)
        except (KeyError, ValueError):
            pass
        conn.sock.close()
        if conn.rank is not None:
            self.held.pop(conn.rank, None)
            self.engine.finish_rank(conn.rank)
            self._abandoned(conn.rank)
        self._release_store_host()

    def _read(self, conn: Connection) -> None:
        try:
            data = conn.sock.recv(1 << 20)
        except (ConnectionError, OSError):
            data = b""
        if not data:
            self._close(conn)
            return
        try:
            messages = conn.buffer.feed(data)
        except P.ProtocolError as e:
            self.internal_errors.append(f"rank {conn.rank}: {e}")
            self._close(conn)
            return
        for msg in messages:
            self._handle(conn, msg)
        if conn.rank is not None:
            self._last_seen[conn.rank] = time.monotonic()
            self._heard[conn.rank] = self.waited_s

    # --- messages -----------------------------------------------------------------------------
    def _handle(self, conn: Connection, msg: Any) -> None:
        records, call = msg
        rank = conn.rank
        if self.failure is not None:
            return
        if rank is not None and rank in self.failed:
            if call is not None:
                self._handle_failed(conn, call)
            return
        if rank is not None and rank in self.held:
            records, call = self._answer_join(conn, records, call)
            self.held[rank].append((conn, records, call))
            return
        self._process(conn, records, call)
        if self.failure is None:
            self._resume_unblocked()

    def _handle_failed(self, conn: Connection, call: list[Any]) -> None:
        if call[1] == P.C_BYE:
            self._process(conn, [], call)
        else:
            self._reply(conn, call[0], False, self.failed[conn.rank])

    def _process(self, conn: Connection, records: list[Any], call: Any) -> bool:
        """Apply one message; False if the rank is now held (the rest is queued in held)."""
        try:
            if records or (conn.rank is not None and self.engine.host_blocked(conn.rank)):
                if conn.rank is None:
                    raise CallError("a rank process sent records before saying hello")
                done = self.engine.apply(conn.rank, records)
                if done < len(records) or self.engine.host_blocked(conn.rank):
                    rest, call = self._answer_join(conn, records[done:], call)
                    self.held.setdefault(conn.rank, deque()).appendleft((conn, rest, call))
                    return False
            if call is not None:
                value = self._call(conn, call)
                if value is _HELD:
                    self.held.setdefault(conn.rank, deque()).appendleft((conn, [], call))
                    return False
                if value is not _PARKED:
                    self._reply(conn, call[0], True, value)
        except RolesRefuted as e:
            if self.restart_when_refuted:  # the launcher stops the ranks and starts again
                self.refuted = e
                return False
            self.rank_errors.append(str(e))
            if call is not None:
                self._reply(conn, call[0], False, str(e))
        except CollectiveMismatch as e:
            self.rank_errors.append(str(e))
            print(f"phantora: {e}", file=sys.stderr, flush=True)
            for r in e.ranks:
                if r != conn.rank:
                    self._fail_rank(r, str(e))
            self.failed.setdefault(conn.rank, str(e))
            if call is not None:
                self._reply(conn, call[0], False, str(e))
        except DeferredJoinError as e:  # its call was answered already: the rank's next call raises it
            self.rank_errors.append(str(e))
            print(f"phantora: {e}", file=sys.stderr, flush=True)
            self._fail_rank(conn.rank, str(e))
        except CallError as e:
            if call is not None:
                self._reply(conn, call[0], False, str(e))
            else:
                self.internal_errors.append(str(e))
        except Exception as e:  # a bug in the simulator: the run ends (launch.py), the trace is kept
            self.internal_errors.append(traceback.format_exc())
            self._simulator_failed(e, f"simulating rank {conn.rank}")
            return False
        return True

    def _answer_join(self, conn: Connection, records: list[Any], call: Any) -> tuple[list[Any], Any]:
        """A collective called while the rank's host waits is answered at once with a handle and
        joins later, in program order (R_JOIN): the process runs on to its next call that needs
        a time, as a GPU host runs on to its next synchronisation. Without this, a pipeline
        stage blocked behind a receive held its process at every collective it launched, and
        the stages' processes ran one at a time."""
        if call is None or call[1] != P.C_COLLECTIVE:
            return records, call
        self._join_handles += 1
        handle = P.JOIN_HANDLE_BASE + self._join_handles
        self._reply(conn, call[0], True, handle)
        return [*records, [P.R_JOIN, handle, call[2]]], None

    def _resume_unblocked(self) -> None:
        """Go on with held ranks the engine can answer now; that can unblock more."""
        self.engine.progress()
        todo = self.engine.take_unblocked()
        while todo:
            rank = todo.pop()
            queue = self.held.pop(rank, None)
            while queue:
                conn, records, call = queue.popleft()
                if conn.sock.fileno() < 0:
                    continue
                if rank in self.failed:  # a join it queued failed: what it sent after is dropped
                    if call is not None:
                        self._handle_failed(conn, call)
                    continue
                if not self._process(conn, records, call):
                    if self.failure is not None or self.refuted is not None:
                        return
                    self.held[rank].extend(queue)  # _process put the unapplied part in front
                    break
            if not todo:
                self.engine.progress()
            todo |= self.engine.take_unblocked()

    def _call(self, conn: Connection, call: list[Any]) -> Any:
        kind = call[1]
        if kind == P.C_HELLO:
            info = call[2]
            st = self.engine.add_rank(RankInfo(
                int(info["rank"]), int(info.get("node", 0)), int(info.get("local_rank", 0)), int(info.get("pid", 0)),
                devices=tuple(int(d) for d in info.get("devices", ())), certain=bool(info.get("certain", True))))
            self._follow_moves()
            conn.rank, conn.pid = st.info.rank, info.get("pid")
            self.engine.expected_ranks = max(self.engine.expected_ranks,
                                             self.engine.processes_in(int(info.get("world_size", 1))))
            self._note_rank(st.info.rank)
            return self.hello_reply
        if conn.rank is None:
            raise CallError("a rank process made a call before saying hello")
        if kind == P.C_IDENTIFY:
            info = call[2]
            new = int(info["rank"])
            self.engine.identify_rank(conn.rank, new, int(info.get("node", 0)), int(info.get("local_rank", 0)),
                                      int(info.get("world_size", 1)))
            self._follow_moves()
            self._rekey(conn.rank, new)
            conn.rank = new
            self._note_rank(new)
            return None
        if kind == P.C_NOW:
            return self.engine.now(conn.rank)
        if kind == P.C_ELAPSED:
            value = self.engine.elapsed_ms(conn.rank, call[2], call[3])
        elif kind == P.C_QUERY_EVENT:
            value = self.engine.query_event(conn.rank, call[2])
        elif kind == P.C_QUERY_STREAM:
            value = self.engine.query_stream(conn.rank, call[2], call[3])
        elif kind == P.C_COLLECTIVE:
            return self.engine.join_collective(conn.rank, call[2])
        else:
            value = None
        if kind in (P.C_ELAPSED, P.C_QUERY_EVENT, P.C_QUERY_STREAM):
            return _HELD if value is NOT_YET else value
        if kind == P.C_BYE:
            conn.said_bye = True
            self.engine.finish_rank(conn.rank)
            self._abandoned(conn.rank)
            if isinstance(call[2], dict) and call[2].get("hosts_store") and not call[2].get("failed") \
                    and not self.stopping and self._others_running(conn):
                self._store_host = (conn, call[0])
                return _PARKED
            self._release_store_host()
            return None
        raise CallError(f"unknown call kind {kind!r}")

    def _note_rank(self, rank: int) -> None:
        if rank >= 0:  # < 0: provisional, until init_process_group names the rank
            self.ranks_seen.add(rank)

    def _follow_moves(self) -> None:
        """Processes the engine moved to a provisional id (another claimed their guessed rank)."""
        for old, new in self.engine.moved.items():
            for c in self.connections:
                if c.rank == old:
                    c.rank = new
            self._rekey(old, new)
        self.engine.moved.clear()

    def _rekey(self, old: int, new: int) -> None:
        if old == new:
            return
        self.ranks_seen.discard(old)
        for table in (self.held, self.failed):
            if old in table:
                table[new] = table.pop(old)  # type: ignore[index]

    def _reply(self, conn: Connection, call_id: int, ok: bool, value: Any) -> None:
        if not self._send(conn, [call_id, ok, value]):
            self._close(conn)

    def _send(self, conn: Connection, message: list[Any]) -> bool:
        """One whole message to a rank (blocking, so it is never cut); False if the socket failed."""
        with self._send_lock:
            if conn.sock.fileno() < 0:
                return False
            try:
                conn.sock.setblocking(True)
                P.send_message(conn.sock, message)
                return True
            except OSError:
                return False
            finally:
                if conn.sock.fileno() >= 0:
                    conn.sock.setblocking(False)

    def _keep_alive(self, every_s: float) -> None:
        """The keepalive thread: while the serving thread has been on one round of messages for
        `every_s` or more and the network processed events since the last keepalive, tell every
        rank (protocol.KEEPALIVE). A simulator that stops progressing sends nothing, so the ranks'
        call timeout still ends a hang."""
        seen: tuple[float, int] | None = None  # (the busy round, the network's work) at the last look
        while not self._keepalive_stop.wait(every_s):
            parked = self._store_host
            if parked is not None:  # waits for the other ranks: not a hang of the simulator
                self._send(parked[0], [P.KEEPALIVE, None, {"waiting_for": "the other rank processes to finish"}])
            since, network = self._busy_since, self.engine.network
            if since is None or network is None or time.monotonic() - since < every_s:
                seen = None
                continue
            work = network.event_batches
            progressed = seen is not None and seen[0] == since and work > seen[1]
            seen = (since, work)
            if not progressed:
                continue
            busy = {"busy_s": round(time.monotonic() - since, 1)}
            for conn in list(self.connections):
                if conn.rank is not None:
                    self._send(conn, [P.KEEPALIVE, None, busy])

    def close(self) -> None:
        self._keepalive_stop.set()
        for conn in self.connections:
            if conn.sock.fileno() >= 0:
                self._close(conn)
        self._sel.close()
        self._listener.close()
        try:
            os.unlink(self.socket_path)
            os.rmdir(self.tmpdir)
        except OSError:
            pass
