"""The virtual clock: time.* in the user's process reads the rank's simulated host clock.

Before the process first touches a virtual GPU it is not a rank yet (it may be torchrun's
agent or a DataLoader worker), so the clocks read real time. From the first GPU activity on,
time.time() is the real time at that moment plus the simulated host time since; likewise
perf_counter and monotonic, so every clock stays monotonic across the switch. Each read asks
the simulator (one round trip, which also delivers all ops recorded so far).

Not patched, on purpose: threading/queue/subprocess captured the real monotonic clock at
import, so their timeouts stay real; datetime.now() cannot be patched from Python (the
README says so); time.process_time and thread_time measure the interposer itself.
"""

from __future__ import annotations

import time
import timeit
from dataclasses import dataclass

from phantora import protocol as P

_real = dict(
    time=time.time, time_ns=time.time_ns, perf_counter=time.perf_counter, perf_counter_ns=time.perf_counter_ns,
    monotonic=time.monotonic, monotonic_ns=time.monotonic_ns, sleep=time.sleep,
)


@dataclass
class _Bases:
    time_ns: int = 0
    perf_ns: int = 0
    mono_ns: int = 0


class VirtualClock:
    def __init__(self, client: object) -> None:
        self.client = client
        self.bases: _Bases | None = None
        self.enabled = True

    def _sim_ns(self) -> int | None:
        """Simulated host ns since the rank started, or None while this is not a rank."""
        if not self.enabled or not self.client.connected:  # type: ignore[attr-defined]
            return None
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
        if self.enabled and self.client.connected:  # type: ignore[attr-defined]
            self.client.record([P.R_SLEEP, int(seconds * 1e9)])  # type: ignore[attr-defined]
            _real["sleep"](0)  # let other threads run; the wait itself is simulated
        else:
            _real["sleep"](seconds)


def install_clock(clock: VirtualClock) -> None:
    time.time_ns = clock.time_ns
    time.time = lambda: clock.time_ns() / 1e9
    time.perf_counter_ns = clock.perf_counter_ns
    time.perf_counter = lambda: clock.perf_counter_ns() / 1e9
    time.monotonic_ns = clock.monotonic_ns
    time.monotonic = lambda: clock.monotonic_ns() / 1e9
    time.sleep = clock.sleep
    timeit.default_timer = time.perf_counter


def restore_real_clock() -> None:
    for name, fn in _real.items():
        setattr(time, name, fn)
    timeit.default_timer = _real["perf_counter"]
