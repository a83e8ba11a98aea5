"""Measured host time: the CPU time the program spends between the calls phantora intercepts.

On a real machine a step is GPU work plus whatever the host does that the GPU waits for: the
user's and the framework's Python, torch's Python layers (nn.Module, autograd.Function, DTensor's
sharding propagation, hooks), the autograd engine. Under phantora all of that runs for real, on
this machine's CPU; what does not run for real is the GPU side (dispatch into FakeTensor, the
observer, the link to the simulator), which the op cost model stands for.

So every entry into phantora's own work (an op reaching the observer, a call or record to the
simulator, a storage freed) is bracketed by `PythonTime.enter()` / `exit()`: the thread's CPU
time (`time.thread_time_ns`: not wall time, so neither other processes on this machine nor the
waits on the simulator count) from one exit to the next enter is the program's own, and is sent
with the next record as `python_ns` (an R_OP's fifth field, or an R_PYTHON record). The
simulator scales it from this machine to the simulated host by this machine's speed, which the
rank measures when it starts and again every PROBE_EVERY_NS of measured Python (R_HOST_SPEED,
phantora/cost/host_bench.py).

Which threads count: the rank has one simulated host timeline, the thread that launches its
GPU work (clock.HostThread) plus the autograd engine's C++ device threads, which run backward for
it. Other Python threads (a pin-memory thread, a progress bar's refresh) run beside it on a real
machine: their time is dropped.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

from phantora.cost.host_bench import PROBE_EVERY_NS, python_bench_ms

ENV = "PHANTORA_HOST_TIME"  # phantora trace --host-time: cost/host.py HOST_TIME_MODES

_thread_ns = time.thread_time_ns  # clock.py leaves thread_time real: it measures the interposer itself


class _OwnWork:
    """`with python_time.own_work:` brackets a block of phantora's own work (enter / exit)."""

    __slots__ = ("_pt",)

    def __init__(self, pt: "PythonTime") -> None:
        self._pt = pt

    def __enter__(self) -> None:
        self._pt.enter()

    def __exit__(self, *exc: Any) -> None:
        self._pt.exit()


class _ThreadTime(threading.local):
    """A thread's brackets: nesting depth, the clock when it last left phantora's work (None:
    not yet), the program's time not yet taken, and a side thread's (take_beside). Defaults on
    the class: getattr(local, name, default) raises and catches for every unset name, at every op."""

    depth = 0
    mark: int | None = None
    pending = 0
    beside_ns = 0


class PythonTime:
    """Per-thread Python time outside phantora, taken with the records that follow it: counted
    work on the reference host (mode "counted", python_work.py) or this machine's CPU time
    ("measured")."""

    def __init__(self, host_thread: Any, mode: str) -> None:
        self.host_thread = host_thread  # clock.HostThread
        self.mode = mode
        self.enabled = mode in ("measured", "counted")
        self.counted = mode == "counted"
        self._clock = _thread_ns
        self._counter: Any = None
        if self.counted:
            from interpose.host import python_work

            self._counter = python_work.load()
            # ps of reference-host work counted on this thread; phantora's own work pauses it
            self._clock = self._counter.now_ps
        # CPU time of one way into phantora's dispatch and back outside the brackets (the C++
        # dispatcher reaching a Python dispatch mode, torch's wrappers around it): a GPU host
        # pays its own dispatcher instead, which the op cost model has. Measured per process.
        self.dispatch_floor_ns = 0
        self._probe: list[int] | None = None  # gaps before dispatch entries, while measuring the floor
        self._tls = _ThreadTime()
        self.since_speed_probe_ns = 0  # measured Python handed over since this machine's speed was measured
        self.charged = 0  # every thread's Python so far, in the clock's unit (ps counted, ns measured): for probes
        self.own_work = _OwnWork(self)

    def enter(self, dispatch: bool = False) -> None:
        """phantora's own work starts on this thread (nested entries are its own work too);
        `dispatch`: an op reached the observer."""
        if not self.enabled:
            return
        tls = self._tls
        depth = tls.depth
        tls.depth = depth + 1
        if depth:
            return
        now = self._clock()
        if self._counter is not None:
            self._counter.pause()
        mark = tls.mark
        if mark is not None:
            gap = now - mark
            if dispatch:
                if self._probe is not None:
                    self._probe.append(gap)
                gap = max(0, gap - self.dispatch_floor_ns)
            tls.pending += gap
            self.charged += gap

    def exit(self) -> None:
        if not self.enabled:
            return
        tls = self._tls
        tls.depth -= 1
        if tls.depth == 0:
            if self._counter is not None:
                self._counter.resume()
            tls.mark = self._clock()

    def take(self) -> int:
        """The program's CPU time on this thread since it last sent some, in ns; 0 for a thread
        whose time does not count for the rank's host (see the module docstring)."""
        if not self.enabled:
            return 0
        tls = self._tls
        pending = self._pending_ns(tls)
        if not pending:
            return 0
        current = threading.current_thread()
        if isinstance(current, threading._DummyThread) or self.host_thread.is_current():
            self.since_speed_probe_ns += pending
            return pending
        tls.beside_ns += pending
        return 0

    def take_beside(self) -> int:
        """The program's Python on this thread since its last take_beside, in ns, for a thread
        beside the training loop (whose Python take() keeps off the host timeline); call it
        inside a bracket."""
        if not self.enabled:
            return 0
        tls = self._tls
        total, tls.beside_ns = tls.beside_ns + self._pending_ns(tls), 0
        return total

    def _pending_ns(self, tls: _ThreadTime) -> int:
        """This thread's Python since its last take, in whole ns, taken off it (counted work is in
        ps: the whole ns go now, the rest with the next take)."""
        pending = tls.pending
        if self.counted:
            pending, tls.pending = divmod(pending, 1000)
        else:
            tls.pending = 0
        return pending

    def speed_probe_due(self) -> bool:
        """Whether this machine's Python speed should be measured again (cost/host_bench.py);
        counted work is already on the reference host."""
        return self.enabled and not self.counted and self.since_speed_probe_ns >= PROBE_EVERY_NS

    def measure_speed(self) -> float:
        """The benchmark's CPU time now, in ms; call it inside a bracket (it is phantora's work)."""
        self.since_speed_probe_ns = 0
        return min(python_bench_ms() for _ in range(2))

    def forget(self) -> None:
        """Drop what this thread measured so far (before it was a rank the clock read real time;
        in a forked child the thread's CPU clock started again at 0)."""
        tls = self._tls
        tls.pending = 0
        if tls.depth == 0:
            if self._counter is not None:
                self._counter.resume()
            tls.mark = self._clock()


def measure_dispatch_floor(pt: PythonTime, run_op: Callable[[], Any], ops: int = 400) -> int:
    """The median gap before a dispatch entry in a tight loop of a bare op (`run_op`, which
    must report nothing): what this process pays outside the brackets per op."""
    if not pt.enabled:
        return 0
    tls = pt._tls
    saved = tls.depth, tls.mark, tls.pending
    pt._probe = probe = []
    tls.depth, tls.mark = 0, pt._clock()  # measured from inside phantora's own work (the connect)
    if pt._counter is not None:
        pt._counter.resume()
    try:
        for _ in range(ops):
            run_op()
    finally:
        if pt._counter is not None:
            pt._counter.pause()
        pt._probe = None
        tls.depth, tls.mark, tls.pending = saved
    probe.sort()
    return probe[len(probe) // 2] if probe else 0


def exclude_garbage_collection(pt: PythonTime) -> None:
    """The cyclic garbage collector runs wherever the program allocates, and under phantora it
    walks phantora's own objects too (signatures, shadows, FakeTensor caches): its time is
    phantora's, not the program's."""
    import gc

    def bracket(phase: str, info: dict) -> None:
        if phase == "start":
            pt.enter()
        elif pt._tls.depth:
            pt.exit()

    gc.callbacks.append(bracket)
