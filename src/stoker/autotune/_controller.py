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

__all__ = [
    "Controller",
    "Decision",
    "Observation",
    "busy_cores",
    "share_for_idle",
    "workers_to_fill",
]

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
# Consecutive calm intervals before a worker is removed, and consecutive oversubscribed ones
# before a pool is shrunk; intervals after a removal before one may be added back (all damp
# oscillation).
CALM_INTERVALS = 3
SHRINK_INTERVALS = 2
COOLDOWN_INTERVALS = 2
# A count found not to pay is not grown past again for this many intervals (then the
# controller probes once more: the dataset or the machine may have changed).
PLATEAU_INTERVALS = 50
MIN_PREFETCH = 2
MAX_PREFETCH = 8
# The prefetch depth rises at once but falls only after this many intervals in a row wanted
# it lower (a latency spread hovering at a boundary would flip it every interval).
PREFETCH_CALM_INTERVALS = 5
# A trial (a changed worker count) is judged once this many batches arrived under it, or
# after EVAL_INTERVALS intervals when batches are slow.
EVAL_BATCHES = 12
EVAL_INTERVALS = 6
# Workers that block inside their samples (sleep, storage, a lock) leave cores idle unless
# there are more workers than cores: enough that the cores stay busy this share of the time.
FILL_TARGET = 0.97
# Weight of the previous intervals in the blocked share (per interval), and the sampled
# spans of worker batches (decayed alike) it needs before the controller acts on it.
BLOCKED_DECAY = 0.9
BLOCKED_MIN_SPANS = 4
# Seconds each span of a prior share (see Controller.assume_blocked) stands for: as long as a
# span a worker samples (stoker.workers._loop.BLOCKED_SPAN_S), so measured spans outweigh it
# within a few intervals.
PRIOR_SPAN_S = 0.05
# A blocked share that rose by more than this over a growth trial came from contention.
SHARE_RISE = 0.1
# Intervals after a change (or the start) left out of the rate at the new count: workers that
# started together deliver their first batches together, a burst that is not their pace.
BURST_INTERVALS = 1


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
        blocked_s: over the spans of worker batches sampled during the interval, the loading
            time spent neither running nor waiting for a core (asleep on storage, a network,
            a lock); None if no span was sampled.
        running_s: over the same spans, the loading time spent on a core.
        sampled: how many spans ``blocked_s`` and ``running_s`` cover.
        consumer_cpu_s: CPU time the main process used (the training loop, and receiving
            batches from process workers); None if unknown (thread workers share it).
        limited: a start-up dispatch window, not the worker count, limited the batches in
            flight (workers are not added then: the window grows first).
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
    blocked_s: float | None = None
    running_s: float | None = None
    sampled: int = 0
    limited: bool = False
    consumer_cpu_s: float | None = None


def workers_to_fill(cores: float, blocked: float, cap: int = 256) -> int:
    """The fewest workers that keep ``cores`` busy ``FILL_TARGET`` of the time.

    Each worker is taken to be blocked (inside a sample, off the CPU) a ``blocked`` share of
    its loading time, independently of the others: the awake count is binomial, and the
    cores do ``E[min(awake, cores)]`` work. Workers that never block need one per core;
    workers blocked 43% of the time need 7 for 2 cores (4 leave them idle 12% of the time).

    Args:
        cores: the cores loading may use (a fraction where the main process uses some).
        blocked: share of a worker's loading time spent blocked, in [0, 1].
        cap: the answer when no count up to it is enough.
    """
    blocked = min(max(blocked, 0.0), 1.0)
    if blocked >= 1.0:
        return cap
    for n in range(max(1, math.ceil(cores - 1e-9)), cap + 1):
        if busy_cores(cores, blocked, n) >= FILL_TARGET * cores:
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
        # The trial being judged: (kind "grow"/"shrink", workers before, rate before).
        # The trial being judged: kind ("grow"/"shrink"), workers and rate before it, and the
        # blocked share when it started.
        self._trial: tuple[str, int, float, float | None] | None = None
        self._plateau: int | None = None  # a count past which growth did not pay
        self._plateau_age = 0
        self._floor: int | None = None  # a count below which shrinking did not pay
        self._floor_age = 0
        self._floor_life = PLATEAU_INTERVALS // 2  # doubled by each shrink that fails
        # Decaying sums of blocked and running worker seconds, and of sampled spans.
        self._blocked = (0.0, 0.0, 0.0)
        self._consumer = (0.0, 0.0)  # decaying sums of the main process's CPU and wall time
        self._cores: int | None = None  # usable cores, as last observed
        self._lower_wants: list[int] = []  # prefetch depths wanted below the current one
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
        wait = obs.wait_s / obs.wall_s
        busy = obs.busy_s / (obs.wall_s * obs.workers)
        cpu_used = (obs.cpu_s / obs.wall_s) if obs.cpu_s is not None else busy * obs.workers
        headroom = obs.cores - cpu_used
        if obs.idle_cores is not None:  # other processes use cores too
            headroom = min(headroom, obs.idle_cores)
        cpu_per_worker = cpu_used / obs.workers
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
            return self._decide(obs, obs.workers, "")
        measured = self._here[2] > 0  # the rate at this count, past its start-up burst
        rate = self._here[0] / self._here[1] if measured else obs.batches / obs.wall_s
        workers, reason = obs.workers, ""
        gained: float | None = None
        if (
            self._trial is not None
            and self._trial[0] == "grow"
            and self._trial[3] is None
            and keep == obs.workers
        ):
            # A probe made before the share was known, which the share now calls for.
            self._trial = None
        if self._trial is not None:
            if self._here[0] < EVAL_BATCHES and self._here[2] < EVAL_INTERVALS:
                return self._decide(obs, workers, reason)  # not enough evidence yet
            kind, before_workers, before, share_before = self._trial
            self._trial = None
            # Blocking that grew with the workers is contention (for a lock, the memory
            # system), not waits more workers cover: the share no longer vouches for them.
            contended = (
                blocked is not None
                and share_before is not None
                and blocked > share_before + SHARE_RISE
            )
            gained = (rate - before) / before if before > 0 else None
            if kind == "grow" and keep == obs.workers and not contended:
                gained = None  # growth the blocked share calls for needs no judging
            if kind == "shrink":
                if gained is not None and gained < -MIN_GAIN:
                    # Many workers that mostly wait (I/O) can saturate the cores too; try
                    # less and less often (the floor's life doubles each time).
                    self._floor, self._floor_age = before_workers, 0
                    self._floor_life = min(16 * PLATEAU_INTERVALS, 2 * self._floor_life)
                    self._cooldown = COOLDOWN_INTERVALS
                    return self._decide(
                        obs,
                        before_workers,
                        f"fewer workers lowered the rate ({gained:+.0%}): "
                        f"{obs.workers} -> {before_workers} workers",
                    )
                # As fast with fewer: growing back past this count would not pay either.
                self._plateau, self._plateau_age = max(obs.workers, need or 0), 0
                gained = None
            elif gained is not None and gained >= MIN_GAIN:
                # Growth paid: shrinking below this count is not tried for a while.
                self._floor, self._floor_age = obs.workers, 0
            elif gained is not None:
                self._plateau, self._plateau_age = max(obs.workers, need or 0), 0
                revert = max(self.min_workers, before_workers, 0 if contended else keep)
                if revert < obs.workers:
                    # The added workers did not raise the rate (the cores are saturated, or
                    # something else limits loading): take them back, they cost memory and
                    # lengthen every pass's first wave.
                    self._plateau = revert
                    self._calm = 0
                    self._cooldown = COOLDOWN_INTERVALS
                    effect = "lowered" if gained < -MIN_GAIN else "did not raise"
                    return self._decide(
                        obs,
                        revert,
                        f"adding workers {effect} the rate ({gained:+.0%}): "
                        f"{obs.workers} -> {revert} workers",
                    )
        can_grow = (
            not obs.limited  # the dispatch window, not the worker count, limits loading
            and obs.workers < self.max_workers
            and obs.memory_ok
            and self._cooldown == 0
            and (self._plateau is None or obs.workers < self._plateau)
        )
        # With the blocked share measured, the pool shrinks straight to the count that fills
        # the cores (zero blocked: one worker per core); without it, by halves.
        fill = need if need is not None else (obs.cores if self._sampled_enough() else None)
        shrink_to = max(
            obs.cores,
            self.min_workers,
            self._floor or 0,
            fill if fill is not None else obs.workers // 2,
        )
        oversubscribed = (
            self.shrink
            and headroom < MIN_HEADROOM
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
            and measured
        ):
            # More workers than cores on saturated cores: they only take turns (and CPU from
            # the consumer). Waiting workers show up as free cores instead, so I/O-bound pools
            # are left alone, and oversubscription that covers workers blocked inside their
            # samples is kept. A shrink to the measured need is not judged (the removed
            # workers only queued for the cores; idle cores would call them back); a halving
            # is, on the rate.
            self._calm = 0
            self._trial = ("shrink", obs.workers, rate, blocked) if fill is None else None
            self._cooldown = COOLDOWN_INTERVALS
            workers = shrink_to
            why = f", workers blocked {blocked or 0:.0%} of their loading time" if fill else ""
            reason = (
                f"{obs.workers} workers on {obs.cores} saturated cores{why}: "
                f"{obs.workers} -> {workers} workers"
            )
        elif wait > STARVED and can_grow:
            self._calm = 0
            step = 0
            why = ""
            # Double at most, quadruple when the consumer mostly waits.
            cap = obs.workers * (3 if wait > SEVERE else 1)
            if need is not None and obs.workers < need:
                # The cores idle while workers block: go straight to the count that fills them
                # (no further than the cores' measured idle time calls for).
                grow_to = self._growth_need(obs, need)
                if grow_to > obs.workers:
                    step = min(grow_to - obs.workers, cap)
                    why = f"workers blocked {blocked or 0:.0%} of their loading time"
            elif headroom >= MIN_HEADROOM:
                # How many more workers the free CPU feeds, at this per-worker CPU use; a
                # worker that mostly waits (I/O) uses little, so this grows past the cores.
                room = headroom / max(cpu_per_worker, 0.05)
                step = max(1, min(math.ceil(room / 2), cap))
                why = f"{headroom:.1f} cores free"
            elif fill is None and (gained is None or gained >= MIN_GAIN):
                # Saturated cores, and the blocked share unknown: probe one more worker (with
                # the share known, workers past the need would only queue for the cores).
                # Workers that mostly wait (I/O) cost little CPU: double them while it pays.
                waits = cpu_per_worker < WAITING_WORKER_CPU
                step = obs.workers if waits and gained else 1
                why = "the last workers added raised the rate" if gained else "probing"
            if step:
                workers = min(self.max_workers, obs.workers + step)
                self._trial = ("grow", obs.workers, rate, blocked)
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
        return self._decide(obs, workers, reason)

    def _fill_need(self, obs: Observation) -> tuple[int | None, float | None]:
        """The workers that keep the cores busy while workers block, and the blocked share.

        The share is the part of their loading time that workers spend blocked, measured
        against the time loading would take on cores of their own (running plus blocked; time
        queued for a core is what oversubscription adds), over the spans of batches the
        workers sampled, in decaying sums over about ``1 / (1 - BLOCKED_DECAY)`` intervals:
        one interval holds few spans. The need is :func:`workers_to_fill` for that share, or
        None while fewer than :data:`BLOCKED_MIN_SPANS` (decayed) were sampled (the share
        is None then too) or none blocked.
        """
        blocked, running, count = self._blocked
        if obs.blocked_s is not None and obs.running_s is not None:
            blocked = BLOCKED_DECAY * blocked + obs.blocked_s
            running = BLOCKED_DECAY * running + obs.running_s
            count = BLOCKED_DECAY * count + max(1, obs.sampled)
            self._blocked = (blocked, running, count)
        if obs.consumer_cpu_s is not None:
            used, wall = self._consumer
            self._consumer = (
                BLOCKED_DECAY * used + obs.consumer_cpu_s,
                BLOCKED_DECAY * wall + obs.wall_s,
            )
        if not self._sampled_enough():
            return None, None
        if blocked <= 0:
            return None, 0.0
        share = blocked / (blocked + running)
        return workers_to_fill(self._loading_cores(obs.cores), share, cap=self.max_workers), share

    def assume_blocked(self, share: float) -> None:
        """Start from a blocked share measured before any worker ran (the backend probe's
        serial pass), worth :data:`BLOCKED_MIN_SPANS` spans of :data:`PRIOR_SPAN_S`: the
        controller acts on it from the first interval (with it, saturated cores and workers
        that do not block call for no trial of one more worker), and measured spans take
        over as it decays."""
        share = min(max(share, 0.0), 1.0)
        seconds = BLOCKED_MIN_SPANS * PRIOR_SPAN_S
        self._blocked = (share * seconds, (1.0 - share) * seconds, float(BLOCKED_MIN_SPANS))

    def take_over(self, other: Controller, at_least: int = 1) -> int:
        """Start from what ``other`` (the controller of a pool this one replaces) measured of
        the workers' blocking and the consumer's CPU, with ``at_least`` workers (bounded by
        :attr:`max_workers`) or the workers that blocked share calls for, whichever is more;
        returns the count to start with (:attr:`workers`)."""
        self.workers = max(self.workers, min(self.max_workers, at_least))
        self._blocked, self._consumer = other._blocked, other._consumer
        blocked, running, _ = self._blocked
        if other._cores is not None and self._sampled_enough() and blocked > 0:
            cores = self._loading_cores(other._cores)
            need = workers_to_fill(cores, blocked / (blocked + running), cap=self.max_workers)
            self.workers = max(self.workers, need)
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
        cores = self._loading_cores(obs.cores)
        share = share_for_idle(cores, obs.workers, idle_s / wall)
        return min(need, workers_to_fill(cores, share, cap=self.max_workers))

    def _loading_cores(self, cores: int) -> float:
        """Of ``cores``, those the main process leaves to loading (at least one), decayed as
        the blocked share is: the workers fill those, not the ones the training loop runs on."""
        used, wall = self._consumer
        if wall <= 0:
            return float(cores)
        return max(1.0, cores - used / wall)

    def _sampled_enough(self) -> bool:
        """Whether enough spans were sampled for the blocked share to be acted on."""
        return self._blocked[2] >= BLOCKED_MIN_SPANS

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

    def _prefetch_for(self, obs: Observation) -> tuple[int, str]:
        """The prefetch depth for the latency spread, with hysteresis on the way down."""
        if not (self.tune_prefetch and obs.latency_p50_s and obs.latency_p95_s):
            return self.prefetch, ""
        spread = obs.latency_p95_s / max(obs.latency_p50_s, 1e-6)
        want = min(MAX_PREFETCH, max(MIN_PREFETCH, math.ceil(spread)))
        if want >= self.prefetch:
            self._lower_wants = []
            if want == self.prefetch:
                return self.prefetch, ""
        else:
            self._lower_wants.append(want)
            if len(self._lower_wants) < PREFETCH_CALM_INTERVALS:
                return self.prefetch, ""
            want = max(self._lower_wants)  # the deepest still wanted lately
            self._lower_wants = []
        return want, f"batch latency p95/p50 = {spread:.1f}: prefetch {self.prefetch} -> {want}"

    def _decide(self, obs: Observation, workers: int, reason: str) -> Decision | None:
        prefetch, note = self._prefetch_for(obs)
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
