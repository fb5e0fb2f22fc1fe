"""The backend probe's measurements: a serial pass over spread samples (wall and CPU time,
collation, copy-on-read), and threads loading at once (no decisions here)."""

from __future__ import annotations

import itertools
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from stoker._introspect.containers import find_containers
from stoker._introspect.platform import thread_sched_seconds

__all__ = [
    "PROBE_DEADLINE_S",
    "SerialPass",
    "busy_threads",
    "holds_python_objects",
    "serial_pass",
    "shared_dirty_bytes",
    "thread_speedup",
]

# Most rounds of one thread against two (cheap samples leave budget for more than one).
PROBE_ROUNDS = 3
# The dataset must hold at least this much in Python containers (estimated) for measured
# copying to be blamed on it.
COW_CONTAINER_BYTES = 16 * 2**20
# The parent gives the probing child this long before it kills it and picks processes.
PROBE_DEADLINE_S = 10.0
# Most samples the serial pass loads.
MAX_SAMPLES = 4096
# The serial pass first loads and collates a batch, for at most this long (two samples at
# least): a forked child's first allocations copy the pages it shares with its parent, which
# the main process never pays. With two samples of warm-up, tiny's batch read 0.85-1.38 ms in
# a child forked from the bench's process (0.80-0.88 ms from a fresh one) and crossed
# INLINE_BATCH_S in some runs; with a batch, 0.43-0.70 ms.
WARM_UP_S = 0.01
# Samples between two checks of whether the serial pass may stop early.
EARLY_CHECK_EVERY = 32
# After a sample that took this long, the next one's run-queue delay is read too (a read of
# /proc costs tens of microseconds: a few percent of such a sample).
QUEUE_TRACK_S = 1e-3
# Indices are spread over the dataset with this stride (coprime with any length that is not
# a multiple of it), so that the probe reads as a shuffled epoch does, not one region.
_STRIDE = 2_654_435_761


def shared_dirty_bytes() -> int | None:
    """Dirty pages this process still shares (after a fork: with its parent), from
    ``/proc/self/smaps_rollup``; None where that file does not exist.

    A forked child that writes to an inherited page gets a private copy of it, and the page
    leaves this count, while fresh allocations never enter it: its decrease is what the child
    copied, whatever else it allocated meanwhile.
    """
    try:
        with open("/proc/self/smaps_rollup") as f:
            for line in f:
                if line.startswith("Shared_Dirty:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _load(dataset: Any, indices: list[int], walls: list[float]) -> None:
    for i in indices:
        t0 = time.perf_counter()
        dataset[i]
        walls.append(time.perf_counter() - t0)


def _fresh(n: int, start: int, count: int) -> list[int]:
    """``count`` indices spread over a dataset of ``n`` samples, from stride step ``start``."""
    return [(k * _STRIDE) % n for k in range(start, start + count)]


def _two_threads(dataset: Any, indices: list[int]) -> tuple[list[float], float]:
    """Load ``indices`` in two threads, half each; return each sample's wall time and the
    pass's wall time."""
    half = len(indices) // 2 or 1
    parts = [indices[:half], indices[half:]] if len(indices) > 1 else [indices]
    walls: list[list[float]] = [[] for _ in parts]
    threads = [
        threading.Thread(target=_load, args=(dataset, part, out))
        for part, out in zip(parts, walls, strict=True)
    ]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return [w for part in walls for w in part], max(time.perf_counter() - t0, 1e-9)


def thread_speedup(
    dataset: Any, n: int, walls: list[float], start: int, t0: float, budget_s: float
) -> tuple[float, int]:
    """How much faster two threads load than one, and the next fresh stride step.

    ``walls`` are the serial pass's sample times (begun at ``t0``); the threads load as many
    other samples, from stride step ``start``, as cold as the serial pass's.
    """
    loaded, serial = len(walls), sum(walls)
    parallel_walls, wall2 = _two_threads(dataset, _fresh(n, start, loaded))
    start += loaded
    # Cheap samples leave budget over: more rounds of one thread against two, on fresh samples,
    # and the quickest of each counts, so that one preemption of a pass lasting milliseconds
    # does not decide.
    one_best, two_best = serial, wall2
    for _ in range(PROBE_ROUNDS - 1):
        if time.perf_counter() - t0 + 2 * (one_best + two_best) > budget_s:
            break
        fresh = _fresh(n, start, 2 * loaded)
        start += 2 * loaded
        w1 = time.perf_counter()
        _load(dataset, fresh[:loaded], [])
        one_best = min(one_best, time.perf_counter() - w1)
        two_best = min(two_best, _two_threads(dataset, fresh[loaded:])[1])
    # Two threads that run in parallel load each sample as fast as one thread alone; two that
    # take turns, half as fast. By the median sample, so that a rare slow sample does not
    # decide, and by the total, which shows turn-taking on samples shorter than the
    # interpreter's switch interval: the lower of the two.
    per_sample = max(statistics.median(parallel_walls), 1e-9)
    by_median = 2 * statistics.median(walls) / per_sample if loaded > 1 else 1.0
    return min(by_median, one_best / two_best), start


def busy_threads(
    dataset: Any, n: int, start: int, count: int, seconds: float, join: bool = True
) -> float:
    """Cores that ``count`` threads loading fresh samples kept busy on average over
    ``seconds``: process CPU time over wall time, while every thread was still loading.

    A thread waiting for the GIL sleeps, so GIL-bound threads keep at most one core busy
    however many there are. ``join=False`` leaves the threads to finish their samples
    unwaited (in the probe's forked child, which exits after answering: the slowest sample
    in flight would hold up the answer).
    """
    stop = threading.Event()
    ks = itertools.count(start)

    def load() -> None:
        while not stop.is_set():
            dataset[(next(ks) * _STRIDE) % n]  # next() on a count is atomic under the GIL

    threads = [threading.Thread(target=load, daemon=True) for _ in range(count)]
    for t in threads:
        t.start()
    c0, w0 = time.process_time(), time.perf_counter()
    time.sleep(seconds)
    cores = (time.process_time() - c0) / max(time.perf_counter() - w0, 1e-9)
    stop.set()
    for t in threads if join else ():
        t.join()
    return cores


def holds_python_objects(dataset: Any) -> bool:
    """Whether the dataset holds large containers of Python objects (copy-on-read suspects).

    A forked child also copies free heap memory its parent left, as it allocates: measured
    copying is blamed on the dataset only when the dataset holds something to copy.
    """
    try:
        return sum(c.bytes for c in find_containers(dataset)) >= COW_CONTAINER_BYTES
    except Exception:
        return False


@dataclass(frozen=True)
class SerialPass:
    """What loading samples one at a time showed.

    Attributes:
        walls: each sample's wall seconds.
        cpus: each sample's CPU seconds (process CPU time: a sample's intra-op threads count).
        batch_s: seconds a batch took to load and collate.
        copied: private bytes per sample that reading copied (copy-on-read; 0 unmeasured).
        next_index: the next fresh stride step for later passes.
        started: when the timed loading began (``time.perf_counter()``, after the warm-up).
        queued: of the samples' wall time, the seconds this thread was runnable but waited
            for a core (other processes' load, not the dataset's waits; 0 where unknown).
        queues: each sample's own such seconds (0 where not read: cheap samples).
    """

    walls: list[float]
    cpus: list[float]
    batch_s: float
    copied: float
    next_index: int
    started: float
    queued: float = 0.0
    queues: list[float] | None = None

    @property
    def waiting(self) -> float:
        """The median sample's share of its wall time spent off the CPU, not queued for
        one."""
        queues = self.queues or [0.0] * len(self.walls)
        return statistics.median(
            max(0.0, 1.0 - (c + q) / w) if w > 0 else 0.0
            for c, w, q in zip(self.cpus, self.walls, queues, strict=True)
        )

    @property
    def waiting_all(self) -> float:
        """The share of the whole pass's wall time spent off the CPU, not queued for one."""
        serial = sum(self.walls)
        return max(0.0, 1.0 - (sum(self.cpus) + self.queued) / serial) if serial > 0 else 0.0


def _warm_up(
    dataset: Any,
    collate_fn: Any,
    indices: list[int],
    seconds: float,
    on_warm: Callable[[float], None] | None = None,
) -> float:
    """Load and collate a batch (two samples at least, more while ``seconds`` last) before
    the timed samples: first-use costs are not the dataset's (see :data:`WARM_UP_S`).
    Returns the seconds per sample it took, first-use costs included. ``on_warm`` gets a
    batch's seconds at the quicker of the first two samples' pace as soon as they are loaded
    (the first alone pays first uses), so that slow batches show before the warm-up ends."""
    t0 = time.perf_counter()
    batch = []
    last = t0
    quickest = float("inf")
    for k, i in enumerate(indices):
        if k >= 2 and time.perf_counter() - t0 > seconds:
            break
        batch.append(dataset[i])
        now = time.perf_counter()
        quickest, last = min(quickest, now - last), now
        if k == 1 and on_warm is not None:
            on_warm(quickest * len(indices))
    collate_fn(batch)
    return (time.perf_counter() - t0) / max(1, len(batch))


def serial_pass(
    dataset: Any,
    collate_fn: Any,
    size: int,
    n: int,
    forked: bool,
    seconds: float,
    early: tuple[int, Callable[[float, float, float], bool]] | None = None,
    on_warm: Callable[[float], None] | None = None,
) -> SerialPass:
    """Load spread samples of ``dataset`` (``n`` long) one at a time for about ``seconds``
    (a few at least), collating them ``size`` at a time; ``forked``: this is a forked child
    whose inherited objects are frozen, so its private-memory growth measures copy-on-read.

    ``early``: ``(samples, settled)``: from that many samples on, the pass stops as soon as
    ``settled(waiting, waiting_all, copied)`` (the figures so far, see :class:`SerialPass`)
    says more would not change the answer. ``on_warm``: called with the seconds a batch would
    take, once the warm-up's first two samples are loaded (see :func:`_warm_up`) and again
    at the warm-up's pace once it is done (an overestimate: first uses included).
    """
    order = [(k * _STRIDE) % n for k in range(min(n, MAX_SAMPLES))]
    per_sample = _warm_up(dataset, collate_fn, order[:size], min(WARM_UP_S, seconds / 4), on_warm)
    if on_warm is not None:
        on_warm(per_sample * size)
    shared0 = shared_dirty_bytes() if forked else None
    walls: list[float] = []
    cpus: list[float] = []
    queues: list[float] = []
    collate_s = 0.0
    batch: list[Any] = []
    t0 = time.perf_counter()
    sched0 = thread_sched_seconds()
    half: tuple[int, int | None] | None = None  # (samples, shared bytes) halfway
    marks: dict[int, int | None] = {}  # samples -> shared bytes, for the early stop
    while len(walls) < len(order) and (
        time.perf_counter() - t0 < seconds
        # a few samples at least, unless they are so slow that the deadline nears
        or (len(walls) < min(size, 8) and time.perf_counter() - t0 < PROBE_DEADLINE_S / 4)
    ):
        if half is None and time.perf_counter() - t0 >= seconds / 2:
            half = (len(walls), shared_dirty_bytes() if forked else None)
        # The wall clock inside the CPU clock: reading the CPU clock is a system call that
        # costs about as much as a cheap sample, and the threaded pass reads only walls.
        q0 = thread_sched_seconds() if walls and walls[-1] >= QUEUE_TRACK_S else None
        c0 = time.process_time()
        w0 = time.perf_counter()
        sample = dataset[order[len(walls)]]
        w1 = time.perf_counter()
        cpus.append(time.process_time() - c0)
        walls.append(w1 - w0)
        q1 = thread_sched_seconds() if q0 is not None else None
        queues.append(max(0.0, q1[1] - q0[1]) if q0 is not None and q1 is not None else 0.0)
        batch.append(sample)
        if len(batch) == size:
            c1 = time.perf_counter()
            collate_fn(batch)
            collate_s += time.perf_counter() - c1
            batch = []
        if early is not None and _settled(
            early, (walls, cpus, queues), (t0, sched0), forked, marks
        ):
            break
    if batch:
        c1 = time.perf_counter()
        collate_fn(batch)
        collate_s += time.perf_counter() - c1
    shared1 = shared_dirty_bytes() if forked else None
    loaded = len(walls)
    # Copies in the second half only: the first samples also write to free heap memory the
    # parent left (a bounded, one-off copy); reading a dataset's objects keeps copying.
    start, shared_half = half if half is not None and half[0] < loaded else (0, shared0)
    copied = (
        max(0, shared_half - shared1) / (loaded - start)
        if shared_half is not None and shared1 is not None
        else 0.0
    )
    # The slowest 2% left out: a preemption of the probe (another process taking the core
    # for a few milliseconds) would otherwise pass for the dataset's cost.
    kept = sorted(walls)[: max(1, loaded - loaded // 50)]
    batch_s = (sum(kept) / len(kept) + collate_s / loaded) * size
    queued = _queued(walls, t0, sched0)
    return SerialPass(walls, cpus, batch_s, copied, len(order) + loaded, t0, queued, queues)


def _queued(walls: list[float], t0: float, sched0: tuple[float, float] | None) -> float:
    """Of the samples' wall time since ``t0``, the seconds this thread waited for a core: its
    run-queue delay since ``sched0``, in the samples' share of the time elapsed."""
    sched1 = thread_sched_seconds()
    elapsed = time.perf_counter() - t0
    if sched0 is None or sched1 is None or elapsed <= 0:
        return 0.0
    return max(0.0, sched1[1] - sched0[1]) * min(1.0, sum(walls) / elapsed)


def _settled(
    early: tuple[int, Callable[[float, float, float], bool]],
    samples: tuple[list[float], list[float], list[float]],
    start: tuple[float, tuple[float, float] | None],
    forked: bool,
    marks: dict[int, int | None],
) -> bool:
    """Whether the serial pass may stop now (see :func:`serial_pass`); copies are counted
    from halfway to the first check, as the full pass counts them in its second half."""
    walls, cpus, queues = samples
    loaded, least = len(walls), early[0]
    if loaded == least // 2:
        marks[loaded] = shared_dirty_bytes() if forked else None
    if loaded < least or loaded % EARLY_CHECK_EVERY:
        return False
    so_far = SerialPass(walls, cpus, 0.0, 0.0, 0, start[0], _queued(walls, *start), queues)
    mid = marks.get(least // 2)
    now = shared_dirty_bytes() if forked else None
    copied = (
        max(0, mid - now) / (loaded - least // 2) if mid is not None and now is not None else 0.0
    )
    return early[1](so_far.waiting, so_far.waiting_all, copied)
