"""The rank process's one connection to the simulator.

Records are buffered and sent in batches; a call flushes the batch and waits for its answer
with a timeout (no wait in phantora is unbounded): the time the simulator stays silent, since a
simulator busy with one long piece of work sends keepalives while its network makes progress.
The connection is opened lazily, on the first record or call, so processes that never touch CUDA
(torchrun's agent, DataLoader workers) never become ranks; the hello that names the rank is made
then too (a launcher may set the rank's environment after torch's import).
"""

from __future__ import annotations

import os
import socket
import threading
from collections import deque
from typing import Any, Callable

from phantora import protocol as P

BATCH_RECORDS = 2048
FLUSH_S = 1.0  # records waiting longer are sent by a background thread (see _start_flusher)


class SimulatorGone(RuntimeError):
    pass


class SimClient:
    def __init__(self, socket_path: str, hello: Callable[[], dict[str, Any]], timeout_s: float) -> None:
        self._path = socket_path
        self._hello = hello
        self._timeout = timeout_s
        self._sock: socket.socket | None = None
        self._records: list[list[Any]] = []
        self._before_hello: list[list[Any]] = []  # note_record()s made before this process was a rank
        self._lock = threading.RLock()
        self._next_call = 0
        self.disabled_reason: str | None = None
        self._closed = False
        self.hello_reply: dict[str, Any] = {}
        self.python_time: Any = None  # host_time.PythonTime: the program's CPU time goes with the records
        self.on_connect: Callable[[], None] | None = None  # the rank's set-up once it is one
        self.exit_info: dict[str, Any] = {}  # sent with the goodbye (C_BYE)
        # Replies are read through a buffer that keeps what arrived, so that a call interrupted
        # while it waited (Ctrl-C in the program) leaves the stream whole: the reply it did not
        # read is skipped by the next call, which a `finally:` or an atexit handler may make.
        self._inbox = P.MessageBuffer()
        self._arrived: deque[Any] = deque()
        self._torn: str | None = None  # why the byte stream is unusable (a send cut short)

    @property
    def connected(self) -> bool:
        return self._sock is not None

    def disable(self, reason: str) -> None:
        """Stop talking to the simulator (e.g. in a forked child, which must not share the socket)."""
        self.disabled_reason = reason
        self._sock = None
        self._records = []
        self._inbox, self._arrived, self._torn = P.MessageBuffer(), deque(), None

    def _connect(self) -> None:
        if self.disabled_reason:
            raise SimulatorGone(f"phantora: this process cannot use the virtual GPUs: {self.disabled_reason}")
        if self._closed:
            raise SimulatorGone("phantora: this rank already closed its connection to the simulator (at exit); "
                                "GPU work after that is not simulated")
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self._timeout)
        try:
            sock.connect(self._path)
        except OSError as e:
            raise SimulatorGone(f"phantora: cannot reach the simulator at {self._path}: {e}") from e
        self._sock = sock
        hello = dict(self._hello(), pid=os.getpid())
        self.hello_reply = self._roundtrip([], [self._call_id(), P.C_HELLO, hello]) or {}
        self._records[:0], self._before_hello = self._before_hello, []
        if self.python_time is not None:
            self.python_time.forget()  # before this the clock read real time (clock.py)
        if self.on_connect is not None:
            self.on_connect()
        self._start_flusher()

    # --- records reach the simulator even when the script stops calling -----------------------------
    def _start_flusher(self) -> None:
        """A rank that stops making calls (spinning in pure Python, blocked outside the GPU, about
        to be killed) would otherwise keep its last records: the simulator and the trace would
        never see its last steps. A daemon thread sends waiting records about once a second."""
        if getattr(self, "_flusher", None) is not None:
            return
        self._flusher = threading.Thread(target=self._flush_periodically, name="phantora-flush", daemon=True)
        self._flusher.start()

    def _flush_periodically(self) -> None:
        stop = threading.Event()
        while not stop.wait(FLUSH_S):
            if self._sock is None:
                return
            try:
                self.flush()
            except SimulatorGone:
                return

    def _call_id(self) -> int:
        self._next_call += 1
        return self._next_call

    def note_record(self, rec: list[Any]) -> None:
        """A record that does not make this process a rank (it is sent with the first one that
        does): a process group created before any GPU work must not start the rank's clock."""
        with self._lock:
            if self._sock is None:
                self._before_hello.append(rec)
            else:
                self.record(rec)

    def record(self, rec: list[Any]) -> None:
        pt = self.python_time
        if pt is not None:
            pt.enter()
        try:
            with self._lock:
                if self._closed:
                    # After the goodbye (atexit), storages freed by the interpreter's teardown
                    # still report; reconnecting would claim this rank a second time.
                    return
                if self._sock is None:  # the first GPU activity makes this process a rank
                    self._connect()
                self._take_python_time(rec)
                self._records.append(rec)
                if len(self._records) >= BATCH_RECORDS:
                    self._send_batch()
        finally:
            if pt is not None:
                pt.exit()

    def _take_python_time(self, rec: list[Any] | None) -> None:
        """The program's CPU time before this record (host_time.py): an op carries it as its
        fifth field, anything else gets an R_PYTHON record before it."""
        if self.python_time is None:
            return
        ns = self.python_time.take()
        if self.python_time.speed_probe_due():
            self._records.append([P.R_HOST_SPEED, self.python_time.measure_speed()])
        if not ns:
            return
        if rec is not None and rec[0] == P.R_OP:
            rec.append(ns)
        else:
            self._records.append([P.R_PYTHON, ns])

    def _send_batch(self) -> None:
        if not self._records:
            return
        if self._sock is None:
            self._connect()
        batch, self._records = self._records, []
        self._send([batch, None])

    def _send(self, message: list[Any]) -> None:
        """One whole message, or a stream marked torn: a send cut short (KeyboardInterrupt or a
        timeout part-way) leaves part of a message the simulator cannot frame, so nothing may
        follow it. Bytes are counted as they go, so an interrupt before the first byte or after
        the last leaves the stream whole."""
        assert self._sock is not None
        if self._torn is not None:
            raise SimulatorGone(self._torn)
        data = memoryview(P.encode(message))
        sent = 0
        try:
            try:
                while sent < len(data):
                    sent += self._sock.send(data[sent:])
            finally:  # only an exception can leave it part-way
                if 0 < sent < len(data):
                    self._torn = ("phantora: this rank was interrupted in the middle of a message to the simulator "
                                  "(Ctrl-C or another signal); it cannot talk to the simulator any more")
        except socket.timeout:
            raise
        except OSError as e:
            raise SimulatorGone(f"phantora: lost the connection to the simulator: {e}") from e

    def flush(self) -> None:
        with self._lock:
            if self._records:
                self._send_batch()

    def call(self, kind: int, *args: Any) -> Any:
        pt = self.python_time
        if pt is not None:
            pt.enter()
        try:
            with self._lock:
                if self._sock is None:
                    self._connect()
                self._take_python_time(None)
                batch, self._records = self._records, []
                return self._roundtrip(batch, [self._call_id(), kind, *args])
        finally:
            if pt is not None:
                pt.exit()

    def _roundtrip(self, batch: list[list[Any]], call: list[Any]) -> Any:
        assert self._sock is not None
        try:
            self._send([batch, call])
            _, ok, value = self._reply_to(call[0])
        except socket.timeout as e:
            raise TimeoutError(
                f"phantora: the simulator did not answer within {self._timeout:.0f} s "
                f"(call kind {call[1]}); set PHANTORA_CALL_TIMEOUT to wait longer"
            ) from e
        except (OSError, ConnectionError, P.ProtocolError) as e:
            raise SimulatorGone(f"phantora: lost the connection to the simulator: {e}") from e
        if not ok:
            raise RuntimeError(value)
        return value

    def _reply_to(self, call_id: int) -> list[Any]:
        """The reply to `call_id`, skipping keepalives (the simulator is busy, not gone) and the
        replies to earlier calls: a call interrupted while it waited (Ctrl-C) left its reply to
        come, and call ids only grow."""
        while True:
            while not self._arrived:
                data = self._sock.recv(1 << 20)  # type: ignore[union-attr]
                if not data:
                    raise ConnectionError("connection closed by peer")
                self._arrived.extend(self._inbox.feed(data))
            reply = self._arrived.popleft()
            if reply[0] == P.KEEPALIVE or reply[0] < call_id:
                continue
            if reply[0] != call_id:
                raise SimulatorGone(f"phantora: protocol error: reply to call {reply[0]}, expected {call_id}")
            return reply

    def close(self) -> None:
        with self._lock:
            self._closed = True
            if self._sock is None:
                return
            try:
                if self._records:
                    self._send_batch()
                self._roundtrip([], [self._call_id(), P.C_BYE, self.exit_info])
            except (SimulatorGone, TimeoutError, RuntimeError):
                pass
            finally:
                self._sock.close()
                self._sock = None
