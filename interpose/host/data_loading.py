"""DataLoader workers' time: batches arrive when the workers could have made them.

With `num_workers=0` the batches are made in the training loop's own thread, and their CPU time
counts like any other Python of the program (host_time.py). With workers, the loop blocks on a
queue while worker processes make batches; a blocked thread uses no CPU, so without this module
loading would be free however slow it is.

Each worker process measures the time of its main thread from one batch it hands over to the
next (the fetch, the collate, the hand-over itself): its Python counted at the reference host's
cost (--host-time counted, python_work.py), or its CPU time (measured; the first batch then also
holds the worker's start-up), and appends `idx ns` to a file of its own, before the batch enters the queue. When
the training loop takes a batch (`_MultiProcessingDataLoaderIter._process_data`), the next line of
that worker's file is what the batch cost, and the simulator is told (R_LOADER_BATCH): it keeps
each worker's timeline, as DataLoader runs them (a worker makes its batches in order, a batch's
index is sent when the loop took the batch `prefetch_factor * num_workers` before it, or when the
iterator started), and the host waits when the batch is not ready (engine/data_loading.py).

With `pin_memory=True` a thread of the training process pins each batch before the loop can take
it. It runs beside the loop, so its work is not the host timeline's: its ops (rebuilding a batch's
tensors from the workers' shared memory, pinning them) go with OP_BESIDE, and once it hands batch
idx over, R_PIN_BATCH tells the simulator the Python of `pin_memory(batch)`; the simulator adds
the ops' host cost since the last batch and keeps the thread's own timeline (one batch after
another). The thread's other Python, its wait on the workers' queue, polls on this machine's
timing and is left out.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

from interpose.host.host_time import ENV as HOST_TIME_ENV
from interpose.host.python_events import beside
from phantora import protocol as P
from phantora.cost.host import DEFAULT_HOST_TIME

_thread_ns = time.thread_time_ns


def _loader_dir(main_pid: int) -> Path:
    return Path(tempfile.gettempdir()) / f"phantora-loader-{main_pid}"


class _TimedQueue:
    """A worker's data queue: notes each batch's CPU time before handing the batch over."""

    def __init__(self, queue: Any, path: Path, clock: Callable[[], int], mark: int) -> None:
        self._queue = queue
        self._file = open(path, "a", buffering=1)  # noqa: SIM115 - one line per batch, for the worker's life
        self._clock = clock
        self._mark = mark

    def put(self, item: Any, *args: Any, **kwargs: Any) -> Any:
        from torch.utils.data._utils.worker import _IterableDatasetStopIteration

        now = self._clock()
        if (isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], int)
                and not isinstance(item[1], _IterableDatasetStopIteration)):
            self._file.write(f"{item[0]} {now - self._mark}\n")
            self._mark = now
        return self._queue.put(item, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._queue, name)


def time_worker_batches(args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """In a DataLoader worker, before its loop starts: its data queue, timed."""
    directory = _loader_dir(os.getppid())
    try:
        directory.mkdir(exist_ok=True)
    except OSError:
        return args, kwargs  # no temporary directory: the batches are not timed
    path = directory / str(os.getpid())
    clock, mark = _worker_clock()
    if "data_queue" in kwargs:
        kwargs = {**kwargs, "data_queue": _TimedQueue(kwargs["data_queue"], path, clock, mark)}
    elif len(args) > 3:
        args = (*args[:3], _TimedQueue(args[3], path, clock, mark), *args[4:])
    return args, kwargs


def _worker_clock() -> tuple[Callable[[], int], int]:
    """How a worker times its batches, in ns on the reference host (counted) or here (measured),
    and the reading its first batch starts from."""
    if os.environ.get(HOST_TIME_ENV, DEFAULT_HOST_TIME) == "counted":
        from interpose.host import python_work

        counter = python_work.load()
        counter.resume()  # the worker's own thread: its fetches and collates count from here

        def counted_ns() -> int:
            return counter.now_ps() // 1000

        return counted_ns, counted_ns()
    return _thread_ns, 0  # a new process's thread CPU clock starts at 0: the first batch holds the start-up


class _WorkerTimes:
    """The training loop's reader of one worker's file."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.pending: list[int] = []

    def next_cpu_ns(self) -> int | None:
        if not self.pending:
            try:
                with open(self.path) as f:
                    f.seek(self.offset)
                    text = f.read()
            except OSError:
                return None
            complete = text[: text.rfind("\n") + 1]
            self.offset += len(complete)
            self.pending = [int(line.split()[1]) for line in complete.splitlines() if line.strip()]
        return self.pending.pop(0) if self.pending else None


def install_loader_timing(rt: Any) -> None:
    """In the training process: tell the simulator when an iterator starts and what each batch
    it yields cost its worker."""
    from torch.utils.data import dataloader as dl

    it_cls = dl._MultiProcessingDataLoaderIter
    directory = _loader_dir(os.getpid())
    atexit.register(shutil.rmtree, directory, True)
    original_reset, original_process = it_cls._reset, it_cls._process_data
    next_id = [0]

    def _reset(self: Any, loader: Any, first_iter: bool = False) -> None:
        if first_iter:  # before the first indices go out: the pin-memory thread may hand a batch over at once
            next_id[0] += 1
            self._phantora_id = next_id[0]
            self._phantora_times = {}
            if self._pin_memory:
                _note_pinned_batches(rt, self._data_queue, self._phantora_id)
        original_reset(self, loader, first_iter)
        if not (rt.active and rt.client.connected):
            return  # the simulator starts the iterator at its first batch
        rt.client.record([P.R_LOADER_START, self._phantora_id, self._num_workers,
                          self._prefetch_factor * self._num_workers])

    def _process_data(self: Any, data: Any, worker_idx: int) -> Any:
        times = getattr(self, "_phantora_times", None)
        if times is not None and rt.active and rt.client.connected:
            reader = times.get(worker_idx)
            if reader is None:
                reader = times[worker_idx] = _WorkerTimes(directory / str(self._workers[worker_idx].pid))
            cpu = reader.next_cpu_ns()
            if cpu is not None:
                rt.client.record([P.R_LOADER_BATCH, self._phantora_id, worker_idx, cpu])
        return original_process(self, data, worker_idx)

    it_cls._reset = _reset
    it_cls._process_data = _process_data
    _time_pinning(rt)


def _time_pinning(rt: Any) -> None:
    """The pin-memory thread runs beside the loop: all its ops are flagged (rebuilding the
    workers' tensors from shared memory as much as pinning them), and the Python of each
    `pin_memory(batch)` is taken apart (host_time.PythonTime.take_beside) for the batch's R_PIN_BATCH."""
    from torch.utils.data._utils import pin_memory as pin_module

    original_loop, original_pin = pin_module._pin_memory_loop, pin_module.pin_memory

    def _pin_memory_loop(*args: Any, **kwargs: Any) -> None:
        beside.active = True  # this thread's, for its life
        return original_loop(*args, **kwargs)

    def pin_memory(data: Any, device: Any = None) -> Any:
        # the module's own recursion over a batch's fields calls this again: only the outer call
        if not beside.active or beside.depth or not (rt.active and rt.client.connected):
            return original_pin(data, device)
        pt = rt.python_time
        with pt.own_work:
            pt.take_beside()  # the thread's wait on the workers' queue polls on this machine's timing: not counted
        beside.depth = 1
        try:
            return original_pin(data, device)
        finally:
            beside.depth = 0
            with pt.own_work:
                beside.python_ns = pt.take_beside()

    pin_module._pin_memory_loop = _pin_memory_loop
    pin_module.pin_memory = pin_memory


def _note_pinned_batches(rt: Any, data_queue: Any, loader: int) -> None:
    """The pin-memory thread puts (idx, pinned batch) on the iterator's data queue: tell the
    simulator there, with the Python of the pin that made it."""
    put = data_queue.put

    def put_pinned(item: Any, *args: Any, **kwargs: Any) -> Any:
        ns = beside.python_ns
        if ns is not None and isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], int):
            beside.python_ns = None
            if rt.active and rt.client.connected:
                with rt.lock:
                    rt.client.record([P.R_PIN_BATCH, loader, item[0], ns])
        return put(item, *args, **kwargs)

    data_queue.put = put_pinned
