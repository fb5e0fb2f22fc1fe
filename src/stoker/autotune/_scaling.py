"""Feeding the ``num_workers="auto"`` controller with measurements and applying its answers.

:class:`~stoker.autotune._controller.Controller` is pure logic; this module measures what it
needs once per
interval (consumer wait and worker busy time from the iterator, CPU of the process tree and
idle time of the usable cores from the OS, batch latencies, how much of the sampled spans of
worker batches was spent blocked, free memory) and turns a decision into workers started or
asked to retire (whichever is idle first takes the retire request).
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Callable
from typing import Any

import psutil

from stoker._introspect.platform import usable_cores
from stoker.autotune._controller import MIN_HEADROOM, Controller, Decision, Observation
from stoker.workers._process import worker_pid

__all__ = ["CONTROL_INTERVAL_S", "AutoScaler", "capacity_for"]

# Seconds between controller decisions; the most workers per usable core, and in all; the
# memory that must stay available to add a worker.
CONTROL_INTERVAL_S = 0.2
# The first measured interval, from the first delivery, as a share of CONTROL_INTERVAL_S:
# starting from too few workers shows at once (the consumer waits, cores sit idle), and a
# change it gets wrong is a trial, taken back on the rate.
FIRST_INTERVAL_SHARE = 0.25
# The scaler's clock (tests drive it by hand).
_clock = time.monotonic
MAX_WORKERS_PER_CORE = {"process": 8, "thread": 16}
MAX_AUTO_WORKERS = 64
RAM_RESERVE_BYTES = 1 << 30
# Control intervals after which a slow start's dispatch window is lifted whatever happened.
SLOW_START_INTERVALS = 10
# Intervals in a row with idle cores before the slow start's window widens.
WIDEN_INTERVALS = 2


def capacity_for(backend: str) -> int:
    """The most workers ``num_workers="auto"`` may run with ``backend``."""
    return min(MAX_AUTO_WORKERS, MAX_WORKERS_PER_CORE.get(backend, 8) * usable_cores())


def idle_seconds() -> float | None:
    """Idle CPU seconds so far, summed over the CPUs this process may run on."""
    try:
        per_cpu = psutil.cpu_times(percpu=True)
        allowed = os.sched_getaffinity(0)
    except (AttributeError, OSError, psutil.Error):
        return None
    return float(sum(t.idle for i, t in enumerate(per_cpu) if i in allowed))


class AutoScaler:
    """One controller and the measurements it is fed.

    Args:
        controller: the decision logic.
        backend: ``"process"`` (workers' CPU is measured per process) or ``"thread"``.
    """

    def __init__(self, controller: Controller, backend: str) -> None:
        self.controller = controller
        self.backend = backend
        now = _clock()
        self._last = (now, 0.0, 0.0, 0.0, 0)  # time, wait, busy, cpu, batches
        self._idle = idle_seconds()
        self._latencies: list[float] = []
        # Start-up is not measured: the first interval ends at the first delivery (None
        # until then), and the one after it, the first measured, is a short one.
        self._settled: float | None = None
        self._first = True
        self._procs: dict[int, psutil.Process] = {}
        self._main_cpu: float | None = None  # the consumer's CPU seconds, last interval
        self._consumer_thread: int | None = None  # thread workers: the consuming thread
        # Sampled spans of worker batches: running and blocked seconds, and how many.
        self._blocked: tuple[float, float, int] | None = None
        self.retiring = 0  # retire requests not yet answered
        self._was_retiring = False
        # Batches that may be in flight while the pool starts larger than the cores (see
        # :meth:`slow_start`); None: no limit but the prefetch depth.
        self.window: int | None = None
        self._window_intervals = 0
        self._idle_intervals = 0
        self.deferred = 0  # workers of a slow start that start as the window widens

    @classmethod
    def for_pool(cls, backend: str, workers: int, prefetch: int, tune_prefetch: bool) -> AutoScaler:
        """A controller for a pool of ``workers`` with ``backend``, bounded by
        :func:`capacity_for` (its ``controller.max_workers``); process pools shrink when
        oversubscribed, thread pools that wait on I/O saturate the cores usefully."""
        controller = Controller(
            start=workers,
            max_workers=capacity_for(backend),
            prefetch=prefetch,
            tune_prefetch=tune_prefetch,
            shrink=backend == "process",
        )
        return cls(controller, backend)

    def slow_start(self, workers: int) -> int:
        """Start a pool of ``workers`` with one batch in flight per usable core when it has
        more workers than cores; returns how many workers to start now.

        Handed one batch each at once, more workers than cores share the cores and all
        finish their first batch late together (16 on 2 cores: about 8 batch times before
        the first arrives, seconds for decoding). The window at least doubles after every
        :data:`WIDEN_INTERVALS` control intervals in a row in which cores sat idle (loading
        that waits), and is lifted once it covers
        the prefetch depth, when the controller first changes the worker count (it then sized
        the pool from measurements), or after :data:`SLOW_START_INTERVALS`.

        Only as many workers as the window feeds start at first; the rest start as it widens.
        Started at once, they would cost a fork, a start-up and a slow first batch each, on
        cores that the loading keeps busy.
        """
        cores = usable_cores()
        self.window = cores if workers > cores else None
        self._window_intervals = 0
        self._idle_intervals = 0  # intervals in a row with idle cores (for widening)
        self.deferred = max(0, workers - cores) if self.window is not None else 0
        return workers - self.deferred

    def end_slow_start(self) -> None:
        """Lift the window; workers not started by then are not (the controller decides)."""
        self.window = None
        self.deferred = 0

    def new_epoch(self) -> None:
        """An epoch starts, its pipeline empty: measure again from its first delivered batch.

        Until then the consumer waits for a whole batch's latency, and a pause between
        epochs (an evaluation) lies in the interval too: neither says how many workers the
        loading needs: measured as starvation, it would grow the pool after every pause.
        """
        self._settled = None

    def record_latency(self, seconds: float) -> None:
        """A batch took ``seconds`` to load."""
        self._latencies.append(seconds)

    def record_blocked(self, running_s: float, blocked_s: float) -> None:
        """A sampled span of a worker's batches ran ``running_s`` on a core and was blocked
        ``blocked_s``."""
        running, blocked, count = self._blocked or (0.0, 0.0, 0)
        self._blocked = (running + running_s, blocked + blocked_s, count + 1)

    def hurry(self) -> None:
        """Let the next delivered batch run a control step, however soon (``stoker tune``
        applies a schedule this way instead of waiting out the interval)."""
        t_last, *rest = self._last
        self._last = (t_last - CONTROL_INTERVAL_S, *rest)  # type: ignore[assignment]

    def retired(self) -> None:
        """A worker answered a retire request."""
        self.retiring = max(0, self.retiring - 1)

    def running(self, pool: Any) -> int:
        return len(pool.active) - self.retiring

    def _cpu_seconds(self, pool: Any) -> tuple[float, float | None]:
        """CPU time of the main process and live workers (threads: the process), and the
        consumer's: the main process's, or with thread workers (which share it) the CPU time
        of the thread that consumes (None when another thread consumed last time)."""
        pids = [os.getpid()]
        if self.backend == "process":
            pids += [p for i in pool.active if (p := worker_pid(pool.processes[i])) is not None]
        total = 0.0
        main: float | None = None
        for pid in pids:
            proc = self._procs.get(pid)
            try:
                if proc is None:
                    proc = self._procs[pid] = psutil.Process(pid)
                t = proc.cpu_times()
                total += t.user + t.system
            except psutil.Error:
                self._procs.pop(pid, None)
                continue
            if pid == pids[0] and self.backend == "process":
                main = t.user + t.system
        if self.backend == "thread":
            consumer = threading.get_ident()
            if consumer != self._consumer_thread:  # the first step, or another thread consumes
                self._consumer_thread = consumer
                self._main_cpu = None  # no delta to take this time
            main = time.thread_time()
        return total, main

    def due(self, now: float | None = None) -> bool:
        """Whether :meth:`step` measures an interval now (or at ``now``): the caller first
        takes in the replies that arrived, whose busy time would otherwise land in a later
        interval."""
        if self._settled is None:
            return False
        share = FIRST_INTERVAL_SHARE if self._first else 1.0
        t = _clock() if now is None else now
        return t - self._last[0] >= CONTROL_INTERVAL_S * share

    def step(
        self,
        pool: Any,
        *,
        wait_s: float,
        busy_s: float,
        delivered: int,
        on_added: Callable[[int], None],
    ) -> Decision | None:
        """Measure, decide and apply, at most once per :data:`CONTROL_INTERVAL_S`.

        Args:
            pool: the worker pool (``add``, ``retire``, ``active``, ``processes``).
            wait_s: the consumer's total wait so far.
            busy_s: the workers' total busy time so far.
            delivered: batches delivered so far.
            on_added: called with the id of each worker started (to bring it up to date).
        """
        now = _clock()
        if self._settled is None:
            if delivered == 0:
                return None
            # The workers are up: measure from here (what start-up cost is left out).
            self._settled = now
            cpu, self._main_cpu = self._cpu_seconds(pool)
            self._last = (now, wait_s, busy_s, cpu, delivered)
            self._idle = idle_seconds()
            self._latencies, self._blocked = [], None
            return None
        if not self.due(now):
            return None
        obs = self._observe(pool, now, wait_s, busy_s, delivered)
        decision = self.controller.observe(obs)
        if self.window is not None:
            self._follow_window(pool, obs, decision, now, on_added)
        if decision is None:
            return None
        if decision.workers != obs.workers:
            self._settled = now + CONTROL_INTERVAL_S / 2
        running = self.running(pool)
        # Workers still retiring hold their places: start what fits now; the next interval
        # sees the count actually running, and the controller decides from that.
        for _ in range(min(decision.workers - running, pool.room())):
            on_added(pool.add())
        if running > decision.workers:
            pool.retire(running - decision.workers)
            self.retiring += running - decision.workers
        return decision

    def _observe(
        self, pool: Any, now: float, wait_s: float, busy_s: float, delivered: int
    ) -> Observation:
        """The interval since the last one, measured; starts the next."""
        t_last, wait_last, busy_last, cpu_last, batches_last = self._last
        cpu, main_cpu = self._cpu_seconds(pool)
        main_last, self._main_cpu = self._main_cpu, main_cpu
        sampled, self._blocked = self._blocked, None
        lat = sorted(self._latencies)
        self._latencies = []
        idle = idle_seconds()
        wall = now - t_last
        idle_cores = (idle - self._idle) / wall if idle is not None and self._idle else None
        obs = Observation(
            wall_s=wall,
            wait_s=max(0.0, wait_s - wait_last),
            busy_s=max(0.0, busy_s - busy_last),
            cpu_s=max(0.0, cpu - cpu_last) if cpu_last else None,
            consumer_cpu_s=(
                max(0.0, main_cpu - main_last)
                if main_cpu is not None and main_last is not None
                else None
            ),
            workers=self.running(pool),
            cores=usable_cores(),
            latency_p50_s=lat[len(lat) // 2] if lat else None,
            latency_p95_s=lat[int(len(lat) * 0.95)] if lat else None,
            memory_ok=psutil.virtual_memory().available > RAM_RESERVE_BYTES,
            batches=max(0, delivered - batches_last),
            # Start-up, or workers still retiring (their in-flight batches hold up delivery)
            settling=t_last < (self._settled or 0.0) or self.retiring > 0 or self._was_retiring,
            idle_cores=idle_cores,
            blocked_s=sampled[1] if sampled is not None else None,
            running_s=sampled[0] if sampled is not None else None,
            sampled=sampled[2] if sampled is not None else 0,
            limited=self.window is not None,
        )
        self._idle = idle
        self._was_retiring = self.retiring > 0
        self._last = (now, wait_s, busy_s, cpu, delivered)
        if not obs.settling:
            self._first = False
        return obs

    def _follow_window(
        self,
        pool: Any,
        obs: Observation,
        decision: Decision | None,
        now: float,
        on_added: Callable[[int], None],
    ) -> None:
        """A slow start's window after an interval: lifted once the controller changed the
        count or after :data:`SLOW_START_INTERVALS`, widened after idle intervals."""
        assert self.window is not None
        self._window_intervals += 1
        if (
            decision is not None and decision.workers != obs.workers
        ) or self._window_intervals >= SLOW_START_INTERVALS:
            self.end_slow_start()
            return
        idle_cores = obs.idle_cores
        if not obs.settling and idle_cores is not None and idle_cores >= MIN_HEADROOM:
            self._idle_intervals += 1
        else:
            self._idle_intervals = 0
        if self._idle_intervals < WIDEN_INTERVALS:
            return
        # As many more batches as the idle cores would feed at the current use (at least
        # double, at most eightfold): waiting loading opens up in a step or two. (Not from a
        # start-up interval: cores idle while workers start; and not from one interval alone:
        # a stalled consumer idles busy workers for a moment.)
        self._idle_intervals = 0
        assert idle_cores is not None
        used = max(obs.cores - idle_cores, obs.cores / 8)
        self.window = math.ceil(self.window * min(8.0, max(2.0, obs.cores / used)))
        # ... and the workers of the slow start not started yet that it now feeds.
        start = min(self.deferred, self.window - obs.workers, pool.room())
        for _ in range(max(0, start)):
            on_added(pool.add())
        self.deferred -= max(0, start)
        if start > 0:
            self._settled = now + CONTROL_INTERVAL_S / 2
