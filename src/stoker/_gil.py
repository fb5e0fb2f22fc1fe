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
"""

from __future__ import annotations

import sys
import threading
import time

from stoker._platform import thread_sched_seconds

__all__ = ["GIL_PERIOD_S", "GilMeter"]

# Seconds between the sentinel's wake-ups (each costs a few microseconds of the GIL).
GIL_PERIOD_S = 0.01
# Wake-ups a reading needs.
MIN_WAKEUPS = 5


class GilMeter:
    """A sentinel thread measuring the wait for the GIL after a wake-up (see the module
    docstring). Start it with :meth:`start`, read it with :meth:`take`, end it with
    :meth:`close`."""

    def __init__(self, period_s: float = GIL_PERIOD_S) -> None:
        self.period_s = period_s
        self._lock = threading.Lock()
        self._waited = 0.0
        self._wakeups = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="stoker-gil-meter", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        stop, period = self._stop, self.period_s
        sched = thread_sched_seconds()
        while True:
            t0 = time.perf_counter()
            if stop.wait(period):
                return
            late = time.perf_counter() - t0 - period
            queued = 0.0
            now = thread_sched_seconds()
            if now is not None and sched is not None:
                queued = now[1] - sched[1]
            sched = now
            with self._lock:
                self._waited += max(0.0, late - queued)
                self._wakeups += 1

    def take(self) -> float | None:
        """Mean wait for the GIL per wake-up since the last call, as a share of the switch
        interval (0 to 1); None with fewer than :data:`MIN_WAKEUPS` wake-ups."""
        with self._lock:
            if self._wakeups < MIN_WAKEUPS:
                return None
            waited, wakeups = self._waited, self._wakeups
            self._waited, self._wakeups = 0.0, 0
        return min(1.0, waited / wakeups / sys.getswitchinterval())

    def close(self) -> None:
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=1.0)
