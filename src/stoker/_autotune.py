"""The online controller behind ``num_workers="auto"`` and ``prefetch_factor="auto"``.

Pure logic: it is fed one :class:`Observation` per interval and answers with the worker count
and prefetch depth to use next. It adds workers while the consumer waits for data and CPU is
free (a worker that mostly waits, on storage or a network, costs little CPU, so I/O-bound
loading grows past the core count), removes one when workers sit idle and the consumer does
not wait, and sizes the prefetch depth to absorb the spread of batch latencies. Changes never
alter what is delivered: dispatch is by batch index.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["Controller", "Decision", "Observation"]

# Consumer waiting above this share of wall time is starvation; below QUIET it is fed;
# above SEVERE it mostly waits and workers are added faster.
STARVED = 0.05
SEVERE = 0.5
QUIET = 0.01
# Workers busier than this (share of wall time) are saturated; below IDLE they are idle.
SATURATED = 0.85
IDLE = 0.5
# CPU cores that must be free to add workers by the CPU estimate.
MIN_HEADROOM = 0.5
# With less headroom, one more worker is tried while the last addition raised the delivered
# batch rate by at least this share (hill climbing); growth stops once one did not.
MIN_GAIN = 0.03
# A worker using less CPU than this (cores) mostly waits: growth by doubling is cheap.
WAITING_WORKER_CPU = 0.3
# Consecutive calm intervals before a worker is removed; intervals after a removal before
# one may be added back (damps oscillation).
CALM_INTERVALS = 3
COOLDOWN_INTERVALS = 2
# A count found not to pay is not grown past again for this many intervals (then the
# controller probes once more: the dataset or the machine may have changed).
PLATEAU_INTERVALS = 50
MIN_PREFETCH = 2
MAX_PREFETCH = 8


@dataclass(frozen=True)
class Observation:
    """What happened during one interval.

    Attributes:
        wall_s: length of the interval.
        wait_s: time the consumer spent blocked in ``next()``.
        busy_s: time all workers together spent loading batches.
        cpu_s: CPU time the workers used (None if unknown).
        workers: workers running during the interval.
        cores: usable cores (affinity and cgroup quota).
        latency_p50_s: median batch load time, if any batch completed.
        latency_p95_s: 95th percentile batch load time.
        memory_ok: whether one more worker fits the memory budget.
        batches: batches delivered to the consumer during the interval.
        settling: workers started during the interval (their start-up skews the figures:
            the interval is not used for a decision).
        idle_cores: idle CPU time of the usable cores over the interval, in cores (other
            processes on the machine count); None if unknown.
    """

    wall_s: float
    wait_s: float
    busy_s: float
    cpu_s: float | None
    workers: int
    cores: int
    latency_p50_s: float | None = None
    latency_p95_s: float | None = None
    memory_ok: bool = True
    batches: int = 0
    settling: bool = False
    idle_cores: float | None = None


@dataclass(frozen=True)
class Decision:
    """What to run next, and why (shown in the stats and the monitor)."""

    workers: int
    prefetch: int
    reason: str


class Controller:
    """Decides the worker count and prefetch depth, one interval at a time.

    Args:
        start: initial worker count.
        max_workers: most workers allowed (memory and file limits are the caller's to fold in).
        min_workers: fewest workers (>= 1).
        prefetch: initial prefetch depth per worker.
        tune_prefetch: adapt the prefetch depth (``prefetch_factor="auto"``).
    """

    def __init__(
        self,
        start: int,
        max_workers: int,
        min_workers: int = 1,
        prefetch: int = MIN_PREFETCH,
        tune_prefetch: bool = True,
    ) -> None:
        self.min_workers = max(1, min_workers)
        self.max_workers = max(self.min_workers, max_workers)
        self.workers = min(self.max_workers, max(self.min_workers, start))
        self.prefetch = prefetch
        self.tune_prefetch = tune_prefetch
        self._calm = 0
        self._cooldown = 0
        self._grew_from: tuple[int, float] | None = None  # (workers, rate) before growing
        self._plateau: int | None = None  # a count past which growth did not pay
        self._plateau_age = 0
        self.history: list[Decision] = []

    def observe(self, obs: Observation) -> Decision | None:
        """Take one interval's figures; returns a decision when something should change."""
        if obs.wall_s <= 0 or obs.workers <= 0 or obs.settling:
            return None
        wait = obs.wait_s / obs.wall_s
        busy = obs.busy_s / (obs.wall_s * obs.workers)
        cpu_used = (obs.cpu_s / obs.wall_s) if obs.cpu_s is not None else busy * obs.workers
        headroom = obs.cores - cpu_used
        if obs.idle_cores is not None:  # other processes use cores too
            headroom = min(headroom, obs.idle_cores)
        cpu_per_worker = cpu_used / obs.workers
        self._cooldown = max(0, self._cooldown - 1)
        rate = obs.batches / obs.wall_s
        gained: float | None = None
        revert: int | None = None
        if self._plateau is not None:
            self._plateau_age += 1
            if self._plateau_age > PLATEAU_INTERVALS:
                self._plateau = None
        if self._grew_from is not None and self._grew_from[0] < obs.workers:
            grew_from, before = self._grew_from
            gained = (rate - before) / before if before > 0 else None
            self._grew_from = None
            if gained is not None and gained < MIN_GAIN:
                self._plateau, self._plateau_age = obs.workers, 0
                if gained < -MIN_GAIN and headroom < MIN_HEADROOM:
                    # The cores are saturated and the added workers slowed loading down
                    # (they take CPU from the consumer, or from each other): take them back.
                    revert = max(self.min_workers, grew_from)
                    self._plateau = revert
        workers, reason = obs.workers, ""
        can_grow = (
            obs.workers < self.max_workers
            and obs.memory_ok
            and self._cooldown == 0
            and (self._plateau is None or obs.workers < self._plateau)
        )
        if revert is not None and revert < obs.workers:
            self._calm = 0
            self._cooldown = COOLDOWN_INTERVALS
            workers = revert
            reason = (
                f"adding workers lowered the rate ({gained or 0.0:+.0%}) with no CPU free: "
                f"{obs.workers} -> {workers} workers"
            )
        elif wait > STARVED and can_grow:
            self._calm = 0
            if headroom >= MIN_HEADROOM:
                # How many more workers the free CPU feeds, at this per-worker CPU use; a
                # worker that mostly waits (I/O) uses little, so this grows past the cores.
                room = headroom / max(cpu_per_worker, 0.05)
                # Double at most, quadruple when the consumer mostly waits.
                cap = obs.workers * (3 if wait > SEVERE else 1)
                step = max(1, min(math.ceil(room / 2), cap))
                why = f"{headroom:.1f} cores free"
            elif gained is None or gained >= MIN_GAIN:
                # Workers that mostly wait (I/O) cost little CPU: double them while it pays.
                waits = cpu_per_worker < WAITING_WORKER_CPU
                step = obs.workers if waits and gained else 1
                why = "the last workers added raised the rate" if gained else "probing"
            else:
                step = 0
                why = ""
            if step:
                workers = min(self.max_workers, obs.workers + step)
                self._grew_from = (obs.workers, rate)
                reason = (
                    f"consumer waited {wait:.0%} of the time ({why}): "
                    f"{obs.workers} -> {workers} workers"
                )
        elif wait > STARVED:
            self._calm = 0
        elif wait < QUIET and busy < IDLE and obs.workers > self.min_workers:
            self._calm += 1
            if self._calm >= CALM_INTERVALS:
                self._calm = 0
                self._cooldown = COOLDOWN_INTERVALS
                self._plateau = None
                workers = obs.workers - 1
                reason = (
                    f"workers {busy:.0%} busy and consumer fed: {obs.workers} -> {workers} workers"
                )
        else:
            self._calm = 0
        prefetch = self.prefetch
        if self.tune_prefetch and obs.latency_p50_s and obs.latency_p95_s:
            spread = obs.latency_p95_s / max(obs.latency_p50_s, 1e-6)
            want = min(MAX_PREFETCH, max(MIN_PREFETCH, math.ceil(spread)))
            if want != prefetch:
                prefetch = want
                note = f"batch latency p95/p50 = {spread:.1f}: prefetch {self.prefetch} -> {want}"
                reason = f"{reason}; {note}" if reason else note
        if workers == obs.workers and prefetch == self.prefetch:
            return None
        self.workers, self.prefetch = workers, prefetch
        decision = Decision(workers, prefetch, reason)
        self.history.append(decision)
        return decision
