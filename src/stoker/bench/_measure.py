"""Resource meters for one timed run: CPU of the main process and of the process tree, PSS.

``TreeMeter`` is started just before a timed run and stopped just after it. A background
thread follows the memory of the main process and of its children that were born since the
meter's baseline (the contender's workers), keeping the peak proportional set size (PSS); the
CPU the sampler thread itself burns is subtracted from the main process's CPU.

A PSS reading walks every page table of each process (``/proc/PID/smaps_rollup``): 11-14 ms
of CPU per process on jpeg, 41 ms for stoker's main process and two workers, which taken every
0.1 s cost the loaders 0.4 of the 2-core VM's cores and more to loaders with more processes
(stoker's processes read 300-313 samples/s on quick jpeg against 365-390 unmetered; its
threads 343-347 against 379-384). So the sampler reads the resident set size (psutil's
``memory_info``, 0.03 ms) every interval, and the PSS only where the tree's resident set grew past
:data:`PSS_REREAD_GROWTH` times what it was at the last PSS reading, and once at the end
unless the last reading is fresh (:data:`PSS_FRESH_S`).
"""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import psutil

__all__ = ["Meter", "TreeMeter", "TreeUsage"]

# Seconds between two readings of the tree's resident set size (tests shrink it).
PSS_INTERVAL_S = 0.1
# The children are listed every this many readings (psutil scans every process of the machine:
# 2.65 ms with 64 on the VM), the known ones read in between: a new worker shows within 1 s.
CHILDREN_EVERY = 10
# The PSS is read again where the tree's resident set has grown past this factor of what it
# was at the last PSS reading (a peak that grows less is read at the end only).
PSS_REREAD_GROWTH = 1.05
# The end's PSS reading is left out where the last one is younger than this and the tree's
# resident set has not grown past PSS_REREAD_GROWTH since: a quick run's window (0.4 s) was
# read 0.1 s in, and the end's reading cost 0.1-0.3 s a run (8 s of a 105 s quick bench).
PSS_FRESH_S = 1.0


@dataclass(frozen=True)
class TreeUsage:
    """What one timed run cost.

    Attributes:
        main_cpu_s: CPU seconds (user + system, all threads) of the main process, read with
            nanosecond resolution (``time.process_time``), the meter's own thread excluded.
        tree_cpu_s: CPU seconds of the main process plus its workers (workers are read from
            /proc in clock ticks, 10 ms).
        peak_pss_bytes: highest total PSS of main + workers seen during the run.
    """

    main_cpu_s: float
    tree_cpu_s: float
    peak_pss_bytes: int


def _cpu(proc: psutil.Process) -> float | None:
    try:
        t = proc.cpu_times()
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return None
    return float(t.user + t.system)


def _rss(proc: psutil.Process) -> int:
    try:
        return int(proc.memory_info().rss)
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return 0


def _pss(proc: psutil.Process) -> int:
    try:
        info = proc.memory_full_info()
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return 0
    value = getattr(info, "pss", None)
    return int(value if value is not None else info.rss)


class TreeMeter:
    """Measures the CPU and memory of this process and of children born after ``baseline``.

    Args:
        baseline: pids of children that existed before the contender's loader was built
            (they belong to someone else and are ignored). Default: none.
        interval_s: seconds between readings of the resident set. Default
            :data:`PSS_INTERVAL_S`.

    Attributes:
        pss_readings: PSS readings taken so far (each walks every page table of the tree).
    """

    def __init__(self, baseline: set[int] | None = None, interval_s: float | None = None) -> None:
        self._me = psutil.Process()
        self._baseline = set(baseline or ())
        self._interval = PSS_INTERVAL_S if interval_s is None else interval_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._peak = 0
        self._rss_read = 0  # the tree's resident set at the last growth-driven PSS reading
        self._pss_at: float | None = None  # time.monotonic() of the last PSS reading
        self.pss_readings = 0
        self._sampler_cpu = 0.0
        self._start_main = 0.0
        self._start_children: dict[int, float] = {}
        self._procs: dict[int, psutil.Process] = {}
        self._start_reaped = 0.0

    @staticmethod
    def children_now() -> set[int]:
        """Pids of this process's children, recursively."""
        return {p.pid for p in psutil.Process().children(recursive=True)}

    def _children(self) -> list[psutil.Process]:
        try:
            found = self._me.children(recursive=True)
        except psutil.Error:
            return list(self._procs.values())
        for proc in found:
            if proc.pid not in self._baseline and proc.pid not in self._procs:
                self._procs[proc.pid] = proc
        return [p for p in found if p.pid not in self._baseline]

    def _sample_pss(
        self, procs: list[psutil.Process] | None = None, side_by_side: bool = False
    ) -> None:
        """Read the tree's PSS into the peak. ``side_by_side`` reads the processes in a thread
        pool: the end's reading is off the clock but on the bench's (read one after another
        it took 0.17-0.3 s a run on quick large and jpeg, 10 s of a 106 s quick bench)."""
        procs = [self._me, *self._children()] if procs is None else procs
        if side_by_side:
            with ThreadPoolExecutor(min(len(procs), os.cpu_count() or 1)) as pool:
                total = sum(pool.map(_pss, procs))
        else:
            total = sum(_pss(p) for p in procs)
        self._peak = max(self._peak, total)
        self.pss_readings += 1
        self._pss_at = time.monotonic()

    def _end_needs_pss(self) -> bool:
        if self._pss_at is None or time.monotonic() - self._pss_at > PSS_FRESH_S:
            return True
        rss = sum(_rss(p) for p in [self._me, *self._procs.values()])
        return rss > self._rss_read * PSS_REREAD_GROWTH

    def _sample(self, tick: int) -> None:
        """Read the tree's resident set; the PSS too where it grew (see the module)."""
        known = self._children() if tick % CHILDREN_EVERY == 0 else self._procs.values()
        procs = [self._me, *known]
        rss = sum(_rss(p) for p in procs)
        if rss > self._rss_read * PSS_REREAD_GROWTH:
            self._rss_read = rss
            self._sample_pss(procs)

    def _sampler(self) -> None:
        start = time.thread_time()
        tick = 0
        while not self._stop.wait(self._interval):
            self._sample(tick)
            tick += 1
        self._sampler_cpu = time.thread_time() - start

    def start(self) -> None:
        """Take the starting readings and start sampling."""
        for proc in self._children():
            cpu = _cpu(proc)
            if cpu is not None:
                self._start_children[proc.pid] = cpu
        times = os.times()
        self._start_reaped = times.children_user + times.children_system
        self._start_main = time.process_time()
        self._thread = threading.Thread(target=self._sampler, name="stoker-bench-meter")
        self._thread.daemon = True
        self._thread.start()

    def stop(self) -> TreeUsage:
        """Stop sampling and return the run's usage (call once, after :meth:`start`)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        # Read after the join, so that every CPU second the sampler thread spent (and that
        # _sampler_cpu subtracts) lies inside the measured interval.
        end_main = time.process_time()
        if self._end_needs_pss():
            self._sample_pss(side_by_side=True)
        main = max(0.0, end_main - self._start_main - self._sampler_cpu)
        children = 0.0
        for pid, proc in self._procs.items():
            cpu = _cpu(proc)
            if cpu is None:
                continue  # exited: counted below through os.times() once reaped
            children += cpu - self._start_children.get(pid, 0.0)
        times = os.times()
        reaped = times.children_user + times.children_system - self._start_reaped
        return TreeUsage(
            main_cpu_s=main, tree_cpu_s=main + children + reaped, peak_pss_bytes=self._peak
        )


class Meter:
    """Context manager around :class:`TreeMeter`; ``usage`` is set on exit."""

    def __init__(self, baseline: set[int] | None = None) -> None:
        self._meter = TreeMeter(baseline)
        self.usage: TreeUsage | None = None

    def __enter__(self) -> Meter:
        self._meter.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.usage = self._meter.stop()
