"""How many workers keep the cores busy when each is blocked part of its loading time (a
binomial model of the awake workers), and the decaying measure of that share (pure logic)."""

from __future__ import annotations

import math

__all__ = [
    "BLOCKED_DECAY",
    "BLOCKED_MIN_SPANS",
    "FILL_TARGET",
    "OVERSUBSCRIBE_MIN_GAIN",
    "PRIOR_SPAN_S",
    "BlockedShare",
    "busy_cores",
    "share_for_idle",
    "workers_to_fill",
]

# Workers that block inside their samples (sleep, storage, a lock) leave cores idle unless
# there are more workers than cores: enough that the cores stay busy this share of the time.
# A worker too many costs its memory and a little switching; a core idle costs its share of
# the rate, and a measured share that wavers (a 1% tail gives few spans) asks for the count
# again: at 0.97, heavytail's process pools read 0.03-0.05 idle cores, at 0.99 0.00-0.01.
FILL_TARGET = 0.99
# Past one worker per core only where the oversubscription fills the cores by at least this
# share more (the least a trial tells from noise, stoker.autotune._trials.MIN_GAIN): jpeg's
# CPU-bound process workers on 2 cores read 2% blocked, which the target alone turns into a
# third worker for 2% more busy cores; starting it cost quick mode's short runs 30-40% of the
# rate (178 against 273-286 samples/s, scratch lo2.py, 0.4 s windows).
OVERSUBSCRIBE_MIN_GAIN = 0.03
# Weight of the previous intervals in the blocked share (per interval), and the sampled
# spans of worker batches (decayed alike) it needs before the controller acts on it.
BLOCKED_DECAY = 0.9
BLOCKED_MIN_SPANS = 4
# Seconds each span of a prior share (see BlockedShare.assume) stands for: as long as a
# span a worker samples (stoker.workers._loop.BLOCKED_SPAN_S), so measured spans outweigh it
# within a few intervals.
PRIOR_SPAN_S = 0.05


def workers_to_fill(cores: float, blocked: float, cap: int = 256) -> int:
    """The fewest workers that keep ``cores`` busy ``FILL_TARGET`` of the time.

    Each worker is taken to be blocked (inside a sample, off the CPU) a ``blocked`` share of
    its loading time, independently of the others: the awake count is binomial, and the
    cores do ``E[min(awake, cores)]`` work. Workers that never block need one per core;
    workers blocked 43% of the time need 8 for 2 cores (4 leave them idle 12% of the time).
    Where one worker per core already comes within ``OVERSUBSCRIBE_MIN_GAIN`` of that, it is
    the answer: a worker that adds a sliver costs its start, memory and switching.

    Args:
        cores: the cores loading may use (a fraction where the main process uses some).
        blocked: share of a worker's loading time spent blocked, in [0, 1].
        cap: the answer when no count up to it is enough.
    """
    blocked = min(max(blocked, 0.0), 1.0)
    if blocked >= 1.0:
        return cap
    base = max(1, math.ceil(cores - 1e-9))
    for n in range(base, cap + 1):
        busy = busy_cores(cores, blocked, n)
        if busy >= FILL_TARGET * cores:
            if busy < (1 + OVERSUBSCRIBE_MIN_GAIN) * busy_cores(cores, blocked, base):
                return base
            return n
    return cap


def busy_cores(cores: float, blocked: float, workers: int) -> float:
    """The cores ``workers`` keep busy when each is blocked a ``blocked`` share of its loading
    time, independently of the others: ``E[min(awake, cores)]``, the awake count binomial."""
    awake = 1.0 - blocked
    return sum(
        math.comb(workers, k) * awake**k * blocked ** (workers - k) * min(k, cores)
        for k in range(workers + 1)
    )


def share_for_idle(cores: float, workers: int, idle: float) -> float:
    """The blocked share at which ``workers`` leave ``idle`` of ``cores`` idle (the inverse of
    :func:`busy_cores` in the share, by bisection; 0 when even never-blocked workers would
    leave more idle, near 1 when all of them idle)."""
    lo, hi = 0.0, 0.999
    if cores - busy_cores(cores, lo, workers) >= idle:
        return lo
    for _ in range(30):
        mid = (lo + hi) / 2
        if cores - busy_cores(cores, mid, workers) < idle:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


class BlockedShare:
    """The share of their loading time that workers spend blocked, and the cores the main
    process leaves to loading, in decaying sums over about ``1 / (1 - BLOCKED_DECAY)``
    intervals (one interval holds few spans).

    The share is measured against the time loading would take on cores of its own (running
    plus blocked; time queued for a core is what oversubscription adds), over the spans of
    batches the workers sampled.
    """

    def __init__(self) -> None:
        self._blocked = (0.0, 0.0, 0.0)  # blocked and running seconds, sampled spans
        self._consumer = (0.0, 0.0)  # the main process's CPU and wall seconds

    def add(
        self,
        blocked_s: float | None,
        running_s: float | None,
        sampled: int,
        consumer_cpu_s: float | None,
        wall_s: float,
    ) -> None:
        """One interval: its sampled spans' blocked and running seconds (None: none
        sampled), how many spans, the main process's CPU seconds (None: unknown) and its
        length."""
        if blocked_s is not None and running_s is not None:
            blocked, running, count = self._blocked
            self._blocked = (
                BLOCKED_DECAY * blocked + blocked_s,
                BLOCKED_DECAY * running + running_s,
                BLOCKED_DECAY * count + max(1, sampled),
            )
        if consumer_cpu_s is not None:
            used, wall = self._consumer
            self._consumer = (BLOCKED_DECAY * used + consumer_cpu_s, BLOCKED_DECAY * wall + wall_s)

    def enough(self) -> bool:
        """Whether enough spans were sampled for the share to be acted on."""
        return self._blocked[2] >= BLOCKED_MIN_SPANS

    def share(self) -> float | None:
        """The blocked share; None until :data:`BLOCKED_MIN_SPANS` (decayed) were sampled."""
        blocked, running, _ = self._blocked
        if not self.enough():
            return None
        if blocked <= 0:
            return 0.0
        return blocked / (blocked + running)

    def loading_cores(self, cores: int) -> float:
        """Of ``cores``, those the main process leaves to loading (at least one): the workers
        fill those, not the ones the training loop runs on."""
        used, wall = self._consumer
        if wall <= 0:
            return float(cores)
        return max(1.0, cores - used / wall)

    def assume(self, share: float) -> None:
        """Start from a share measured before any worker ran (the backend probe's serial
        pass), worth :data:`BLOCKED_MIN_SPANS` spans of :data:`PRIOR_SPAN_S`."""
        share = min(max(share, 0.0), 1.0)
        seconds = BLOCKED_MIN_SPANS * PRIOR_SPAN_S
        self._blocked = (share * seconds, (1.0 - share) * seconds, float(BLOCKED_MIN_SPANS))

    def copy(self) -> BlockedShare:
        twin = BlockedShare()
        twin._blocked, twin._consumer = self._blocked, self._consumer
        return twin
