"""Processes first, threads once the training loop leaves the GIL free.

A ``num_workers="auto"`` loader whose probe chose threads to cover waits starts process
workers instead, because a training loop that runs Python holds the GIL that thread workers
need after every wait (``benchmarks/gil_step.py`` measures what threads lose). A
:class:`Handover` measures with a :class:`~stoker.autotune._gil.GilMeter` how long a thread of
the main process waits for the GIL, and what share of its time the training loop's thread
spends on a CPU outside stoker (its Python and op launches). Once :data:`HANDOVER_READINGS`
readings were taken, :func:`~stoker.autotune._backend_rule.hand_over` decides: a loop that
leaves the GIL free and launches next to nothing hands the loading over to threads mid-epoch:
dispatch pauses, the tasks no process has taken are taken back, the processes give up the
batches they load at their next sample, and :meth:`Handover.replace` returns the thread pool
that loads those and the rest of the epoch (dispatch is by batch index, so what is delivered
does not change). A busier loop keeps the processes: a launch phase of small torch ops gives
the GIL up at every op (the GIL reads free) yet waits for it behind thread workers at the
next. Threads never hand back to processes: a dataset that opened a handle lazily in the main
process would pass it to forked workers.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable, Iterable
from typing import Any, Literal, NamedTuple

from stoker._introspect.platform import usable_cores
from stoker.autotune._backend_rule import GIL_FREE, LOOP_TIME_SHARE, hand_over
from stoker.autotune._gil import MIN_STEP_S, GilMeter, InsideNext
from stoker.autotune._scaling import AutoScaler
from stoker.loader._dispatch import batch_task
from stoker.loader._settings import WorkerSettings
from stoker.workers._backend import WorkerBackend
from stoker.workers._loop import WorkerSpec
from stoker.workers._messages import BatchTask, EpochStart, GaveUp
from stoker.workers._threads import ThreadPool

__all__ = [
    "GIL_FREE",
    "HANDOVER_READINGS",
    "WATCH_WORKERS_PER_CORE",
    "Handover",
    "Replacement",
    "watch_workers",
]

# Readings (of autotune._gil.READING_WAKEUPS wake-ups each, 0.2 s) the decision waits for
# (the thresholds: autotune._backend_rule.GIL_FREE and LOOP_CPU_FREE).
HANDOVER_READINGS = 5
# ... and up to how many times as many it waits for while they cover too little time to tell a
# loop that hardly runs outside next() (one that counts its batches: threads cannot slow it)
# from one starved while the pool starts (in readings spent waiting for data, heavytail's
# GPU-like step read as idle and went to threads that ran it at 1.5 steps/s).
STEP_PATIENCE = 4
# Threads started per process worker handed over (at least; see Handover.replace).
HANDOVER_THREADS_PER_PROCESS = 2
# Process workers per usable core the pool may grow to while the handover is undecided: more
# would be started only to be stopped a second later, and their memory is the peak's.
WATCH_WORKERS_PER_CORE = 2


def watch_workers(workers: int) -> int:
    """Process workers to start for the watch: ``workers`` up to its cap.

    Started at the cap, the pool does not grow during the watch, so no reading is lost to a
    worker starting.
    """
    return max(1, min(workers, WATCH_WORKERS_PER_CORE * usable_cores()))


class Replacement(NamedTuple):
    """What :meth:`Handover.replace` hands the iterator: its new pool and controller."""

    pool: ThreadPool
    scaler: AutoScaler
    note: str


class Handover:
    """Watches the GIL for one iterator, and replaces its processes by threads when the loop
    leaves the GIL free (see the module docstring).

    Args:
        scaler: the iterator's ``num_workers="auto"`` scaler; its controller is pinned to the
            pool's size until it is decided (a worker started or retired holds the decision
            up, and a pool that shrank would hand fewer processes over).
        running: the process workers started.
        loader: the loader, held weakly (it holds its persistent iterator): the decision is
            kept there for later iterators.
        started: the iterator's ``time.monotonic()`` start, for the notes' time stamps.
    """

    def __init__(
        self,
        scaler: AutoScaler,
        running: int,
        loader: Any,
        started: float,
    ) -> None:
        self.state: Literal["watch", "drain"] | None = "watch"
        self.handback: dict[int, BatchTask] = {}  # batch index -> task, for the threads
        self.readings: list[float] = []
        # Time the loop's thread spent inside stoker's next() while watched (the iterator
        # counts it): receiving batches is not the loop's launch phase.
        self.inside = InsideNext()
        self._loop_seen = False
        self.meter: GilMeter | None = GilMeter(own_cpu=self.inside.cpu, own_wall=self.inside.wall)
        self.meter.start()
        self._loader = weakref.ref(loader)
        self._started = started
        controller = scaler.controller
        self._unpinned = (controller.min_workers, controller.max_workers)
        controller.min_workers = controller.max_workers = running

    def loop_started(self) -> None:
        """The loop got a batch: readings start from the first (the pool's start-up, forks
        and imports, is not how the loop runs)."""
        if not self._loop_seen:
            self._loop_seen = True
            if self.meter is not None:
                self.meter.forget()

    @staticmethod
    def wanted(settings: WorkerSettings, scaler: AutoScaler | None, backend: str) -> bool:
        """Whether an iterator with ``settings`` starts processes to hand over to threads
        later."""
        return settings.threads_wanted and scaler is not None and backend == "process"

    @property
    def draining(self) -> bool:
        """Decided for threads: dispatch waits until the processes hold no batch."""
        return self.state == "drain"

    def watch(
        self, changed_since: float | None, pool: WorkerBackend, scaler: AutoScaler
    ) -> str | None:
        """Decide once enough GIL readings were taken; returns the note saying what was
        decided (None: not yet).

        Args:
            changed_since: a ``time.perf_counter()`` value after which workers were started or
                retired (starting a process holds the GIL for milliseconds): the readings that
                touched it do not show the training loop. None: nothing changed.
            pool: the process pool, whose queued tasks are taken back for threads.
            scaler: the process pool's scaler, unpinned if the processes stay.
        """
        if self.state != "watch" or self.meter is None:
            return None
        if changed_since is not None:
            self.meter.disturb(changed_since)
        readings = self.meter.readings()
        if len(readings) < HANDOVER_READINGS:
            return None
        loop_cpu = self.meter.loop_cpu()
        step = self.meter.step(HANDOVER_READINGS) or self.meter.step(len(readings))
        if (
            step is None
            and loop_cpu
            and self.meter.wall(len(readings)) * LOOP_TIME_SHARE < MIN_STEP_S
            and len(readings) < STEP_PATIENCE * HANDOVER_READINGS
        ):
            return None  # too short to tell an idle loop from a starved one: wait
        self.readings = readings[-HANDOVER_READINGS:]
        loop_cpu = loop_cpu[-HANDOVER_READINGS:]
        self.stop()
        free, why = hand_over(self.readings, loop_cpu, step)
        loader = self._loader()
        if loader is not None:  # decided for this loader: later iterators follow
            loader._threads_wanted = False
            if free:
                loader._resolved_backend = "thread"
        stamp = f"{time.monotonic() - self._started:.1f}s"
        if free:
            self.state = "drain"
            # Take back what no process started; the processes give up what they load now.
            self.handback = {m.idx: m for m in pool.drain_tasks()}
            pool.status.give_up_all()
            return f"{stamp}: {why}"
        self.state = None
        controller = scaler.controller  # processes stay: they may grow as they need
        controller.min_workers, controller.max_workers = self._unpinned
        return f"{stamp}: {why}"

    def take_back(self, msg: GaveUp, request: Any, epoch_seed: int) -> None:
        """A process gave up a batch while the handover drains: threads will load it."""
        self.handback[msg.idx] = batch_task(msg.epoch, epoch_seed, msg.idx, request)

    def drained(self, pending: Iterable[int]) -> bool:
        """Every batch not yet answered (``pending``) was taken back from the processes."""
        return all(idx in self.handback for idx in pending)

    def replace(
        self,
        old: WorkerBackend,
        scaler: AutoScaler,
        prefetch: int,
        specs: Callable[[int], list[WorkerSpec]],
        payload: tuple[Any, ...],
        catch_up: EpochStart,
    ) -> Replacement:
        """Stop the (drained) process pool ``old``; returns the threads that take over, with
        the batches taken back queued.

        Args:
            old: the process pool.
            scaler: its scaler; the threads' controller takes over its measurements.
            prefetch: batches in flight per worker.
            specs: the worker specs of a pool of ``n``.
            payload: ``(dataset, collate_fn, worker_init_fn)``.
            catch_up: the epoch message every new thread gets first.
        """
        self.state = None
        n = max(1, len(old.active) - scaler.retiring)
        old.shutdown()
        new_scaler = AutoScaler.for_pool("thread", n, prefetch, scaler.controller.tune_prefetch)
        # As many threads as the processes' blocked share calls for, and at least twice as
        # many as processes: threads cost no process, and too few cost more than too many.
        m = new_scaler.controller.take_over(
            scaler.controller, at_least=HANDOVER_THREADS_PER_PROCESS * n
        )
        pool = ThreadPool(specs(m), payload, capacity=new_scaler.controller.max_workers)
        pool.status.set_epoch(catch_up.epoch)
        for i in pool.active:
            pool.send_ctrl(i, catch_up)
        taken = len(self.handback)
        for idx in sorted(self.handback):
            pool.put_task(self.handback[idx])
        self.handback = {}
        note = (
            f"{time.monotonic() - self._started:.1f}s: {n} process workers -> {m} threads "
            f"({taken} batches taken back from the processes)"
        )
        return Replacement(pool, new_scaler, note)

    def stop(self) -> None:
        """Stop the GIL meter (decided, or the iterator shuts down)."""
        meter, self.meter = self.meter, None
        if meter is not None:
            meter.close()
