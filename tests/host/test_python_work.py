"""The counted Python clock (interpose/host/python_work.py) against `dis`: it counts the bytecode
instructions the interpreter runs, per thread, only while resumed, never in phantora's own files."""

from __future__ import annotations

import dis
import threading

import pytest

from interpose.host import python_work
from phantora.cost.host import PYTHON_WORK


@pytest.fixture(scope="module")
def counter():
    return python_work.load()


def straight(a):
    b = a + 1
    c = b * 2
    d = [b, c]
    return d


def loop(n):
    x = 0
    for i in range(n):
        x = x + i
    return x


def empty():
    pass


def _counted(counter, fn, *args):
    counter.resume()
    before = counter.counts()
    fn(*args)
    after = counter.counts()
    counter.pause()
    return after[0] - before[0], after[1] - before[1]


def counted(counter, fn, *args):
    """What fn(*args) ran, less the lines around the call here (an empty function's count)."""
    run, base = _counted(counter, fn, *args), _counted(counter, empty)
    empty_body = len(_instructions(empty))
    return run[0] - base[0] + empty_body, run[1] - base[1] + 1


def _instructions(fn) -> list[str]:
    """What the counter can count of fn: RESUME, its first instruction, sits on the `def` line,
    whose line event the interpreter does not send; CACHE entries are data."""
    return [i.opname for i in dis.get_instructions(fn) if i.opname not in ("RESUME", "CACHE")]


def test_straight_line_code_counts_what_dis_lists(counter):
    assert counted(counter, straight, 1) == (len(_instructions(straight)), 1)


def test_a_loop_counts_its_body_once_per_iteration(counter):
    per_iteration = _loop_body(loop)
    ten, _ = counted(counter, loop, 10)
    thousand, _ = counted(counter, loop, 1010)
    assert thousand - ten == 1000 * per_iteration


def _loop_body(fn) -> int:
    """Instructions of fn's one loop per iteration: FOR_ITER up to the jump back to it."""
    ops = _instructions(fn)
    return ops.index("JUMP_BACKWARD") - ops.index("FOR_ITER") + 1


def test_the_clock_weighs_instructions_and_calls_at_the_reference_hosts_cost(counter):
    counter.resume()
    t0, c0 = counter.now_ps(), counter.counts()
    loop(500)
    t1, c1 = counter.now_ps(), counter.counts()
    counter.pause()
    instructions, calls, sites = (c1[i] - c0[i] for i in range(3))
    assert sites > 0 and instructions > sites
    assert t1 - t0 == ((instructions - sites) * PYTHON_WORK.instruction_ps + sites * PYTHON_WORK.call_site_ps
                       + calls * PYTHON_WORK.call_ps)


def test_call_sites_are_the_instructions_that_call(counter):
    def calls_three(x):
        a = len(x)
        b = abs(a)
        return str(b)

    counter.resume()
    before = counter.counts()
    calls_three([1])
    after = counter.counts()
    counter.pause()
    # this function's three calls, the one that called it here, and the read of `after` (a line's
    # instructions count at its line event, before they run)
    assert after[2] - before[2] == 3 + 1 + 1


def test_nothing_counts_while_paused(counter):
    counter.resume()
    counter.pause()
    before = counter.counts()
    loop(1000)
    assert counter.counts() == before


def test_phantoras_own_code_never_counts(counter):
    from phantora.cost.host import op_cxx_ns  # pure Python in a phantora file: nothing it calls is counted

    def call_phantora(n):
        for _ in range(n):
            op_cxx_ns(0, True)

    one, calls_one = counted(counter, call_phantora, 1)
    many, calls_many = counted(counter, call_phantora, 1001)
    # this file's loop and call count; op_cxx_ns' body (a few lines) does not
    assert (many - one) / 1000 == _loop_body(call_phantora)
    assert calls_many == calls_one  # nor does entering its frame


def test_each_thread_has_its_own_count(counter):
    got = {}

    def other():
        got["other"] = counted(counter, loop, 1000)

    t = threading.Thread(target=other)
    counter.resume()
    before = counter.counts()
    t.start()
    t.join()
    after = counter.counts()
    counter.pause()
    assert got["other"][0] > 7000
    assert after[0] - before[0] < 2000  # threading's start() and join() only, not the other thread's loop
