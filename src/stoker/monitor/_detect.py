"""Detectors: running median, stalls, sawtooth (periodic wait spikes) and the diagnosis.

Definitions (every threshold is a named constant below):

* **starvation ratio** (data-wait fraction) over a span of steps:
  ``sum(wait) / sum(wait + compute)``.
* **stall**: after ``STALL_WARMUP_STEPS`` steps, a step whose wait exceeds
  ``max(STALL_FACTOR * m, m + STALL_MIN_EXCESS_S)`` where ``m`` is the median wait of the
  previous ``STALL_WINDOW`` steps. The first batch of every later pass over the loader is
  checked too (a restart of the workers shows up there).
* **sawtooth**: in a window of at least ``SAWTOOTH_MIN_STEPS`` steps, a *spike* is a wait above
  ``b + max(SPIKE_MIN_EXCESS_S, SPIKE_FACTOR * b)`` where ``b`` is the window's 25th percentile
  wait. The window shows a sawtooth when there are at least ``SAWTOOTH_MIN_SPIKES`` spikes, at
  most ``SAWTOOTH_MAX_SPIKE_SHARE`` of the steps are spikes, the most common gap between
  spikes (the *period*, >= 2) covers
  at least ``SAWTOOTH_REGULARITY`` of the gaps (within ``period // 4`` steps), and the spikes'
  waits cost at least ``SAWTOOTH_MIN_COST`` of the window's step time.
* **verdict**: ``healthy`` below ``HEALTHY_MAX_WAIT``, ``starved`` at or above
  ``STARVED_MIN_WAIT``, ``mild`` between; a healthy verdict comes with no action (stalls and
  spikes are then noted, not acted on). :mod:`stoker.monitor._figures` decides which steps
  the fraction is taken over (the steady state) and when a run is too short to judge.
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
from collections import Counter, deque
from collections.abc import Iterable, Sequence

from stoker.monitor._types import LoaderHealth, Sawtooth, StallEvent, Verdict

__all__ = [
    "RunningMedian",
    "StallDetector",
    "diagnose",
    "find_sawtooth",
    "percentile",
    "scan_sawtooth",
    "wait_fraction",
]

STALL_WINDOW = 101
STALL_WARMUP_STEPS = 20
STALL_FACTOR = 5.0
STALL_MIN_EXCESS_S = 0.050

SAWTOOTH_MIN_STEPS = 24
SAWTOOTH_MIN_SPIKES = 4
SAWTOOTH_MAX_SPIKE_SHARE = 0.6
SPIKE_FACTOR = 3.0
SPIKE_MIN_EXCESS_S = 0.001
SAWTOOTH_REGULARITY = 0.7
SAWTOOTH_MIN_COST = 0.03

HEALTHY_MAX_WAIT = 0.05
STARVED_MIN_WAIT = 0.15
BUSY_SATURATED = 0.85
BUSY_IDLE = 0.5


def wait_fraction(wait_s: float, compute_s: float) -> float:
    """The starvation ratio ``wait / (wait + compute)``; 0 when both are 0."""
    total = wait_s + compute_s
    return min(1.0, max(0.0, wait_s / total)) if total > 0 else 0.0


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100) of ``values`` by linear interpolation; 0 when empty."""
    if not values:
        return 0.0
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def _stall_threshold(median: float) -> float:
    """The wait above which a step is a stall, given the running median of the waits."""
    return max(STALL_FACTOR * median, median + STALL_MIN_EXCESS_S)


class RunningMedian:
    """Median of the last ``window`` values, updated in O(window) memmove, O(log window) search.

    Args:
        window: how many recent values count (>= 1).
    """

    def __init__(self, window: int) -> None:
        if window < 1:
            raise ValueError(f"`window` must be >= 1. Found: {window!r}.")
        self._window = window
        self._fifo: deque[float] = deque()
        self._sorted: list[float] = []

    def __len__(self) -> int:
        return len(self._fifo)

    def add(self, value: float) -> None:
        """Add ``value``, dropping the oldest value once the window is full."""
        self.push(value)

    def push(self, value: float) -> float | None:
        """Add ``value`` and return the median of the values before it (``None``: none).

        The same as :meth:`median` then :meth:`add`, in one call (this runs every step).
        """
        fifo, ordered = self._fifo, self._sorted
        n = len(ordered)
        before = None
        if n:
            mid = n // 2
            before = ordered[mid] if n % 2 else 0.5 * (ordered[mid - 1] + ordered[mid])
            if n == self._window:
                del ordered[bisect.bisect_left(ordered, fifo.popleft())]
        fifo.append(value)
        bisect.insort(ordered, value)
        return before

    def median(self) -> float:
        """The current median (0 when empty)."""
        s = self._sorted
        n = len(s)
        if n == 0:
            return 0.0
        mid = n // 2
        return s[mid] if n % 2 else 0.5 * (s[mid - 1] + s[mid])


class StallDetector:
    """Flags waits far above the running median of the waits before them (see module doc).

    Args:
        window: steps in the running median. Default ``STALL_WINDOW``.
        warmup: steps before detection starts. Default ``STALL_WARMUP_STEPS``.
    """

    def __init__(self, *, window: int = STALL_WINDOW, warmup: int = STALL_WARMUP_STEPS) -> None:
        self._median = RunningMedian(window)
        self._warmup = warmup
        self._seen = 0

    def threshold(self) -> float | None:
        """The wait above which the next step is a stall; ``None`` during warm-up."""
        if self._seen < self._warmup or not len(self._median):
            return None
        return _stall_threshold(self._median.median())

    def check(self, step: int, wait_s: float, *, epoch_start: bool = False) -> StallEvent | None:
        """Check one step's wait, then add it to the window.

        Args:
            step: the step's index.
            wait_s: its data wait.
            epoch_start: the step is the first of a later pass over the loader.

        Returns:
            A :class:`StallEvent` when the wait is a stall, else ``None``.
        """
        events = self.check_many(step, (wait_s,), epoch_start=epoch_start)
        return events[0] if events else None

    def check_many(
        self, first_step: int, waits: Iterable[float], *, epoch_start: bool = False
    ) -> list[StallEvent]:
        """:meth:`check` each of consecutive steps' waits, in one loop.

        Args:
            first_step: the index of the first step.
            waits: the steps' data waits, in order.
            epoch_start: the first step is the first of a later pass over the loader.

        Returns:
            The stall events, in step order.
        """
        push, warmup, seen = self._median.push, self._warmup, self._seen
        events = []
        for k, wait_s in enumerate(waits):
            m = push(wait_s)
            if m is not None and seen >= warmup:
                threshold = _stall_threshold(m)
                if wait_s > threshold:
                    events.append(
                        StallEvent(first_step + k, wait_s, m, threshold, epoch_start and k == 0)
                    )
            seen += 1
        self._seen = seen
        return events


def find_sawtooth(
    waits: Sequence[float], computes: Sequence[float] | None = None
) -> Sawtooth | None:
    """Look for data-wait spikes that recur with a regular period (see module doc).

    Args:
        waits: per-step waits, oldest first.
        computes: per-step compute times aligned with ``waits`` (to weigh the spikes' cost);
            when ``None`` the cost is relative to the waits alone.

    Returns:
        The :class:`Sawtooth` found, or ``None``.
    """
    n = len(waits)
    if n < SAWTOOTH_MIN_STEPS:
        return None
    base = percentile(waits, 25)
    limit = base + max(SPIKE_MIN_EXCESS_S, SPIKE_FACTOR * base)
    spikes = [i for i, w in enumerate(waits) if w > limit]
    if len(spikes) < SAWTOOTH_MIN_SPIKES or len(spikes) > n * SAWTOOTH_MAX_SPIKE_SHARE:
        return None
    gaps = [b - a for a, b in itertools.pairwise(spikes)]
    counts = Counter(gaps)
    period = min(counts, key=lambda g: (-counts[g], g))
    if period < 2:
        return None
    tolerance = period // 4
    regular = sum(1 for g in gaps if abs(g - period) <= tolerance) / len(gaps)
    if regular < SAWTOOTH_REGULARITY:
        return None
    spike_wait = sum(waits[i] for i in spikes)
    total = sum(waits) + (sum(computes) if computes is not None else 0.0)
    cost = spike_wait / total if total > 0 else 0.0
    if cost < SAWTOOTH_MIN_COST:
        return None
    return Sawtooth(
        period=period,
        spikes=len(spikes),
        regularity=regular,
        spike_wait_s=spike_wait / len(spikes),
        base_wait_s=base,
        cost_fraction=min(1.0, cost),
        first_spike=spikes[0],
    )


def scan_sawtooth(
    waits: Sequence[float], computes: Sequence[float], *, window: int = 256
) -> Sawtooth | None:
    """Run :func:`find_sawtooth` over windows of ``window`` steps (half overlapping).

    A sawtooth often holds for only part of a run (after warm-up, in one epoch), which a single
    whole-run analysis would dilute; the costliest window found wins.

    Returns:
        The costliest :class:`Sawtooth`, its ``first_spike`` counted from the series start.
    """
    best: Sawtooth | None = None
    n = len(waits)
    starts = range(0, max(n - window, 0) + 1, max(window // 2, 1))
    for start in [*starts, max(n - window, 0)]:
        found = find_sawtooth(waits[start : start + window], computes[start : start + window])
        if found is not None and (best is None or found.cost_fraction > best.cost_fraction):
            best = dataclasses.replace(found, first_spike=found.first_spike + start)
    return best


def _verdict(fraction: float) -> Verdict:
    if fraction < HEALTHY_MAX_WAIT:
        return "healthy"
    return "starved" if fraction >= STARVED_MIN_WAIT else "mild"


def _cause(loader: LoaderHealth | None, num_workers: int | None, cores: int) -> tuple[str, str]:
    """(what the loader shows, what to do) for a data-wait worth acting on."""
    workers = loader.num_workers if loader and loader.num_workers is not None else num_workers
    backend = loader.backend if loader else None
    if workers == 0 or backend == "inline":
        return "loading runs in the main process", f"set `num_workers` ({cores} cores here)"
    busy = loader.busy_fraction if loader else None
    if busy is None:
        if workers is None:
            return "the iterable is slower than the step", "make the producer faster or parallel"
        return (
            f"{workers} workers",
            "more workers or a cheaper transform; stoker.DataLoader's stats tell which",
        )
    noun = "busy" if loader is not None and loader.busy_source == "stats" else "on CPU"
    shown = f"workers {busy:.0%} {noun}"
    if busy >= BUSY_SATURATED:
        if workers is not None and workers >= cores:
            return shown, f"a cheaper transform (all {cores} cores already have a worker)"
        return shown, "more workers or a cheaper transform"
    if busy <= BUSY_IDLE:
        if noun == "on CPU":
            return shown, "workers wait on I/O or the main process is slow: more workers for I/O"
        return shown, "the bottleneck is transport or the main process"
    return shown, "raise `prefetch_factor` or add workers to absorb uneven batches"


def diagnose(
    fraction: float,
    *,
    loader: LoaderHealth | None = None,
    num_workers: int | None = None,
    sawtooth: Sawtooth | None = None,
    stalls: Sequence[StallEvent] = (),
    cores: int = 1,
) -> tuple[Verdict, str, str | None]:
    """Turn measurements into a verdict, a diagnosis and an action.

    Args:
        fraction: the data-wait fraction of the span.
        loader: loader internals, when the loader can tell.
        num_workers: worker count when known without ``loader`` (e.g. torch's DataLoader).
        sawtooth: periodic spikes found over the span, if any.
        stalls: stall events of the span.
        cores: usable CPU cores of this machine.

    Returns:
        ``(verdict, diagnosis, action)``; ``action`` is ``None`` when nothing needs doing.
    """
    verdict = _verdict(fraction)
    pct = f"{fraction:.0%}"
    if verdict == "healthy":
        text, action = f"data-wait {pct}: input pipeline is not the bottleneck", None
    else:
        shown, action_text = _cause(loader, num_workers, cores)
        text, action = f"data-wait {pct} of step time: {shown}", action_text
    extra: list[str] = []
    if sawtooth is not None:
        saw = f"sawtooth: wait spikes every {sawtooth.period} steps"
        workers = loader.num_workers if loader and loader.num_workers else num_workers
        if workers and sawtooth.period == workers:
            saw += " (= num_workers: workers deliver in lockstep)"
            lockstep = "raise `prefetch_factor`"
            if loader is None or loader.busy_source != "stats":  # not stoker's loader already
                lockstep += "; stoker.DataLoader dispatches to any idle worker"
            if verdict != "healthy":  # healthy: no advice that would contradict it
                action = f"{action}; {lockstep}" if action else lockstep
        extra.append(saw)
    if stalls:
        worst = max(s.wait_s for s in stalls)
        extra.append(f"{len(stalls)} stall{'s' if len(stalls) > 1 else ''} (max {worst:.2f} s)")
        if any(s.epoch_start for s in stalls) and num_workers != 0:
            persist = "keep workers between epochs (`persistent_workers=True`)"
            if verdict == "healthy":  # a note, not advice: the steady state is fine
                extra[-1] += f" at a pass's start: {persist} avoids them"
            else:
                action = f"{action}; {persist}" if action else persist
    if loader is not None and loader.worker_restarts:
        extra.append(f"{loader.worker_restarts} worker restarts")
    if loader is not None and loader.off_shm_batches:
        extra.append(
            f"{loader.off_shm_batches} batches found no room in shared memory (`--shm-size`)"
        )
    if loader is not None and loader.gpu_util is not None:
        extra.append(f"GPU {loader.gpu_util:.0%}")
    if extra:
        text += "; " + "; ".join(extra)
    return verdict, text, action
