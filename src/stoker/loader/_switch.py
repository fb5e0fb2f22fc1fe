"""Processes first, threads once the training loop leaves the GIL free.

When the backend probe finds that loading mostly waits (storage, a network, a few slow
samples), threads cover the waits without a process each: less memory, no copies of the
dataset. But a thread worker needs the GIL back after every wait and every GIL-free numpy or
torch call, and a training loop that runs Python holds it: measured on the bench's ``io``
with a 14 ms pure-Python step per batch, auto-sized thread workers delivered 1,384
samples/s against 2,067 for auto-sized processes (0.67x); on ``heavytail``, 945 against
1,466 (``benchmarks/gil_step.py``). Processes are never worse at covering waits, only
heavier. So a ``num_workers="auto"`` loader whose probe chose threads for waits starts
process workers and measures, with a :class:`~stoker.autotune._gil.GilMeter`, how long a
thread of the
main process waits for the GIL while the loop runs (readings taken while workers were started
or retired, and the next, are left out: starting a process holds the GIL). Once
:data:`HANDOVER_READINGS` readings were taken, a median share of the switch interval under
:data:`GIL_FREE` hands the loading over to threads, mid-epoch: dispatch pauses, the tasks no
process has taken yet are taken back, the processes give up the batches they are loading at
their next sample, the processes stop and threads take over the tasks taken back and the rest
of the epoch (dispatch is by batch index, so what is delivered does not change; the batches
the processes finished are delivered from their slots). A
busier loop keeps the processes. Until it is decided, the process pool stays as it started:
:data:`WATCH_WORKERS_PER_CORE` per usable core (fewer if the loader was told to start with
fewer): a change would hold up the decision, and processes started for it would be stopped
a second later.

The other way round (threads to processes) is never done: threads load in the main
process, and a dataset that opened a file or a database lazily there would hand the open
handle to forked workers.
"""

from __future__ import annotations

import statistics
import time
import weakref
from typing import Any

from stoker._introspect.platform import usable_cores
from stoker.autotune._gil import GilMeter
from stoker.autotune._scaling import AutoScaler
from stoker.loader._dispatch import TaskBook, batch_task
from stoker.workers._threads import ThreadPool

__all__ = [
    "GIL_FREE",
    "HANDOVER_READINGS",
    "WATCH_WORKERS_PER_CORE",
    "HandoverMixin",
    "watch_workers",
]

# Readings (of autotune._gil.READING_WAKEUPS wake-ups each, 0.2 s) the decision waits for, and
# the median GIL wait (a share of the switch interval) under which the loop is taken to leave
# the GIL free.
# Measured with process workers on the bench's io: a trivial loop reads 0.02-0.04; a loop
# running 2 ms of Python per 16 ms batch 0.15-0.26, 5 ms 0.29-0.49, 14 ms 1.0.
HANDOVER_READINGS = 5
GIL_FREE = 0.1
# Threads started per process worker handed over (at least; see HandoverMixin._hand_over).
HANDOVER_THREADS_PER_PROCESS = 2
# Process workers per usable core the pool may grow to while the handover is undecided: more
# would be started only to be stopped a second later, and their memory is the peak's.
WATCH_WORKERS_PER_CORE = 2


def watch_workers(workers: int) -> int:
    """Process workers to start for the watch: ``workers`` up to its cap.

    Started at the cap, the pool does not grow during the watch, and no reading is lost to a
    worker starting (a pool grown from 2 to 4 on the bench's heavytail decided 0.5 s later).
    """
    return max(1, min(workers, WATCH_WORKERS_PER_CORE * usable_cores()))


class HandoverMixin:
    """The process-to-thread handover of :class:`stoker.loader._iterator.MultiWorkerIterator`."""

    _pool: Any
    _scaler: AutoScaler | None
    _backend: str
    _notes: list[str]
    _started: float
    _prefetch: int
    _workers: Any
    _ready: set[int]
    _payload: tuple[Any, ...]
    _epoch: int
    _epoch_seed: int
    _book: TaskBook[Any]

    def _watching(self, loader: Any) -> bool:
        """Whether this iterator starts processes to hand over to threads later."""
        return (
            getattr(loader, "_threads_wanted", False)
            and self._scaler is not None
            and self._backend == "process"
        )

    def _watch_for_handover(self, loader: Any) -> None:
        """Start measuring the GIL when the loader wants threads but started processes."""
        self._handover: str | None = None  # None, "watch" or "drain"
        self._handback: dict[int, tuple[Any, ...]] = {}  # batch index -> task, for threads
        self._gil: GilMeter | None = None
        self._gil_readings: list[float] = []
        # Weakly: the loader holds its persistent iterator, and a cycle would leave the workers
        # running after `del loader` until a garbage collection.
        self._handover_loader = weakref.ref(loader)
        if self._watching(loader):
            assert self._scaler is not None
            self._handover = "watch"
            self._gil = GilMeter()
            self._gil.start()
            # The pool stays as started until it is decided: a worker started or retired
            # holds up the decision (its readings are left out), and a process pool that
            # shrank on saturated cores handed fewer processes over (threads then took
            # seconds to grow back).
            controller, running = self._scaler.controller, len(self._pool.active)
            self._unpinned = (controller.min_workers, controller.max_workers)
            controller.min_workers = controller.max_workers = running

    def _watch_gil(self, changed_since: float | None) -> None:
        """Decide once enough GIL readings were taken.

        Args:
            changed_since: a ``time.perf_counter()`` value after which workers were started or
                retired (starting a process holds the GIL for milliseconds): the readings that
                touched it do not show the training loop. None: nothing changed.
        """
        if self._handover != "watch" or self._gil is None:
            return
        if changed_since is not None:
            self._gil.disturb(changed_since)
        readings = self._gil.readings()
        if len(readings) < HANDOVER_READINGS:
            return
        self._gil_readings = readings[-HANDOVER_READINGS:]
        median = statistics.median(self._gil_readings)
        self._stop_gil_meter()
        loader = self._handover_loader()
        if loader is not None:  # decided for this loader: later iterators follow
            loader._threads_wanted = False
            if median < GIL_FREE:
                loader._resolved_backend = "thread"
        stamp = f"{time.monotonic() - self._started:.1f}s"
        if median < GIL_FREE:
            self._handover = "drain"
            # Take back what no process started, and have them give up what they load now
            # (waiting for those batches held the threads back 0.4 s on the bench's heavytail).
            self._handback = {m[2]: m for m in self._pool.drain_tasks()}
            self._pool.status.give_up_all()
            self._notes.append(
                f"{stamp}: the training loop leaves the GIL free (a waking thread waited "
                f"{median:.0%} of the switch interval for it): handing over to threads"
            )
        else:
            self._handover = None
            if self._scaler is not None:  # processes stay: they may grow as they need
                controller = self._scaler.controller
                controller.min_workers, controller.max_workers = self._unpinned
            self._notes.append(
                f"{stamp}: the training loop holds the GIL (a waking thread waited {median:.0%} "
                "of the switch interval for it): thread workers would wait for it after every "
                "wait, so processes stay"
            )

    def _take_back(self, msg: tuple[Any, ...]) -> None:
        """A process gave up a batch (``Q``) while the handover drains: threads will load it."""
        epoch, idx = msg[1], msg[2]
        index = self._book.request(idx)
        self._handback[idx] = batch_task(epoch, self._epoch_seed, idx, index)

    def _drained(self) -> bool:
        """Every batch not yet answered was taken back from the processes."""
        handback = self._handback
        return all(idx in handback for idx in self._book.pending())

    def _hand_over(self) -> None:
        """Replace the (drained) process pool with threads, mid-epoch."""
        old, scaler = self._pool, self._scaler
        self._handover = None
        if old is None or old.closed or scaler is None:
            return
        n = max(1, len(old.active) - scaler.retiring)
        old.shutdown()
        self._backend = "thread"
        self._scaler = AutoScaler.for_pool(
            "thread", n, self._prefetch, scaler.controller.tune_prefetch
        )
        # Twice as many threads as processes, or as many as the processes' blocked share calls
        # for (threads that wait for the GIL read as blocked: the processes' share is the
        # samples' own). Threads cost no process, and too few cost more than too many: on the
        # bench's heavytail, 8 to 16 threads loaded within 3% of each other, 6 threads 8% less.
        m = self._scaler.controller.take_over(
            scaler.controller, at_least=HANDOVER_THREADS_PER_PROCESS * n
        )
        capacity = self._scaler.controller.max_workers
        pool = ThreadPool(self._specs(m), self._payload, capacity=capacity)  # type: ignore[attr-defined]
        pool.status.set_epoch(self._epoch)
        self._pool = pool
        self._workers = pool.processes
        self._ready = set()
        catch_up = self._catch_up_message()  # type: ignore[attr-defined]
        for i in pool.active:
            pool.send_ctrl(i, catch_up)
        taken = len(self._handback)
        for idx in sorted(self._handback):
            pool.put_task(self._handback[idx])
        self._handback = {}
        self._notes.append(
            f"{time.monotonic() - self._started:.1f}s: {n} process workers -> {m} threads "
            f"({taken} batches taken back from the processes)"
        )

    def _stop_gil_meter(self) -> None:
        meter, self._gil = getattr(self, "_gil", None), None
        if meter is not None:
            meter.close()
