"""Keep the training step's OpenMP threads from spinning on the cores stoker's workers load on.

torch's CPU ops run on an OpenMP team (libgomp in torch's Linux wheels). A team thread that
finishes its share of an op, or the last op of a step, spins on the CPU before it sleeps:
300,000 pause instructions by default, milliseconds, unless libgomp counts more OpenMP
threads than CPUs, when it spins 1,000 times (documented with ``GOMP_SPINCOUNT``). libgomp
counts only its own threads, so a step whose team fills the cores spins at full length beside
worker processes that need those cores: at nice 19 the workers lose the core to the spinning
thread outright. The bench's CPU step on heavytail (2-core VM, 8 process workers, prefetch 4)
used 18-24 ms of main-process CPU a step against 11.5 ms fed from memory, and ran 18.9-22.4
steps/s where torchdata.nodes ran 22-23; with libgomp's spinning throttled, 10.6-12.2 ms and
21.8-26.3 steps/s (benchmarks/README.md).

While workers (processes, or threads on their own CPU clocks) use cores the step's team would
have to itself (their CPU over an interval, plus the step's threads, is more than the cores),
a stoker thread joins one OpenMP team of its own and keeps it: libgomp then counts more
threads than CPUs and throttles every team's spinning, the step's included. When the workers
go quiet, the epoch ends, or the consumer stops asking for batches (:data:`LEASE_S`), the
thread exits and libgomp frees its team, and spins at full length again (fed from memory, the
bench's CPU step ran about 30% faster spinning: benchmarks/README.md).
Nothing of torch's is changed: no thread count, no environment. A user who set
``OMP_WAIT_POLICY`` or ``GOMP_SPINCOUNT`` chose the spinning, and is left alone; so is a torch
on another OpenMP runtime or thread pool. ``STOKER_OPENMP_THROTTLE=0`` turns it off.
"""

from __future__ import annotations

import ctypes
import functools
import os
import threading
import time
from collections.abc import Callable
from typing import Any

import psutil

from stoker._introspect.platform import affinity_cores, usable_cores
from stoker.workers import WorkerPool
from stoker.workers._process import worker_pid

__all__ = [
    "ENGAGE_CORES",
    "ENV_OFF",
    "FORM_LIMIT_S",
    "INTERVAL_S",
    "LEASE_S",
    "RELEASE_CORES",
    "SpinWatch",
    "openmp_library",
    "spin_watch",
    "throttle_held",
]

# Cores the step's team must share with the workers (its threads plus the workers' CPU over an
# interval, less the usable cores) from which the throttle is engaged, and under which it is
# let go (apart, so that a reading near one figure does not start and stop it every interval).
ENGAGE_CORES = 0.5
RELEASE_CORES = 0.25
# Longest wait for the throttling team to form (it takes microseconds).
FORM_LIMIT_S = 1.0
# How often the workers' CPU is read (from the consumer's next(): no thread of its own).
INTERVAL_S = 0.5
# A watch whose consumer asked for no batch in this long lets go (an evaluation mid-epoch, an
# iterator kept alive but unused): its workers stop competing once their prefetch is full, and
# the throttle is process-wide. Longer than any step, so that a slow step does not drop it.
LEASE_S = 20.0
# Set to "0" to leave libgomp's spinning as it is.
ENV_OFF = "STOKER_OPENMP_THROTTLE"
# Set by the user, these say how OpenMP threads should wait: stoker does not overrule them.
_USER_POLICY = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")


@functools.cache
def openmp_library() -> ctypes.CDLL | None:
    """libgomp as torch loaded it (its own copy in torch's wheels), or None: torch's ops run
    on another thread pool or OpenMP runtime, or this is not Linux."""
    import torch

    if "parallel backend: OpenMP" not in torch.__config__.parallel_info():
        return None
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            paths = {line.split()[-1] for line in maps if "libgomp" in line}
    except OSError:
        return None
    home = os.path.dirname(torch.__file__)
    for path in sorted(paths, key=lambda p: (not p.startswith(home), p)):  # torch's own first
        if not os.path.basename(path).startswith("libgomp"):
            continue
        try:
            lib = ctypes.CDLL(path)  # already mapped: the same library, not a second copy
            # GOMP_parallel(fn, data, num_threads, flags): what `#pragma omp parallel` becomes
            ptr, uint = ctypes.c_void_p, ctypes.c_uint
            lib.GOMP_parallel.argtypes = (ptr, ptr, uint, uint)
            lib.GOMP_parallel.restype = None
        except (OSError, AttributeError):
            continue
        return lib
    return None


class _Throttle:
    """The process's one throttling thread, held while any :class:`SpinWatch` wants it and
    keeps asking for batches (see :data:`LEASE_S`)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._holders: set[SpinWatch] = set()
        self._release: threading.Event | None = None
        self._thread: threading.Thread | None = None

    @property
    def held(self) -> bool:
        return bool(self._holders)

    def acquire(self, watch: SpinWatch, lib: ctypes.CDLL, team: int) -> None:
        with self._lock:
            self._holders.add(watch)
            if self._thread is not None:
                return
            release = self._release = threading.Event()
            formed = threading.Event()
            # Each thread of the team calls free(NULL), which does nothing: the team exists
            # only to be counted.
            noop = ctypes.cast(ctypes.CDLL(None).free, ctypes.c_void_p).value

            def hold() -> None:
                lib.GOMP_parallel(noop, None, team, 0)
                formed.set()
                # On return libgomp frees this thread's team.
                while not release.wait(LEASE_S / 4):
                    if self._lapse(release):
                        return

            self._thread = threading.Thread(target=hold, name="stoker-openmp-throttle", daemon=True)
            self._thread.start()
        formed.wait(FORM_LIMIT_S)  # in effect once it returns (a team starts in microseconds)

    def _lapse(self, release: threading.Event) -> bool:
        """Drop the holders that stopped polling; True when none is left (the thread exits)."""
        now = time.monotonic()
        with self._lock:
            if release is not self._release:
                return True
            for watch in [w for w in self._holders if now - w.polled > LEASE_S]:
                self._holders.discard(watch)
                watch.lapsed()
            if self._holders:
                return False
            self._release = self._thread = None
            return True

    def release(self, watch: SpinWatch) -> None:
        with self._lock:
            if watch not in self._holders:
                return
            self._holders.discard(watch)
            if self._holders:
                return
            release, thread = self._release, self._thread
            self._release = self._thread = None
        if release is not None:
            release.set()
        if thread is not None:
            thread.join()


_THROTTLE = _Throttle()


def _forget_in_child() -> None:
    """A forked child has no throttling thread (only the forking thread is copied), and
    libgomp's teams are not the child's to count on: it starts unthrottled and unheld."""
    global _THROTTLE
    _THROTTLE = _Throttle()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_in_child)


def throttle_held() -> bool:
    """Whether a stoker thread of this process holds libgomp's spinning throttled now."""
    return _THROTTLE.held


def _team_size(step_threads: int) -> int:
    """Threads for the throttling team: libgomp counts the initial thread once, and each
    team's other threads; with the step's team it must count more than the CPUs it found."""
    cpus = affinity_cores() or os.cpu_count() or 1
    return max(2, cpus - step_threads + 2)


class SpinWatch:
    """Reads the workers' CPU from the consumer's ``next()`` and holds the throttle while they
    compete with the step's OpenMP team for the cores.

    Args:
        workers_cpu: CPU seconds the workers used so far (None: unknown, or no pool).
        cores: the usable cores (affinity and quota).
        step_threads: torch's intra-op threads for the step (read at each interval).
        clock: monotonic seconds.
    """

    def __init__(
        self,
        workers_cpu: Callable[[], float | None],
        cores: Callable[[], int],
        step_threads: Callable[[], int],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._workers_cpu = workers_cpu
        self._cores = cores
        self._step_threads = step_threads
        self._clock = clock
        self._last: tuple[float, float] | None = None  # (time, workers' CPU) last read
        self._due = 0.0  # the clock's reading at which the next interval ends
        self._lapsed = False  # the throttle let go of it for want of polls
        self.polled = time.monotonic()  # when the consumer last asked (the lease's clock)
        self.engaged = False

    @staticmethod
    def wanted() -> bool:
        """Whether a watch could act here: libgomp under torch, and no user choice to keep."""
        if os.environ.get(ENV_OFF, "1") == "0":
            return False
        if any(var in os.environ for var in _USER_POLICY):
            return False
        return openmp_library() is not None

    def poll(self) -> str | None:
        """Measure an interval once :data:`INTERVAL_S` has passed; engage or let go of the
        throttle. Returns a note when it did either."""
        self.polled = time.monotonic()
        if self._lapsed:
            self._lapsed = False
            return f"no batch asked for in {LEASE_S:g} s: libgomp's spinning left as it was"
        now = self._clock()
        if now < self._due:
            return None
        self._due = now + INTERVAL_S
        last = self._last
        cpu = self._workers_cpu()
        if cpu is None:
            self._last = None
            return self._let_go("the workers' CPU is not measured")
        self._last = (now, cpu)
        if last is None or now <= last[0]:
            return None
        workers = max(0.0, cpu - last[1]) / (now - last[0])
        threads, cores = self._step_threads(), self._cores()
        excess = threads + workers - cores  # cores the step's team must share
        if not self.engaged and threads > 1 and excess >= ENGAGE_CORES:
            lib = openmp_library()
            if lib is None:
                return None
            _THROTTLE.acquire(self, lib, _team_size(threads))
            self.engaged = True
            return (
                f"workers used {workers:.1f} cores beside the step's {threads} OpenMP threads "
                f"on {cores} cores: libgomp's spinning throttled"
            )
        if self.engaged and (threads <= 1 or excess < RELEASE_CORES):
            return self._let_go(f"workers used {workers:.1f} cores")
        return None

    def _let_go(self, why: str) -> str | None:
        if not self.engaged:
            return None
        self.engaged = False
        _THROTTLE.release(self)
        return f"{why}: libgomp's spinning left as it was"

    def lapsed(self) -> None:
        """The throttle let go of this watch: its consumer stopped asking for batches (called
        by the throttling thread, under its lock)."""
        self.engaged = False
        self._lapsed = True
        self._last = None  # the next interval starts at the next poll

    def close(self, why: str = "closed") -> str | None:
        """Let go of the throttle and start the next interval afresh (the epoch ended, or the
        iterator shut down). Returns a note when it let go."""
        self._last = None
        self._due = 0.0
        self._lapsed = False
        return self._let_go(why)


def _process_cpu(worker: Any, known: dict[Any, Any]) -> tuple[Any, float] | None:
    """(key, CPU seconds) of a process worker (``known`` caches its psutil handle)."""
    pid = worker_pid(worker)
    if pid is None:
        return None
    proc = known.get(pid)
    if proc is None:
        proc = known[pid] = psutil.Process(pid)
    t = proc.cpu_times()
    return pid, t.user + t.system


def _thread_cpu(worker: Any, known: dict[Any, Any]) -> tuple[Any, float] | None:
    """(key, CPU seconds) of a thread worker, on its own CPU clock."""
    ident = worker.ident
    if ident is None or not worker.is_alive():
        return None
    return ident, time.clock_gettime(time.pthread_getcpuclockid(ident))


class _WorkersCpu:
    """CPU seconds the pool's workers used so far, summed as each was last read (a worker that
    retired or started keeps the sum rising); None where it cannot be read."""

    def __init__(self, pool: Callable[[], Any]) -> None:
        self._pool = pool
        self._handles: dict[Any, Any] = {}  # pid -> psutil.Process
        self._last: dict[Any, float] = {}  # pid or thread ident -> CPU seconds last read
        self._total = 0.0

    def __call__(self) -> float | None:
        pool = self._pool()
        if pool is None or pool.closed:
            return None
        if isinstance(pool, WorkerPool):
            read = _process_cpu
        elif hasattr(time, "pthread_getcpuclockid"):
            read = _thread_cpu
        else:
            return None
        seen: dict[Any, float] = {}
        for i in pool.active:
            try:
                got = read(pool.processes[i], self._handles)
            except (psutil.Error, OSError):
                continue
            if got is not None:
                key, now = got
                self._total += max(0.0, now - self._last.get(key, 0.0))
                seen[key] = now
        self._last = seen
        self._handles = {k: v for k, v in self._handles.items() if k in seen}
        return self._total


def spin_watch(pool: Callable[[], Any]) -> SpinWatch | None:
    """A watch over the workers of ``pool()`` (the iterator's current pool: processes or
    threads), or None where it could not act (see :meth:`SpinWatch.wanted`)."""
    if not SpinWatch.wanted():
        return None
    import torch

    return SpinWatch(_WorkersCpu(pool), usable_cores, torch.get_num_threads)
