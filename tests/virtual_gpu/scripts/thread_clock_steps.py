"""Threads and the simulated clock, run under `phantora trace` (prints `ok <check>` per passed check).

A background thread that loops `time.sleep(0.1)` and reads the clock (what a progress bar's refresh
thread does) must not slow the simulated training steps, must not spin, and must read the same
simulated clock as the training loop; a module that bound `time.perf_counter` by value before torch
was imported (`from time import ...`, as tqdm does) reads the simulated clock too; a daemon thread
asleep for an hour does not keep the run from ending.

datetime.now() is the one clock phantora leaves real, so it measures wall time here.
"""

import datetime
import threading
from time import perf_counter as captured_perf_counter  # bound before phantora's clock exists

import time

import torch
import torch.nn as nn

STEPS = 10
SLEEP_IN_LOOP = 2.0  # a simulated pause of the training loop itself

model = nn.Sequential(nn.Linear(512, 2048), nn.GELU(), nn.Linear(2048, 512)).cuda()
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
x = torch.randn(64, 512, device="cuda")


def steps() -> tuple[list[float], float]:
    """Simulated step times (perf_counter around synchronized steps) and the wall time taken."""
    wall0 = datetime.datetime.now()
    times = []
    for _ in range(STEPS):
        t0 = time.perf_counter()
        model(x).square().mean().backward()
        opt.step()
        opt.zero_grad()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return times, (datetime.datetime.now() - wall0).total_seconds()


class Refresher(threading.Thread):
    """A progress bar's refresh thread: wakes every 0.1 s, reads the clock, redraws."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.stop = threading.Event()
        self.reads: list[float] = []

    def run(self) -> None:
        while not self.stop.is_set():
            self.reads.append(time.time())
            time.sleep(0.1)


steps()  # warm-up: the first step allocates the optimizer state and cuBLAS's workspace
alone, wall_alone = steps()

time.sleep(SLEEP_IN_LOOP)  # moves the simulated clock 2 s ahead of the real one
refresher = Refresher()
sim_before = time.time()
refresher.start()
datetime_start = datetime.datetime.now()
while len(refresher.reads) < 2 and (datetime.datetime.now() - datetime_start).total_seconds() < 10:
    threading.Event().wait(0.01)  # let it read the clock at least twice
with_thread, wall_with_thread = steps()
sim_after = time.time()
refresher.stop.set()
refresher.join()

print("step times alone      ", " ".join(f"{t * 1e3:.6f}" for t in alone), "ms")
print("step times with thread", " ".join(f"{t * 1e3:.6f}" for t in with_thread), "ms")
# equal up to float rounding: perf_counter is (real base + simulated ns) / 1e9
assert all(abs(a - b) < 1e-8 for a, b in zip(alone, with_thread)), "a background thread's sleep changed the step times"
print("ok other_threads_sleep_does_not_move_the_clock")

print(f"wall alone {wall_alone:.3f} s, with thread {wall_with_thread:.3f} s, refreshes {len(refresher.reads)}")
assert wall_with_thread < 3 * wall_alone + 1.0, (wall_alone, wall_with_thread)
# a thread that sleeps for real wakes about 10 times a second, never thousands of times
assert len(refresher.reads) <= 10 * (wall_with_thread + 10) + 5, len(refresher.reads)
print("ok other_threads_sleep_for_real")

assert len(refresher.reads) >= 2
assert all(sim_before - 1e-3 <= t <= sim_after + 1e-3 for t in refresher.reads), (sim_before, refresher.reads, sim_after)
print("ok other_threads_read_the_simulated_clock")

p0, c0 = time.perf_counter(), captured_perf_counter()
time.sleep(SLEEP_IN_LOOP)  # after backward() ran on the autograd engine's threads: still this thread's clock
steps()
p1, c1 = time.perf_counter(), captured_perf_counter()
assert abs((c1 - c0) - (p1 - p0)) < 1e-3 and p1 - p0 >= SLEEP_IN_LOOP, (c1 - c0, p1 - p0)
print("ok clock_bound_before_torch_import_is_simulated")

try:
    import tqdm
except ImportError:
    print("tqdm is not installed")
else:
    import io

    t0 = time.time()
    bar = tqdm.tqdm(total=STEPS, file=io.StringIO(), mininterval=0)
    time.sleep(SLEEP_IN_LOOP)
    for _ in range(STEPS):
        steps()
        bar.update(1)
    elapsed_bar = bar.format_dict["elapsed"]
    elapsed = time.time() - t0
    bar.close()
    assert elapsed >= SLEEP_IN_LOOP and abs(elapsed_bar - elapsed) < 1e-3, (elapsed_bar, elapsed)
    print("ok tqdm_elapsed_is_simulated")

# The training loop in a worker thread while the main thread polls with time.sleep: once the worker
# has launched GPU work its timeline is the host clock and the main thread's polls are real.
worker_times: list[float] = []


def train_in_worker() -> None:
    torch.zeros(1, device="cuda")  # the hand-over: the main thread's polls before this moved the clock
    worker_times.extend(steps()[0])


worker = threading.Thread(target=train_in_worker)
worker.start()
polls = 0
while worker.is_alive():
    time.sleep(0.01)
    polls += 1
assert len(worker_times) == STEPS and all(abs(a - b) < 1e-8 for a, b in zip(alone, worker_times)), worker_times
print(f"worker step times match, {polls} polls")
p0 = time.perf_counter()
time.sleep(SLEEP_IN_LOOP)  # the worker ended: the main thread's sleeps move the clock again
assert time.perf_counter() - p0 >= SLEEP_IN_LOOP
print("ok training_thread_drives_the_clock")

sleeper = threading.Thread(target=time.sleep, args=(3600,), daemon=True)
sleeper.start()  # a watchdog that sleeps for an hour must not keep the run alive
print("ok daemon_sleeper_started")
