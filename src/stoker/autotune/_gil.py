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
each reading also carries the share of its wall time that the thread which started the meter
(the training loop's) spent on a CPU, less what the caller says was its own work there
(stoker's receiving of batches is not the loop's launch phase).
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable

from stoker._introspect.platform import thread_sched_seconds

__all__ = ["GIL_PERIOD_S", "READING_WAKEUPS", "GilMeter"]

# Seconds between the sentinel's wake-ups (each costs a few microseconds of the GIL).
GIL_PERIOD_S = 0.01
# Wake-ups per reading (0.2 s at the default period).
READING_WAKEUPS = 20


class GilMeter:
    """A sentinel thread measuring the wait for the GIL after a wake-up (see the module
    docstring), one reading per :data:`READING_WAKEUPS` wake-ups. Start it with
    :meth:`start`, read it with :meth:`readings`, end it with :meth:`close`; :meth:`disturb`
    leaves out the readings a known disturbance (starting a process) touched."""

    def __init__(
        self,
        period_s: float | None = None,
        wakeups: int | None = None,
        own_cpu: Callable[[], float] | None = None,
    ) -> None:
        """``own_cpu()``: CPU seconds the loop's thread spent so far in work that is not the
        loop's own (left out of its readings' CPU share)."""
        self._own_cpu = own_cpu
        self.period_s = GIL_PERIOD_S if period_s is None else period_s
        self.wakeups = READING_WAKEUPS if wakeups is None else wakeups
        self._lock = threading.Lock()
        self._waited = 0.0
        self._count = 0
        self._skip = 0  # readings still to leave out
        self._readings: list[tuple[float, float, float | None]] = []  # (end, share, loop CPU)
        self._loop_clock: int | None = None  # the CPU clock of the thread that started it
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Start the sentinel; the calling thread is the loop whose CPU share is read."""
        if self._thread is None:
            try:
                self._loop_clock = time.pthread_getcpuclockid(threading.get_ident())
            except (AttributeError, OSError):  # not on this platform
                self._loop_clock = None
            self._thread = threading.Thread(target=self._run, name="stoker-gil-meter", daemon=True)
            self._thread.start()

    def _loop_cpu(self) -> float | None:
        if self._loop_clock is None:
            return None
        try:
            spent = time.clock_gettime(self._loop_clock)
        except OSError:  # the loop's thread ended
            return None
        return spent - self._own_cpu() if self._own_cpu is not None else spent

    def _run(self) -> None:
        stop, period = self._stop, self.period_s
        sched = thread_sched_seconds()
        began, loop0 = time.perf_counter(), self._loop_cpu()
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
                loop1 = self._loop_cpu()
                cpu = None
                if loop0 is not None and loop1 is not None and now > began:
                    cpu = min(1.0, max(0.0, (loop1 - loop0) / (now - began)))
                began, loop0 = now, loop1
                if self._skip:
                    self._skip -= 1
                else:
                    self._readings.append((now, share, cpu))

    def disturb(self, since: float) -> None:
        """Something that holds the GIL happened after ``since`` (a ``time.perf_counter()``
        value) and may go on a while: the readings that ended after it, the one under way and
        the next are left out."""
        with self._lock:
            self._readings = [r for r in self._readings if r[0] <= since]
            self._waited, self._count = 0.0, 0
            self._skip = 1

    def readings(self) -> list[float]:
        """The readings so far, oldest first: mean wait for the GIL per wake-up, as a share of
        the switch interval (0 to 1)."""
        with self._lock:
            return [share for _, share, _ in self._readings]

    def loop_cpu(self) -> list[float]:
        """The same readings' share of wall time the loop's thread spent on a CPU (0 to 1),
        oldest first; empty where that thread's CPU clock cannot be read."""
        with self._lock:
            cpus = [cpu for _, _, cpu in self._readings]
        return [c for c in cpus if c is not None] if None not in cpus else []

    def close(self) -> None:
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=1.0)
