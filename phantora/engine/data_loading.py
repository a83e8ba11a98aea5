"""DataLoader workers on the simulated host: when each batch is ready.

torch's multi-process DataLoader sends a batch's indices to worker `i mod num_workers` (in order),
keeps `window = prefetch_factor * num_workers` batches requested ahead of the loop, and sends the
next request when the loop takes a batch. A worker makes its batches one after another. So batch k
is requested when the iterator starts (k < window) or when the loop took batch k - window, starts
when its worker is free and it was requested, and is ready its measured CPU time later
(interpose/host/data_loading.py measures it, scaled like the program's Python). The loop's host waits
for it when it is not ready yet. Workers run on cores of their own, beside the loop (a data-loading
host has enough of them).

With `pin_memory=True`, a thread of the training process pins each batch the workers made before
the loop can take it: one batch after another, beside the loop. Batch k is then ready when its
worker made it and the thread is done with the batch before, plus the pin's own host time.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field


@dataclass
class LoaderTimeline:
    start_ns: int
    workers: int
    window: int
    taken_ns: list[int] = field(default_factory=list)  # when the loop took batch k
    worker_free_ns: dict[int, int] = field(default_factory=dict)

    def ready_ns(self, worker: int, cpu_ns: int) -> int:
        """When the next batch (from `worker`) is ready; call take() once the loop has it."""
        k = len(self.taken_ns)
        requested = self.start_ns if k < self.window else self.taken_ns[k - self.window]
        begin = max(self.worker_free_ns.get(worker, self.start_ns), requested)
        ready = begin + max(0, cpu_ns)
        self.worker_free_ns[worker] = ready
        return ready

    def take(self, now_ns: int) -> None:
        self.taken_ns.append(now_ns)

    def restart(self, now_ns: int, workers: int, window: int) -> None:
        """A new epoch of the same iterator (persistent workers): requests start again now; a
        worker still busy with the last epoch's batches stays busy."""
        self.start_ns, self.workers, self.window = now_ns, workers, window
        self.taken_ns = []


@dataclass
class PinMemoryThreads:
    """The pin-memory threads of a rank's iterators: what each pin cost, and when each thread is
    free. A pin's ops arrive before its batch's R_PIN_BATCH, so the ops' host time since the last
    pinned batch is that batch's."""

    ops_ns: int = 0  # host time of ops run beside the loop since the last pinned batch
    cost_ns: dict[tuple[int, int], deque[int]] = field(default_factory=dict)  # (loader, idx): each epoch's pin, in order
    free_ns: dict[int, int] = field(default_factory=dict)  # per loader: when its thread finished the last pin

    def pinned(self, loader: int, idx: int, python_ns: int) -> None:
        """The thread pinned batch idx of `loader`, running python_ns of Python and the ops since."""
        self.cost_ns.setdefault((loader, idx), deque()).append(python_ns + self.ops_ns)
        self.ops_ns = 0

    def ready_ns(self, loader: int, idx: int, made_ns: int) -> tuple[int, int] | None:
        """(begin, end) of batch idx's pin, for a batch its worker made at made_ns; None when the
        loader pins nothing."""
        costs = self.cost_ns.get((loader, idx))
        if not costs:
            return None
        cost = costs.popleft()
        begin = max(made_ns, self.free_ns.get(loader, 0))
        self.free_ns[loader] = begin + cost
        return begin, begin + cost
