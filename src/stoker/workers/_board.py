"""Batches that several worker threads load at once, a run of samples at a time.

A process worker loads a whole batch alone; threads that did the same made every batch take the
pool's whole width to arrive, and a slow sample held its batch back by the time the rest of the
batch took on a shared core (``stoker bench -w heavytail`` shows the first batch's latency).
Threads share memory, so they share batches: a thread that takes a task opens it on the
pool's :class:`Board`, and every thread loads runs of samples from the oldest open batch that
has samples left (oldest by epoch, then task index: the order the iterator delivers in). A
slow sample holds one thread while the others go on with the next samples; the thread that
finishes a batch's last run collates it and replies.

Runs are sized from the board's measured pace to take about
:data:`stoker.workers._fetch.STOP_CHECK_S` (a batch's epoch may be abandoned between two runs,
as between a process worker's): microsecond samples are claimed a batch at a time (one claim),
millisecond ones one at a time (a claim costs about a microsecond under a lock).
The pace comes from earlier samples, which may have been far quicker than the next ones: a
run still loading after :data:`RUN_LIMIT_S` ends short and gives the rest of its samples back
to the batch, to be claimed again (by any thread) a run at the new pace. Otherwise one thread
would load the rest of the batch alone, and a given-up epoch or a shutdown would wait for it.
"""

from __future__ import annotations

import bisect
import operator
import threading
from collections.abc import Callable
from typing import Any

from stoker.workers import _fetch
from stoker.workers._messages import BatchTask

__all__ = ["RUN_LIMIT_S", "Board", "OpenBatch", "run_length"]

# Weight of the newest run in the pace (seconds per sample).
_PACE_WEIGHT = 0.25
# A run still loading after this long ends short and gives its other samples back.
RUN_LIMIT_S = 10 * _fetch.STOP_CHECK_S
# Open batches are kept oldest first: by epoch, then task index.
_BY_AGE = operator.attrgetter("key")


class OpenBatch:
    """One batch being loaded by one or more threads.

    Attributes:
        task: the :class:`~stoker.workers._messages.BatchTask`.
        index: the sample indices, as a list.
        parts: each position's loaded result (``None`` until loaded).
        work: seconds each thread (by worker id) spent on this batch's runs.
        spans: sampled ``(running, blocked)`` spans the threads closed while on it.
        stop: true once the batch's epoch was abandoned.
        returned: position ranges ``(start, stop)`` given back by runs that ended short,
            claimed before the positions from ``next`` on.
    """

    __slots__ = (
        "closed",
        "index",
        "left",
        "next",
        "parts",
        "returned",
        "spans",
        "stop",
        "task",
        "work",
    )

    def __init__(self, task: BatchTask, stop: Callable[[], bool]) -> None:
        self.task = task
        self.index = list(task.index)
        self.parts: list[Any] = [None] * len(self.index)
        self.next = 0  # first position no thread has claimed
        self.left = len(self.index)  # positions not loaded yet
        self.closed = False  # replied to (finished, failed or given up)
        self.work: dict[int, float] = {}
        self.spans: list[tuple[float, float]] = []
        self.stop = stop
        self.returned: list[tuple[int, int]] = []

    @property
    def key(self) -> tuple[int, int]:
        return self.task.epoch, self.task.idx


class Board:
    """The open batches of a thread pool, claimed a run of samples at a time."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # Batches with samples no thread has claimed, oldest first (claimed from the front).
        self._open: list[OpenBatch] = []
        self.pace = 0.0  # seconds per sample, recent runs weighted most
        self.idle = 0  # threads waiting for a task (they can be woken to help)

    def open(self, task: BatchTask, stop: Callable[[], bool]) -> OpenBatch:
        """Put a task on the board; returns it (empty batches too: claiming closes them)."""
        batch = OpenBatch(task, stop)
        with self._lock:
            self._insert(batch)
        return batch

    def _insert(self, batch: OpenBatch) -> None:
        bisect.insort(self._open, batch, key=_BY_AGE)

    def waiting(self, delta: int) -> None:
        """A thread starts (+1) or stops (-1) waiting for a task."""
        with self._lock:
            self.idle += delta

    def claim(self) -> tuple[OpenBatch, int, int] | None:
        """The next run of the oldest open batch: ``(batch, start, stop)`` positions, or None
        when no batch has samples left to claim."""
        with self._lock:
            if not self._open:
                return None
            batch = self._open[0]
            size = len(batch.index)
            run = run_length(self.pace)
            if batch.returned:
                start, end = batch.returned.pop()
                stop = min(end, start + run)
                if stop < end:
                    batch.returned.append((stop, end))
            else:
                start = batch.next
                stop = batch.next = min(size, start + run)
            if batch.next >= size and not batch.returned:
                del self._open[0]
            return batch, start, stop

    def give_back(self, batch: OpenBatch, start: int, stop: int) -> None:
        """Positions ``start:stop`` of a claimed run were not loaded (the run ended short):
        they can be claimed again."""
        if start >= stop:
            return
        with self._lock:
            if batch.closed:
                return
            batch.returned.append((start, stop))
            if batch not in self._open:
                self._insert(batch)

    def finish(
        self, batch: OpenBatch, start: int, parts: list[Any], seconds: float, worker_id: int
    ) -> bool:
        """Record a loaded run; True for the one caller that must now collate and reply."""
        count = len(parts)
        with self._lock:
            batch.work[worker_id] = batch.work.get(worker_id, 0.0) + seconds
            if count:
                per = seconds / count
                self.pace = per if self.pace <= 0 else self.pace + _PACE_WEIGHT * (per - self.pace)
            if batch.closed:
                return False
            batch.parts[start : start + count] = parts
            batch.left -= count
            if batch.left > 0:
                return False
            batch.closed = True
            return True

    def close(self, batch: OpenBatch) -> bool:
        """Close a batch that failed or was given up; True for the one caller that must reply
        (its other runs are then dropped as they end)."""
        with self._lock:
            if batch.closed:
                return False
            batch.closed = True
            if batch in self._open:
                self._open.remove(batch)
            return True

    def add_span(self, batch: OpenBatch, span: tuple[float, float]) -> None:
        with self._lock:
            batch.spans.append(span)


def run_length(pace: float) -> int:
    """Samples in a run at ``pace`` seconds per sample (1 while the pace is unknown)."""
    return 1 if pace <= 0 else max(1, int(_fetch.STOP_CHECK_S / pace))
