"""The online controller behind ``num_workers="auto"`` and ``prefetch_factor="auto"``.

Pure logic: it is fed one :class:`Observation` per interval and answers with the worker count
and prefetch depth to use next. It adds workers while the consumer waits for data and CPU is
free (a worker that mostly waits, on storage or a network, costs little CPU, so I/O-bound
loading grows past the core count), removes one when workers sit idle and the consumer does
not wait, shrinks an oversubscribed pool (more workers than cores on saturated cores, as when
started from 16 on a small machine) straight to the count that keeps the cores busy while
workers block inside their samples (see :func:`workers_to_fill`; by halves while that share is
unmeasured), and sizes the prefetch depth to absorb the spread of batch latencies. A change of
the worker count that the blocked share does not call for is a trial: it is judged on the
delivered rate over at least :data:`EVAL_BATCHES` batches against the rate before it, and taken
back when it cost more than :data:`MIN_GAIN`. Changes never alter what is delivered: dispatch
is by batch index.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from stoker.autotune._fill import (
    BLOCKED_MIN_SPANS,
    FILL_TARGET,
    BlockedShare,
    busy_cores,
    share_for_idle,
    workers_to_fill,
)
from stoker.autotune._observation import Decision, Observation
from stoker.autotune._prefetch import (
    MAX_PREFETCH,
    MIN_PREFETCH,
    PREFETCH_CALM_INTERVALS,
    PrefetchSizer,
)
from stoker.autotune._trials import MIN_GAIN, Trial, judge

__all__ = [
    "BLOCKED_MIN_SPANS",
    "FILL_TARGET",
    "MAX_PREFETCH",
    "MIN_PREFETCH",
    "PREFETCH_CALM_INTERVALS",
    "Controller",
    "Decision",
    "Observation",
    "Trial",
    "busy_cores",
    "share_for_idle",
    "workers_to_fill",
]

# Consumer waiting above this share of wall time is starvation; below QUIET it is fed;
# above SEVERE it mostly waits and workers are added faster.
STARVED = 0.05
SEVERE = 0.5
QUIET = 0.01
# Workers less busy than this (share of wall time) are idle.
IDLE = 0.5
# CPU cores that must be free to add workers by the CPU estimate.
MIN_HEADROOM = 0.5
# A worker using less CPU than this (cores) mostly waits: growth by doubling is cheap.
WAITING_WORKER_CPU = 0.3
# Consecutive calm intervals before a worker is removed, and consecutive oversubscribed ones
# before a pool is shrunk; intervals after a removal before one may be added back (all damp
# oscillation).
CALM_INTERVALS = 3
SHRINK_INTERVALS = 2
COOLDOWN_INTERVALS = 2
# A count found not to pay is not grown past again for this many intervals (then the
# controller probes once more: the dataset or the machine may have changed).
PLATEAU_INTERVALS = 50
# A trial (a changed worker count) is judged once this many batches arrived under it, or
# after EVAL_INTERVALS intervals when batches are slow.
EVAL_BATCHES = 12
EVAL_INTERVALS = 6
# Intervals after a change (or the start) left out of the rate at the new count: workers that
# started together deliver their first batches together, a burst that is not their pace.
BURST_INTERVALS = 1


@dataclass(frozen=True)
class _Figures:
    """What the controller derives from one interval's :class:`Observation`."""

    obs: Observation
    wait: float  # the consumer's waiting share of the interval
    busy: float  # the workers' busy share
    headroom: float  # free cores
    cpu_per_worker: float
    need: int | None  # workers that fill the cores, by the blocked share
    blocked: float | None  # the blocked share
    keep: int  # workers no judgement on a noisy rate takes the pool below
    rate: float  # delivered batches per second at this count
    measured: bool  # the rate is past the count's start-up burst


class Controller:
    """Decides the worker count and prefetch depth, one interval at a time.

    Args:
        start: initial worker count.
        max_workers: most workers allowed (memory and file limits are the caller's to fold in).
        min_workers: fewest workers (>= 1).
        prefetch: initial prefetch depth per worker.
        tune_prefetch: adapt the prefetch depth (``prefetch_factor="auto"``).
        shrink: halve a pool with more workers than cores on saturated cores (for CPU-bound
            loading in processes; threads that wait on I/O saturate the cores usefully).
    """

    def __init__(
        self,
        start: int,
        max_workers: int,
        min_workers: int = 1,
        prefetch: int = MIN_PREFETCH,
        tune_prefetch: bool = True,
        shrink: bool = True,
    ) -> None:
        self.min_workers = max(1, min_workers)
        self.max_workers = max(self.min_workers, max_workers)
        self.workers = min(self.max_workers, max(self.min_workers, start))
        self.prefetch = prefetch
        self.tune_prefetch = tune_prefetch
        self.shrink = shrink
        self._calm = 0
        self._cooldown = 0
        self._oversubscribed = 0  # consecutive intervals that called for a shrink
        self._trial: Trial | None = None  # the change being judged
        self._plateau: int | None = None  # a count past which growth did not pay
        self._plateau_age = 0
        self._floor: int | None = None  # a count below which shrinking did not pay
        self._floor_age = 0
        self._floor_life = PLATEAU_INTERVALS // 2  # doubled by each shrink that fails
        self._share = BlockedShare()  # the workers' blocked share, the consumer's CPU
        self._cores: int | None = None  # usable cores, as last observed
        self._sizer = PrefetchSizer()
        # Batches and seconds observed at the current worker count (its rate).
        self._here = (0, 0.0, 0)  # batches, wall seconds, intervals
        self._idle_here = (0.0, 0.0)  # idle core-seconds and wall seconds at this count
        self._since_change = 0
        self.history: list[Decision] = []

    def observe(self, obs: Observation) -> Decision | None:
        """Take one interval's figures; returns a decision when something should change."""
        self._cores = obs.cores
        if obs.wall_s <= 0 or obs.workers <= 0 or obs.settling:
            return None
        now = self._figures(obs)
        if now is None:  # a start-up burst under a trial: nothing to judge on
            return self._decide(obs, obs.workers, "")
        if (
            self._trial is not None
            and self._trial.kind == "grow"
            and self._trial.share is None
            and now.keep == obs.workers
        ):
            # A probe made before the share was known, which the share now calls for.
            self._trial = None
        gained: float | None = None
        if self._trial is not None:
            if self._here[0] < EVAL_BATCHES and self._here[2] < EVAL_INTERVALS:
                return self._decide(obs, obs.workers, "")  # not enough evidence yet
            trial, self._trial = self._trial, None
            verdict = judge(trial, now.rate, now.blocked, obs.workers, now.need, self.min_workers)
            if verdict.plateau is not None:
                self._plateau, self._plateau_age = verdict.plateau, 0
            if verdict.floor is not None:
                self._floor, self._floor_age = verdict.floor, 0
            if verdict.back_to is not None:
                self._cooldown = COOLDOWN_INTERVALS
                if trial.kind == "shrink":  # tried less and less often
                    self._floor_life = min(16 * PLATEAU_INTERVALS, 2 * self._floor_life)
                else:
                    self._calm = 0
                return self._decide(obs, verdict.back_to, verdict.reason)
            gained = verdict.gained
        workers, reason = self._resize(now, gained)
        return self._decide(obs, workers, reason)

    def _figures(self, obs: Observation) -> _Figures | None:
        """Derive an interval's figures and age the controller's state by one interval; None
        while a trial's count is in its start-up burst."""
        wait = obs.wait_s / obs.wall_s
        busy = obs.busy_s / (obs.wall_s * obs.workers)
        cpu_used = (obs.cpu_s / obs.wall_s) if obs.cpu_s is not None else busy * obs.workers
        headroom = obs.cores - cpu_used
        if obs.idle_cores is not None:  # other processes use cores too
            headroom = min(headroom, obs.idle_cores)
        need, blocked = self._fill_need(obs)
        # Workers blocked inside their samples need this many to keep the cores busy: no
        # judgement on a noisy rate takes the pool below it.
        keep = min(obs.workers, need) if need is not None else 0
        self._cooldown = max(0, self._cooldown - 1)
        self._age_limits()
        self._since_change += 1
        if self._since_change > BURST_INTERVALS:
            batches, wall, intervals = self._here
            self._here = (batches + obs.batches, wall + obs.wall_s, intervals + 1)
            if obs.idle_cores is not None:
                idle_s, idle_wall = self._idle_here
                self._idle_here = (idle_s + obs.idle_cores * obs.wall_s, idle_wall + obs.wall_s)
        elif self._trial is not None:
            return None
        measured = self._here[2] > 0  # the rate at this count, past its start-up burst
        rate = self._here[0] / self._here[1] if measured else obs.batches / obs.wall_s
        return _Figures(
            obs, wait, busy, headroom, cpu_used / obs.workers, need, blocked, keep, rate, measured
        )

    def _resize(self, now: _Figures, gained: float | None) -> tuple[int, str]:
        """The count for the next interval, and why (the same count and no reason: keep it):
        shrink an oversubscribed pool, grow a starved one, shed idle workers."""
        obs = now.obs
        # With the blocked share measured, the pool shrinks straight to the count that fills
        # the cores (zero blocked: one worker per core); without it, by halves.
        fill = now.need if now.need is not None else (obs.cores if self._share.enough() else None)
        shrink_to = max(
            obs.cores,
            self.min_workers,
            self._floor or 0,
            fill if fill is not None else obs.workers // 2,
        )
        oversubscribed = (
            self.shrink
            and now.headroom < MIN_HEADROOM
            and shrink_to < obs.workers
            # during a slow start, wait for the share rather than halve: few workers load
            and (fill is not None or not obs.limited)
        )
        # Seen in consecutive intervals: a share that wavers around a count does not take a
        # worker away and bring it back (each costs a start and a first batch).
        self._oversubscribed = self._oversubscribed + 1 if oversubscribed else 0
        if (
            oversubscribed
            and self._oversubscribed >= SHRINK_INTERVALS
            and self._cooldown == 0
            and now.measured
        ):
            return self._shrink(now, fill, shrink_to)
        if now.wait > STARVED:
            self._calm = 0
            if self._can_grow(obs):
                return self._grow(now, fill, gained)
        elif now.wait < QUIET and now.busy < IDLE and obs.workers > self.min_workers:
            self._calm += 1
            if self._calm >= CALM_INTERVALS:
                self._calm = 0
                self._cooldown = COOLDOWN_INTERVALS
                self._plateau = None
                return obs.workers - 1, (
                    f"workers {now.busy:.0%} busy and consumer fed: "
                    f"{obs.workers} -> {obs.workers - 1} workers"
                )
        else:
            self._calm = 0
        return obs.workers, ""

    def _can_grow(self, obs: Observation) -> bool:
        return (
            not obs.limited  # the dispatch window, not the worker count, limits loading
            and obs.workers < self.max_workers
            and obs.memory_ok
            and self._cooldown == 0
            and (self._plateau is None or obs.workers < self._plateau)
        )

    def _shrink(self, now: _Figures, fill: int | None, shrink_to: int) -> tuple[int, str]:
        """More workers than cores on saturated cores: they only take turns (and CPU from the
        consumer). Waiting workers show up as free cores instead, so I/O-bound pools are left
        alone, and oversubscription that covers workers blocked inside their samples is kept.
        A shrink to the measured need is not judged (the removed workers only queued for the
        cores; idle cores would call them back); a halving is, on the rate."""
        obs = now.obs
        self._calm = 0
        self._trial = Trial("shrink", obs.workers, now.rate, now.blocked) if fill is None else None
        self._cooldown = COOLDOWN_INTERVALS
        why = f", workers blocked {now.blocked or 0:.0%} of their loading time" if fill else ""
        return shrink_to, (
            f"{obs.workers} workers on {obs.cores} saturated cores{why}: "
            f"{obs.workers} -> {shrink_to} workers"
        )

    def _grow(self, now: _Figures, fill: int | None, gained: float | None) -> tuple[int, str]:
        """The consumer waits and the pool may grow: by the blocked share's need, by the free
        cores, or one worker as a trial (doubled for waiting workers while growth pays)."""
        obs, need = now.obs, now.need
        step = 0
        why = ""
        # Double at most, quadruple when the consumer mostly waits.
        cap = obs.workers * (3 if now.wait > SEVERE else 1)
        if need is not None and obs.workers < need:
            # The cores idle while workers block: go straight to the count that fills them
            # (no further than the cores' measured idle time calls for), quadrupling at most
            # (doubling took heavytail's pool from the watch's 4 workers to its 10 in two
            # trials, the second 2 s later).
            grow_to = self._growth_need(obs, need)
            if grow_to > obs.workers:
                step = min(grow_to - obs.workers, 3 * obs.workers)
                why = f"workers blocked {now.blocked or 0:.0%} of their loading time"
        elif now.headroom >= MIN_HEADROOM:
            # How many more workers the free CPU feeds, at this per-worker CPU use; a
            # worker that mostly waits (I/O) uses little, so this grows past the cores.
            room = now.headroom / max(now.cpu_per_worker, 0.05)
            step = max(1, min(math.ceil(room / 2), cap))
            why = f"{now.headroom:.1f} cores free"
        elif fill is None and (gained is None or gained >= MIN_GAIN):
            # Saturated cores, and the blocked share unknown: probe one more worker (with
            # the share known, workers past the need would only queue for the cores).
            # Workers that mostly wait (I/O) cost little CPU: double them while it pays.
            waits = now.cpu_per_worker < WAITING_WORKER_CPU
            step = obs.workers if waits and gained else 1
            why = "the last workers added raised the rate" if gained else "probing"
        if not step:
            return obs.workers, ""
        workers = min(self.max_workers, obs.workers + step)
        self._trial = Trial("grow", obs.workers, now.rate, now.blocked)
        return workers, (
            f"consumer waited {now.wait:.0%} of the time ({why}): "
            f"{obs.workers} -> {workers} workers"
        )

    def _fill_need(self, obs: Observation) -> tuple[int | None, float | None]:
        """The workers that keep the cores busy while workers block, and the blocked share
        (:meth:`BlockedShare.share`); the need is None while the share is unmeasured or
        none blocked."""
        self._share.add(obs.blocked_s, obs.running_s, obs.sampled, obs.consumer_cpu_s, obs.wall_s)
        share = self._share.share()
        if not share:
            return None, share
        cores = self._share.loading_cores(obs.cores)
        return workers_to_fill(cores, share, cap=self.max_workers), share

    def assume_blocked(self, share: float) -> None:
        """Start from a blocked share measured before any worker ran (the backend probe's
        serial pass; see :meth:`BlockedShare.assume`): the controller acts on it from the
        first interval (with it, saturated cores and workers that do not block call for no
        trial of one more worker), and measured spans take over as it decays."""
        self._share.assume(share)

    def take_over(self, other: Controller, at_least: int = 1) -> int:
        """Start from what ``other`` (the controller of a pool this one replaces) measured of
        the workers' blocking and the consumer's CPU, with ``at_least`` workers (bounded by
        :attr:`max_workers`) or the workers that blocked share calls for, whichever is more;
        returns the count to start with (:attr:`workers`)."""
        self.workers = max(self.workers, min(self.max_workers, at_least))
        self._share = other._share.copy()
        share = self._share.share()
        if other._cores is not None and share:
            cores = self._share.loading_cores(other._cores)
            self.workers = max(self.workers, workers_to_fill(cores, share, cap=self.max_workers))
        return self.workers

    def _growth_need(self, obs: Observation, need: int) -> int:
        """The count growth may go to: ``need``, unless the cores idle less than the blocked
        share says they should.

        Workers that wait for each other (thread workers for the GIL, any workers for a lock)
        read as blocked, but while one waits another runs: the cores stay busy. The share of
        blocking that would leave the cores as idle as measured at this count (averaged since
        the count was set) is what more workers can cover; growth goes no further than its
        :func:`workers_to_fill`. (Other processes taking the cores lower that count too: there
        is no free core to fill.)
        """
        idle_s, wall = self._idle_here
        if wall <= 0:
            if obs.idle_cores is None:
                return need
            idle_s, wall = obs.idle_cores * obs.wall_s, obs.wall_s
        cores = self._share.loading_cores(obs.cores)
        share = share_for_idle(cores, obs.workers, idle_s / wall)
        return min(need, workers_to_fill(cores, share, cap=self.max_workers))

    def _age_limits(self) -> None:
        """Forget a plateau or a floor after PLATEAU_INTERVALS: the load may have changed."""
        if self._plateau is not None:
            self._plateau_age += 1
            if self._plateau_age > PLATEAU_INTERVALS:
                self._plateau = None
        if self._floor is not None:
            self._floor_age += 1
            if self._floor_age > self._floor_life:
                self._floor = None

    def _decide(self, obs: Observation, workers: int, reason: str) -> Decision | None:
        prefetch, note = self.prefetch, ""
        if self.tune_prefetch:
            prefetch, note = self._sizer.size(self.prefetch, obs.latency_p50_s, obs.latency_p95_s)
        if note:
            reason = f"{reason}; {note}" if reason else note
        if workers == obs.workers and prefetch == self.prefetch:
            return None
        if workers != obs.workers:
            self._here = (0, 0.0, 0)  # a new count: its rate is measured afresh
            self._idle_here = (0.0, 0.0)
            self._since_change = 0
        self.workers, self.prefetch = workers, prefetch
        decision = Decision(workers, prefetch, reason)
        self.history.append(decision)
        return decision
