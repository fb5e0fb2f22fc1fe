"""How long a thread that wakes up waits for the GIL: the cost thread workers pay when the
training loop (or the loading itself) keeps the interpreter busy.

A thread that sleeps gives the GIL up and needs it back to go on. While another thread runs
Python without pause, it gets it back only when that thread is made to drop it, after the
interpreter's switch interval (``sys.getswitchinterval()``, 5 ms by default). A sentinel
thread that wakes every :data:`GIL_PERIOD_S` and times how late it got going, less the time it
spent queued for a core (schedstat's run delay, where Linux has it), measures that wait.
Its mean, as a share of the switch interval, reads near 0 when the GIL is mostly free and near
1 when some thread holds it all the time. Thread workers pay that wait at every return from a
sleep, a read or a GIL-free numpy or torch call.

It reads a loop that launches many small torch ops as free, though: each op gives the GIL up,
and the sentinel gets it then; a thread worker gets it too, and the op after waits for it. So
each reading also carries the share of the loop's own time that the thread which started the
meter (the training loop's) spent on a CPU, and the cores the process's other threads kept
busy meanwhile (torch's intra-op threads, in a step that computes on the CPU). The caller says
which time and CPU were not the loop's own: stoker's ``next()`` (receiving a batch, or waiting
for one, is not the training step) is left out of both.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from typing import NamedTuple

from stoker._introspect.platform import thread_sched_seconds

__all__ = [
    "GIL_PERIOD_S",
    "MIN_STEP_S",
    "READING_WAKEUPS",
    "GilMeter",
    "InsideNext",
    "StepFigures",
]

# Seconds between the sentinel's wake-ups (each costs a few microseconds of the GIL).
GIL_PERIOD_S = 0.01
# Wake-ups per reading (0.2 s at the default period).
READING_WAKEUPS = 20
# The loop's own time (outside next()) the step's figures need.
MIN_STEP_S = 0.01


class InsideNext:
    """The wall and CPU seconds the training loop's thread spent inside stoker's ``next()``,
    counted as they go: a reading that ends while the loop waits there must not take that
    wait for the loop's own time (the next reading would then find less than none).

    The loop's thread calls :meth:`enter` and :meth:`leave`; the meter's thread reads
    :meth:`wall` and :meth:`cpu`. The state is one tuple, replaced whole, so a reader sees
    a call either entered or left, never half of each.
    """

    def __init__(self) -> None:
        # (wall seconds, CPU seconds, (wall, CPU clock) at the entry of the call under way)
        self._state: tuple[float, float, tuple[float, float] | None] = (0.0, 0.0, None)

    def enter(self) -> None:
        wall, cpu, _ = self._state
        self._state = (wall, cpu, (time.perf_counter(), time.thread_time()))

    def leave(self) -> None:
        wall, cpu, entered = self._state
        if entered is not None:
            wall += time.perf_counter() - entered[0]
            cpu += time.thread_time() - entered[1]
        self._state = (wall, cpu, None)

    def wall(self) -> float:
        """Wall seconds inside ``next()`` so far, the call under way included."""
        wall, _, entered = self._state
        return wall + (time.perf_counter() - entered[0] if entered is not None else 0.0)

    def cpu(self, spent: float) -> float:
        """CPU seconds inside ``next()`` so far, where ``spent`` is the loop thread's CPU clock
        now (read by the caller from another thread)."""
        _, cpu, entered = self._state
        return cpu + (max(0.0, spent - entered[1]) if entered is not None else 0.0)


class StepFigures(NamedTuple):
    """The training loop's own time (outside ``next()``) over some readings.

    Attributes:
        busy: the share of it the loop's thread spent on a CPU.
        cores: the cores the process's other threads (torch's intra-op threads) kept busy in it.
        share: its share of the wall time (low: the loop mostly waited for data, or does next
            to nothing between batches).
    """

    busy: float
    cores: float
    share: float


class GilMeter:
    """A sentinel thread measuring the wait for the GIL after a wake-up (see the module
    docstring), one reading per :data:`READING_WAKEUPS` wake-ups. Start it with
    :meth:`start`, read it with :meth:`readings`, end it with :meth:`close`; :meth:`disturb`
    leaves out the readings a known disturbance (starting a process) touched."""

    def __init__(
        self,
        period_s: float | None = None,
        wakeups: int | None = None,
        own_cpu: Callable[[float], float] | None = None,
        own_wall: Callable[[], float] | None = None,
    ) -> None:
        """``own_cpu(spent)``: CPU seconds the loop's thread spent so far in work that is not
        the loop's own, given its CPU clock now; ``own_wall()``: wall seconds it spent there
        (both are left out of the readings' CPU shares: a loop starved of data waits in
        ``next()``, and its step's share of a CPU must not read low for that)."""
        self._own_cpu = own_cpu
        self._own_wall = own_wall
        self.period_s = GIL_PERIOD_S if period_s is None else period_s
        self.wakeups = READING_WAKEUPS if wakeups is None else wakeups
        self._lock = threading.Lock()
        self._waited = 0.0
        self._count = 0
        self._skip = 0  # readings still to leave out
        # (end, GIL share, loop thread's CPU share of the wall time, the loop's own wall
        # seconds, its thread's CPU seconds in them, the process's other threads' CPU seconds,
        # wall seconds)
        self._readings: list[tuple[float, float, float | None, float, float, float, float]] = []
        self._loop_clock: int | None = None  # the CPU clock of the thread that started it
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._rebase = False  # forget(): the reading under way starts again

    def start(self) -> None:
        """Start the sentinel; the calling thread is the loop whose CPU share is read."""
        if self._thread is None:
            try:
                self._loop_clock = time.pthread_getcpuclockid(threading.get_ident())
            except (AttributeError, OSError):  # not on this platform
                self._loop_clock = None
            self._thread = threading.Thread(target=self._run, name="stoker-gil-meter", daemon=True)
            self._thread.start()

    def _clocks(self) -> tuple[float, float, float, float, float] | None:
        """(wall seconds, the loop's own wall seconds, its thread's CPU in them, the loop
        thread's whole CPU, the process's CPU), so far; None where the loop's CPU clock cannot
        be read."""
        if self._loop_clock is None:
            return None
        try:
            spent = time.clock_gettime(self._loop_clock)
        except OSError:  # the loop's thread ended
            return None
        own = self._own_cpu(spent) if self._own_cpu is not None else 0.0
        now = time.perf_counter()
        wall = now - (self._own_wall() if self._own_wall is not None else 0.0)
        return now, wall, spent - own, spent, time.process_time()

    @staticmethod
    def _shares(
        before: tuple[float, ...] | None, after: tuple[float, ...] | None, mine: float
    ) -> tuple[float | None, float, float, float]:
        """Between two :meth:`_clocks`: the loop thread's CPU share of the wall time (None
        where not measured), then the loop's own wall seconds, its thread's CPU seconds in
        them, and the CPU seconds the process's other threads (less ``mine``, this
        sentinel's) spent."""
        if before is None or after is None or after[0] <= before[0]:
            return None, 0.0, 0.0, 0.0
        cpu = max(0.0, after[2] - before[2])
        share = min(1.0, cpu / (after[0] - before[0]))
        own = max(0.0, after[1] - before[1])
        others = max(0.0, (after[4] - before[4]) - (after[3] - before[3]) - mine)
        return share, own, cpu, others

    def _run(self) -> None:
        stop, period = self._stop, self.period_s
        sched = thread_sched_seconds()
        clocks0, mine0 = self._clocks(), time.thread_time()
        while True:
            t0 = time.perf_counter()
            if stop.wait(period):
                return
            now = time.perf_counter()
            late = now - t0 - period
            queued = 0.0
            sched_now = thread_sched_seconds()
            if sched_now is not None and sched is not None:
                queued = sched_now[1] - sched[1]
            sched = sched_now
            with self._lock:
                self._waited += max(0.0, late - queued)
                self._count += 1
                if self._count < self.wakeups:
                    continue
                share = min(1.0, self._waited / self._count / sys.getswitchinterval())
                self._waited, self._count = 0.0, 0
                clocks1, mine1 = self._clocks(), time.thread_time()
                cpu, own, own_cpu, others = self._shares(clocks0, clocks1, mine1 - mine0)
                wall = (
                    clocks1[0] - clocks0[0] if clocks0 is not None and clocks1 is not None else 0.0
                )
                clocks0, mine0 = clocks1, mine1
                if self._rebase:
                    self._rebase = False
                elif self._skip:
                    self._skip -= 1
                else:
                    self._readings.append((now, share, cpu, own, own_cpu, others, wall))

    def disturb(self, since: float) -> None:
        """Something that holds the GIL happened after ``since`` (a ``time.perf_counter()``
        value) and may go on a while: the readings that ended after it, the one under way and
        the next are left out."""
        with self._lock:
            self._readings = [r for r in self._readings if r[0] <= since]
            self._waited, self._count = 0.0, 0
            self._skip = 1

    def forget(self) -> None:
        """Leave out every reading so far and the one under way (what the loop did before
        now, its start-up for instance, does not show how it runs)."""
        with self._lock:
            self._readings = []
            self._waited, self._count = 0.0, 0
            self._rebase = True

    def readings(self) -> list[float]:
        """The readings so far, oldest first: mean wait for the GIL per wake-up, as a share of
        the switch interval (0 to 1)."""
        with self._lock:
            return [r[1] for r in self._readings]

    def loop_cpu(self) -> list[float]:
        """The same readings' share of wall time the loop's thread spent on a CPU outside
        ``next()`` (0 to 1), oldest first; empty where that thread's CPU clock cannot be
        read."""
        with self._lock:
            shares = [r[2] for r in self._readings]
        return [c for c in shares if c is not None] if None not in shares else []

    def step(self, last: int) -> StepFigures | None:
        """Over the ``last`` readings: the share of the loop's own time (outside ``next()``)
        its thread spent on a CPU, the cores the process's other threads kept busy in it (a
        step computing on torch's intra-op threads reads about their count less one), and
        that time's share of the wall time. Summed over the readings, not a median of each: a
        reading taken while the loop mostly waited for data holds little of its time. None
        where the loop's own time was under :data:`MIN_STEP_S` or its clock cannot be read."""
        with self._lock:
            kept = self._readings[-last:] if last > 0 else []
        if not kept or any(r[2] is None for r in kept):
            return None
        own = sum(r[3] for r in kept)
        if own < MIN_STEP_S:
            return None
        wall = sum(r[6] for r in kept)
        return StepFigures(
            min(1.0, sum(r[4] for r in kept) / own),
            sum(r[5] for r in kept) / own,
            min(1.0, own / wall) if wall > 0 else 1.0,
        )

    def wall(self, last: int) -> float:
        """Wall seconds the ``last`` readings cover."""
        with self._lock:
            kept = self._readings[-last:] if last > 0 else []
        return sum(r[6] for r in kept)

    def close(self) -> None:
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=1.0)
