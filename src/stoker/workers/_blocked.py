"""How much of a worker's loading is spent blocked (storage, a network) rather than computing."""

from __future__ import annotations

import time

from stoker._introspect.platform import thread_sched_seconds

__all__ = ["BLOCKED_SAMPLE_S", "BLOCKED_SPAN_S", "BlockedSampler"]

# Spans of at least BLOCKED_SPAN_S of a worker's batches, one starting at most every
# BLOCKED_SAMPLE_S after the last ended, are timed against the thread's scheduler statistics
# (two small /proc reads a span), to tell the num_workers="auto" controller how much of
# loading is spent blocked (sleeping on storage, a network) rather than computing.
BLOCKED_SPAN_S = 0.05
BLOCKED_SAMPLE_S = 0.05


class BlockedSampler:
    """Measures now and then, over a span of consecutive batches, how long a worker ran on a
    core and how long it was blocked (sleeping on storage, a network) while it worked.

    Blocked is the span's wall time less the time the worker waited for tasks, its time on a
    core (the thread's CPU clock) and its time queued for a core (schedstat's run delay), so a
    worker that only waits for a share of the CPU (an oversubscribed pool) is not blocked. The
    kernel credits a run delay late, when the thread next gets a core or later, so one
    sub-millisecond fetch of a preempted worker reads as blocked; over a span of
    :data:`BLOCKED_SPAN_S`, delays credited late and early even out
    (``tests/workers/test_blocked.py`` checks both readings).

    Args:
        gate: shared by the samplers of one thread pool: the earliest time any of them may
            open its next span, so that the pool's threads take turns (each read of the
            scheduler statistics gives the GIL up and waits to get it back).
    """

    def __init__(self, gate: list[float] | None = None) -> None:
        self._gate = gate
        self._next = 0.0
        self._works = True
        self._span: tuple[float, float, float] | None = None  # wall, CPU, queued at its start
        self._idle = 0.0  # seconds the span spent waiting for tasks

    def waited(self, seconds: float) -> None:
        """The worker waited ``seconds`` for a task (not working: left out of the span)."""
        if self._span is not None:
            self._idle += seconds

    def begin(self) -> None:
        """A batch's work starts: opens a span when one is due."""
        if self._span is not None or not self._works:
            return
        now, gate = time.perf_counter(), self._gate
        if now < self._next or (gate is not None and now < gate[0]):
            return
        sched = thread_sched_seconds()
        if sched is None:
            self._works = False  # not Linux, or no schedstat: never again
            return
        if gate is not None:
            gate[0] = now + BLOCKED_SPAN_S + BLOCKED_SAMPLE_S
        self._span = (time.perf_counter(), time.thread_time(), sched[1])
        self._idle = 0.0

    def end(self) -> tuple[float, float] | None:
        """A batch's work ended: ``(running, blocked)`` seconds when this closes a span."""
        span = self._span
        if span is None or time.perf_counter() - span[0] < BLOCKED_SPAN_S:
            return None
        self._span = None
        sched = thread_sched_seconds()
        if sched is None:
            return None
        running = time.thread_time() - span[1]
        now = time.perf_counter()
        self._next = now + BLOCKED_SAMPLE_S
        working = now - span[0] - self._idle
        return running, max(0.0, working - running - (sched[1] - span[2]))
