"""interpose/host/host_time.py's accounting, with a fake CPU clock: what lies between phantora's
brackets is the program's, nested brackets are phantora's, a dispatch entry leaves out the
dispatch floor, and only the threads that count for the rank's host hand their time over."""

from __future__ import annotations

import threading

import pytest

from interpose.host import host_time
from interpose.host.host_time import PythonTime


class Clock:
    def __init__(self) -> None:
        self.ns = 0

    def __call__(self) -> int:
        return self.ns


class Host:
    """clock.HostThread's question: is the calling thread the one that launches GPU work?"""

    def __init__(self, thread: threading.Thread) -> None:
        self.thread = thread

    def is_current(self) -> bool:
        return threading.current_thread() is self.thread


@pytest.fixture
def clock(monkeypatch) -> Clock:
    c = Clock()
    monkeypatch.setattr(host_time, "_thread_ns", c)
    return c


def test_time_between_brackets_is_the_programs(clock):
    pt = PythonTime(Host(threading.current_thread()), "measured")
    pt.enter(); clock.ns += 500; pt.exit()  # phantora's own work
    clock.ns += 20_000  # the program's
    pt.enter()
    clock.ns += 3_000
    pt.enter(); clock.ns += 100; pt.exit()  # nested: still phantora's
    assert pt.take() == 20_000
    pt.exit()
    assert pt.take() == 0  # taken once


def test_a_dispatch_entry_leaves_out_the_dispatch_floor(clock):
    pt = PythonTime(Host(threading.current_thread()), "measured")
    pt.dispatch_floor_ns = 7_000
    pt.enter(); pt.exit()
    clock.ns += 10_000
    pt.enter(dispatch=True); pt.exit()
    clock.ns += 5_000  # shorter than the floor: nothing, never less
    pt.enter(dispatch=True); pt.exit()
    assert pt.take() == 3_000


def test_other_python_threads_do_not_count(clock):
    pt = PythonTime(Host(threading.main_thread()), "measured")
    got = []

    def worker() -> None:  # a pin-memory thread, a progress bar's refresh
        pt.enter(); pt.exit()
        clock.ns += 1_000_000
        pt.enter()
        got.append(pt.take())
        pt.exit()

    t = threading.Thread(target=worker)
    t.start(); t.join()
    assert got == [0]


def test_disabled_measures_nothing(clock):
    pt = PythonTime(Host(threading.current_thread()), "modelled")
    pt.enter(); pt.exit(); clock.ns += 1_000; pt.enter()
    assert pt.take() == 0


def test_forget_starts_over(clock):
    pt = PythonTime(Host(threading.current_thread()), "measured")
    pt.enter(); pt.exit(); clock.ns += 1_000
    pt.enter(); pt.exit()
    pt.forget()
    clock.ns += 200
    pt.enter()
    assert pt.take() == 200


def test_the_floor_is_the_median_gap_of_a_bare_op(clock):
    pt = PythonTime(Host(threading.current_thread()), "measured")
    gaps = iter([5_000, 7_000, 100_000, 6_000, 7_500])

    def bare_op() -> None:
        clock.ns += next(gaps)
        pt.enter(dispatch=True); clock.ns += 50_000; pt.exit()

    assert host_time.measure_dispatch_floor(pt, bare_op, ops=5) == 7_000
    assert pt.take() == 0  # the probe's ops are nobody's Python


def _spin(n: int) -> int:
    x = 0
    for i in range(n):
        x = x + i
    return x


def test_counted_mode_counts_only_between_brackets():
    pt = PythonTime(Host(threading.current_thread()), "counted")

    def program(outside: int, inside: int) -> int:
        pt.enter(); pt.take(); pt.exit()  # hand over whatever ran before this call
        _spin(outside)  # the program's Python
        pt.enter()
        _spin(inside)  # phantora's own work: the counter is paused
        taken = pt.take()
        pt.exit()
        return taken

    base = program(1_000, 0)
    assert base > 0
    assert abs(program(1_000, 100_000) - base) <= 1  # whole ns are handed over, the ps carried
    assert program(2_000, 0) > base
