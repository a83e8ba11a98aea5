"""The virtual clock: time.* in the user's process reads the rank's simulated host clock.

Before the process first touches a virtual GPU it is not a rank yet (it may be torchrun's
agent or a DataLoader worker), so the clocks read real time. From the first GPU activity on,
time.time() is the real time at that moment plus the simulated host time since; likewise
perf_counter and monotonic, so every clock stays monotonic across the switch. Each read asks
the simulator (one round trip, which also delivers all ops recorded so far).

Threads. A rank has one simulated host clock: the timeline of the thread that launches its GPU
work. Every thread reads that clock (a progress bar's elapsed time agrees with the trainer's
runtime), but only that thread's time.sleep moves it; other threads (a progress bar's refresh
loop, a watchdog) sleep for real, so they neither stretch the simulated steps nor spin, and
never hold up the end of the run. See HostThread for which thread that is.

Clocks bound by value. A module that ran `from time import time` before the clock was installed
(tqdm, which torch._dynamo imports during `import torch`; anything the script imported first)
holds the real function; install_clock re-points such module attributes outside the standard
library. The standard library's own bound clocks stay real on purpose: threading, queue,
subprocess, sched and socketserver time their blocking waits with them, and a wait on a lock
or queue is real whatever the simulated clock says (a timeout measured in simulated time would
never expire while the thread that moves the clock is the one waiting). Also real: clocks bound
as default arguments or stored on objects before the install, datetime.now() (cannot be patched
from Python; docs/virtual-gpu.md says so), time.process_time and thread_time (they measure the
interposer itself).
"""

from __future__ import annotations

import queue  # noqa: F401  (these bind the real monotonic clock for their timeouts, see above)
import sched  # noqa: F401
import socketserver  # noqa: F401
import subprocess  # noqa: F401
import sys
import threading
import time
import timeit
from dataclasses import dataclass, field
from typing import Any, Callable

from phantora import protocol as P

_real = dict(
    time=time.time, time_ns=time.time_ns, perf_counter=time.perf_counter, perf_counter_ns=time.perf_counter_ns,
    monotonic=time.monotonic, monotonic_ns=time.monotonic_ns, sleep=time.sleep,
)


# Sleeps that poll for another process: a file lock another rank holds (the Hugging Face datasets
# cache's, while that rank builds the dataset), torch.distributed.elastic's waits. How many polls
# there are depends on the other process's wall-clock progress, so simulated, they made the rank's
# start-up vary by seconds from run to run (TorchTitan at 256 GPUs: 22.9 s); they are real sleeps
# and move no simulated clock; the clocks they read for their timeouts read real time.
REAL_SLEEP_MODULES = ("filelock", "portalocker", "datasets.utils._filelock", "torch.distributed.elastic")


def _polls_another_process(frame: Any, depth: int = 4) -> bool:
    """Whether one of the `depth` innermost callers of time.sleep is in REAL_SLEEP_MODULES."""
    while frame is not None and depth > 0:
        if str(frame.f_globals.get("__name__", "")).startswith(REAL_SLEEP_MODULES):
            return True
        frame, depth = frame.f_back, depth - 1
    return False


class HostThread:
    """Which thread's sleeps move the rank's simulated host clock: the Python thread that most
    recently launched GPU work, or the main thread before any has and once that thread ended.

    Normally that is the training loop's thread, also when it is not the main thread (a main
    thread that polls `while worker.is_alive(): time.sleep(1)` sleeps for real once the worker
    has launched its first GPU op; its sleeps before that still moved the clock). Work the
    autograd engine launches from its own device threads counts for the thread that called
    backward(): those are C++ threads, which Python sees as threading._DummyThread.

    `lock` is held while an op is recorded and its thread noted (the observer holds the
    runtime's lock there), so a sleep lands wholly before or wholly after a hand-over."""

    def __init__(self, lock: threading.RLock) -> None:
        self.thread = threading.main_thread()
        self.lock = lock

    def launched_gpu_work(self) -> None:
        if self.thread.ident == threading.get_ident():
            return
        current = threading.current_thread()
        if not isinstance(current, threading._DummyThread):
            self.thread = current

    def is_current(self) -> bool:
        # the host thread while it lives, else the main thread; asked at every record, so the
        # running thread is compared first (a thread that runs is alive) and is_alive() only
        # asked for the main thread
        current = threading.current_thread()
        if current is self.thread:
            return True
        return current is threading.main_thread() and not self.thread.is_alive()


@dataclass
class _Bases:
    time_ns: int = 0
    perf_ns: int = 0
    mono_ns: int = 0


class VirtualClock:
    def __init__(self, client: object, host_thread: HostThread) -> None:
        self.client = client
        self.host_thread = host_thread
        self.bases: _Bases | None = None
        self.enabled = True
        self._held: list[int | None] = []  # the reading at each hold() (torch.compile, nested)

    def hold(self) -> None:
        """Stop the clock: until release(), it reads what it reads now and sleeps are real.
        The host work in between (torch.compile) is charged by the simulator as modelled."""
        self._held.append(self._sim_ns())

    def release(self) -> None:
        if self._held:
            self._held.pop()

    def _sim_ns(self) -> int | None:
        """Simulated host ns since the rank started, or None while this is not a rank (and for
        the modules that poll another process: their timeouts are in real time, as their sleeps)."""
        if not self.enabled or not self.client.connected:  # type: ignore[attr-defined]
            return None
        if _polls_another_process(sys._getframe(2), depth=3):
            return None
        if self._held and self._held[-1] is not None:
            return self._held[-1]
        if self.bases is None:
            self.bases = _Bases(_real["time_ns"](), _real["perf_counter_ns"](), _real["monotonic_ns"]())
        return int(self.client.call(P.C_NOW))  # type: ignore[attr-defined]

    def time_ns(self) -> int:
        t = self._sim_ns()
        return _real["time_ns"]() if t is None else self.bases.time_ns + t  # type: ignore[union-attr]

    def perf_counter_ns(self) -> int:
        t = self._sim_ns()
        return _real["perf_counter_ns"]() if t is None else self.bases.perf_ns + t  # type: ignore[union-attr]

    def monotonic_ns(self) -> int:
        t = self._sim_ns()
        return _real["monotonic_ns"]() if t is None else self.bases.mono_ns + t  # type: ignore[union-attr]

    def sleep(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("sleep length must be non-negative")
        if (self.enabled and self.client.connected and not self._held  # type: ignore[attr-defined]
                and not _polls_another_process(sys._getframe(1))):
            with self.host_thread.lock:
                simulated = self.host_thread.is_current()
                if simulated:
                    self.client.record([P.R_SLEEP, int(seconds * 1e9)])  # type: ignore[attr-defined]
            if simulated:
                _real["sleep"](0)  # let other threads run; the wait itself is simulated
                return
        _real["sleep"](seconds)


@dataclass
class _Repointed:
    """Module attributes that held a real clock function and now hold the virtual one."""

    entries: list[tuple[Any, str, Callable[..., Any]]] = field(default_factory=list)

    def restore(self) -> None:
        for module, name, real in self.entries:
            setattr(module, name, real)
        self.entries.clear()


_repointed = _Repointed()


def _repoint_bound_clocks(virtual: dict[str, Callable[..., Any]]) -> None:
    """Point every module attribute outside the standard library that is one of the real clock
    functions (`from time import time`) at its virtual replacement."""
    by_real = {id(_real[name]): (_real[name], fn) for name, fn in virtual.items()}
    for module_name, module in list(sys.modules.items()):
        if module_name.partition(".")[0] in sys.stdlib_module_names:
            continue
        attrs = getattr(module, "__dict__", None)
        if not isinstance(attrs, dict):
            continue
        for attr, value in list(attrs.items()):
            hit = by_real.get(id(value))
            if hit is not None and value is hit[0]:
                attrs[attr] = hit[1]
                _repointed.entries.append((module, attr, value))


def install_clock(clock: VirtualClock) -> None:
    virtual: dict[str, Callable[..., Any]] = dict(
        time_ns=clock.time_ns, time=lambda: clock.time_ns() / 1e9,
        perf_counter_ns=clock.perf_counter_ns, perf_counter=lambda: clock.perf_counter_ns() / 1e9,
        monotonic_ns=clock.monotonic_ns, monotonic=lambda: clock.monotonic_ns() / 1e9,
        sleep=clock.sleep,
    )
    for name, fn in virtual.items():
        setattr(time, name, fn)
    timeit.default_timer = time.perf_counter  # the standard library's one bound clock that times the program
    _repoint_bound_clocks(virtual)


def restore_real_clock() -> None:
    for name, fn in _real.items():
        setattr(time, name, fn)
    timeit.default_timer = _real["perf_counter"]
    _repointed.restore()
