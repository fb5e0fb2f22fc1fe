"""The online controller on simulated producers and consumers (no real timing)."""

from __future__ import annotations

import itertools
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stoker.autotune._controller import (
    CALM_INTERVALS,
    EVAL_BATCHES,
    EVAL_INTERVALS,
    FILL_TARGET,
    MAX_PREFETCH,
    PREFETCH_CALM_INTERVALS,
    Controller,
    Observation,
    busy_cores,
    share_for_idle,
    workers_to_fill,
)
from stoker.autotune._fill import OVERSUBSCRIBE_MIN_GAIN


class SimulatedPipeline:
    """A loader whose workers each take `cpu_s + wait_s` per batch, on `cores` cores,
    feeding a consumer that needs `step_s` per batch."""

    def __init__(self, cpu_s: float, wait_s: float, step_s: float, cores: int) -> None:
        self.cpu_s, self.wait_s, self.step_s, self.cores = cpu_s, wait_s, step_s, cores

    def interval(self, workers: int, wall: float = 1.0) -> Observation:
        per_batch = self.cpu_s + self.wait_s
        # CPU contention: workers' CPU demand beyond the cores slows everyone down.
        demand = workers * self.cpu_s / per_batch
        slowdown = max(1.0, demand / self.cores)
        supply = workers / (self.cpu_s * slowdown + self.wait_s)  # batches per second
        supply = min(supply, self.cores / self.cpu_s)  # never more CPU than the cores
        demand_rate = 1.0 / self.step_s
        rate = min(supply, demand_rate)
        wait = max(0.0, 1.0 - rate * self.step_s) * wall
        busy = min(workers * wall, rate * wall * (self.cpu_s * slowdown + self.wait_s))
        cpu = min(float(self.cores), rate * self.cpu_s) * wall
        return Observation(
            wall, wait, busy, cpu, workers, self.cores, 0.01, 0.012, batches=round(rate * wall)
        )

    def rate(self, workers: int) -> float:
        obs = self.interval(workers)
        return (obs.wall_s - obs.wait_s) / self.step_s


def run(ctrl: Controller, pipe: SimulatedPipeline, intervals: int) -> int:
    workers = ctrl.workers
    for _ in range(intervals):
        decision = ctrl.observe(pipe.interval(workers))
        if decision is not None:
            workers = decision.workers
    return workers


def test_cpu_bound_grows_to_the_cores_and_not_beyond():
    pipe = SimulatedPipeline(cpu_s=0.01, wait_s=0.0, step_s=0.001, cores=4)
    ctrl = Controller(start=1, max_workers=32)
    workers = run(ctrl, pipe, 20)
    assert 4 <= workers <= 5
    assert pipe.rate(workers) >= 0.95 * max(pipe.rate(n) for n in range(1, 33))


def test_io_bound_grows_past_the_cores():
    pipe = SimulatedPipeline(cpu_s=0.0005, wait_s=0.005, step_s=0.0002, cores=2)
    ctrl = Controller(start=1, max_workers=32)
    workers = run(ctrl, pipe, 20)
    assert workers > 8
    assert pipe.rate(workers) >= 0.95 * max(pipe.rate(n) for n in range(1, 33))


def test_fed_consumer_sheds_idle_workers_down_to_what_it_needs():
    pipe = SimulatedPipeline(cpu_s=0.01, wait_s=0.0, step_s=0.02, cores=8)
    ctrl = Controller(start=16, max_workers=16)
    workers = run(ctrl, pipe, 60)
    assert 1 <= workers <= 3
    assert pipe.interval(workers).wait_s == 0


def test_no_change_without_reason_and_removal_needs_calm_intervals():
    pipe = SimulatedPipeline(cpu_s=0.01, wait_s=0.0, step_s=0.05, cores=8)
    ctrl = Controller(start=4, max_workers=8)
    for _ in range(CALM_INTERVALS - 1):
        assert ctrl.observe(pipe.interval(4)) is None
    decision = ctrl.observe(pipe.interval(4))
    assert decision is not None and decision.workers == 3 and "busy" in decision.reason


def test_memory_budget_stops_growth():
    pipe = SimulatedPipeline(cpu_s=0.01, wait_s=0.0, step_s=0.001, cores=8)
    ctrl = Controller(start=2, max_workers=16)
    obs = pipe.interval(2)
    tight = Observation(**{**obs.__dict__, "memory_ok": False})
    assert ctrl.observe(tight) is None


def test_prefetch_follows_latency_spread_up_at_once_and_down_when_it_lasts():
    ctrl = Controller(start=2, max_workers=2)
    obs = Observation(1.0, 0.0, 1.0, 1.0, 2, 2, latency_p50_s=0.01, latency_p95_s=0.2)
    decision = ctrl.observe(obs)
    assert decision is not None and decision.prefetch == MAX_PREFETCH
    calm = Observation(1.0, 0.0, 1.0, 1.0, 2, 2, latency_p50_s=0.01, latency_p95_s=0.011)
    for _ in range(PREFETCH_CALM_INTERVALS - 1):
        assert ctrl.observe(calm) is None
    decision = ctrl.observe(calm)
    assert decision is not None and decision.prefetch == 2


def test_a_spread_hovering_at_a_boundary_does_not_flip_the_prefetch_depth():
    ctrl = Controller(start=2, max_workers=2)
    changes = []
    for i in range(100):  # p95/p50 alternates 7.2 and 6.8: wants 8, then 7, then 8...
        p95 = 0.072 if i % 2 == 0 else 0.068
        obs = Observation(1.0, 0.0, 1.0, 1.0, 2, 2, latency_p50_s=0.01, latency_p95_s=p95)
        decision = ctrl.observe(obs)
        if decision is not None:
            changes.append(decision.prefetch)
    assert changes == [8]


def test_bounds_are_respected():
    ctrl = Controller(start=100, max_workers=4, min_workers=2)
    assert ctrl.workers == 4
    assert Controller(start=0, max_workers=4, min_workers=2).workers == 2


class ContendedPipeline:
    """Loading that peaks at `best` workers on saturated cores: each worker past it takes CPU
    from the consumer (the main process), and the delivered rate falls by 5% per worker."""

    def __init__(self, best: int = 2, peak: float = 1000.0, cores: int = 2) -> None:
        self.best, self.peak, self.cores = best, peak, cores

    def rate(self, workers: int) -> float:
        if workers <= self.best:
            return self.peak * workers / self.best
        return self.peak * (1 - 0.05 * (workers - self.best))

    def interval(self, workers: int, wall: float = 1.0) -> Observation:
        rate = self.rate(workers)
        # The consumer always waits a little (receiving is part of its wait) and the cores
        # are always full.
        return Observation(
            wall,
            0.3 * wall,
            0.9 * workers * wall,
            self.cores * wall,
            workers,
            self.cores,
            0.01,
            0.012,
            batches=round(rate * wall),
        )


def test_workers_that_lower_the_rate_on_saturated_cores_are_taken_back():
    pipe = ContendedPipeline(best=2)
    ctrl = Controller(start=2, max_workers=16)
    history = []
    workers = ctrl.workers
    for _ in range(30):
        decision = ctrl.observe(pipe.interval(workers))
        if decision is not None:
            workers = decision.workers
        history.append(workers)
    # It probes one more worker, sees the rate fall, goes back, and stays there.
    assert 3 in history and history[-1] == 2 and history[-20:] == [2] * 20
    assert any("lowered the rate" in d.reason for d in ctrl.history)


def test_a_plateau_expires_so_that_the_controller_probes_again():
    from stoker.autotune._controller import PLATEAU_INTERVALS

    pipe = ContendedPipeline(best=2)
    ctrl = Controller(start=2, max_workers=16)
    workers = ctrl.workers
    probes = 0
    for _ in range(3 * PLATEAU_INTERVALS):
        decision = ctrl.observe(pipe.interval(workers))
        if decision is not None:
            probes += decision.workers > workers
            workers = decision.workers
    assert 2 <= probes <= 4 and workers == 2


class OversubscribedPipeline:
    """CPU-bound loading on saturated cores: `best` workers deliver the most; each worker past
    it costs `loss` of the rate (context switches, cache thrash, CPU taken from the consumer);
    each worker short of it loses its share. The consumer waits a little whatever the count.
    `batches_per_s` scales the batches an interval counts (slow batches: few per interval)."""

    def __init__(self, best: int = 2, cores: int = 2, loss: float = 0.03, peak: float = 20.0):
        self.best, self.cores, self.loss, self.peak = best, cores, loss, peak

    def rate(self, workers: int) -> float:
        if workers <= self.best:
            return self.peak * workers / self.best
        return self.peak * max(0.2, 1 - self.loss * (workers - self.best))

    def interval(self, workers: int, wall: float = 0.2) -> Observation:
        rate = self.rate(workers)
        return Observation(
            wall,
            0.1 * wall,
            1.0 * workers * wall,  # every worker busy: runnable, taking turns on the cores
            self.cores * wall,
            workers,
            self.cores,
            0.05,
            0.06,
            batches=round(rate * wall),
            idle_cores=0.0,
        )


def _drive(ctrl: Controller, pipe, intervals: int) -> list[int]:
    workers, history = ctrl.workers, []
    for _ in range(intervals):
        decision = ctrl.observe(pipe.interval(workers))
        if decision is not None:
            workers = decision.workers
        history.append(workers)
    return history


def test_an_oversubscribed_pool_is_halved_down_to_the_cores():
    pipe = OversubscribedPipeline(best=2, cores=2)
    ctrl = Controller(start=16, max_workers=16)
    history = _drive(ctrl, pipe, 40)  # fewer than PLATEAU_INTERVALS: no probe back up yet
    assert history[-1] == 2 and history[-20:] == [2] * 20
    assert 8 in history and 4 in history  # by halving, each step judged
    assert any("saturated cores" in d.reason for d in ctrl.history)
    # Four batches an interval: each trial waited for EVAL_BATCHES before the next change.
    changes = [i for i, (a, b) in enumerate(itertools.pairwise(history)) if a != b]
    per_interval = max(round(pipe.rate(n) * 0.2) for n in range(1, 17))
    assert all(b - a >= EVAL_BATCHES // per_interval for a, b in itertools.pairwise(changes))


def test_a_shrink_that_lowers_the_rate_is_taken_back_and_retried_ever_more_rarely():
    # Waiting workers that saturate the cores: 8 deliver more than 4 (loss < 0: more is better).
    pipe = OversubscribedPipeline(best=8, cores=2, loss=0.0)
    ctrl = Controller(start=8, max_workers=8)
    history = _drive(ctrl, pipe, 1000)
    shrinks = sum(1 for a, b in itertools.pairwise(history) if b < a)
    assert history[-1] == 8
    assert 2 <= shrinks <= 5  # tried again after 25, 50, 100, 200... intervals, not every 25
    assert all("fewer workers lowered the rate" in d.reason for d in ctrl.history if d.workers == 8)
    time_at_8 = history.count(8) / len(history)
    assert time_at_8 > 0.9


def test_an_io_bound_pool_with_free_cores_is_not_shrunk():
    pipe = SimulatedPipeline(cpu_s=0.0005, wait_s=0.005, step_s=0.0002, cores=2)
    ctrl = Controller(start=16, max_workers=32)
    history = run(ctrl, pipe, 40)
    assert history >= 16


def test_thread_pools_are_not_halved_for_saturating_the_cores():
    # Threads that wait on I/O saturate the cores usefully; the loader passes shrink=False.
    pipe = OversubscribedPipeline(best=2, cores=2)
    ctrl = Controller(start=16, max_workers=16, shrink=False)
    assert _drive(ctrl, pipe, 40) == [16] * 40


def test_workers_to_fill_matches_the_closed_form_for_one_core():
    # One core is busy unless every worker is blocked: 1 - blocked**n >= FILL_TARGET.
    for blocked in (0.1, 0.3, 0.5, 0.8):
        n = math.ceil(math.log(1 - FILL_TARGET) / math.log(blocked))
        assert workers_to_fill(1, blocked) == n
    assert workers_to_fill(2, 0.0) == 2 and workers_to_fill(8, 0.0) == 8
    assert workers_to_fill(2, 0.43) == 8
    assert workers_to_fill(2, 1.0, cap=40) == 40


@settings(max_examples=100, deadline=None)
@given(cores=st.integers(1, 16), blocked=st.floats(0.0, 0.95))
def test_workers_to_fill_is_the_fewest_that_reach_the_target(cores, blocked):
    def busy_share(n: int) -> float:
        awake = 1 - blocked
        return (
            sum(
                math.comb(n, k) * awake**k * blocked ** (n - k) * min(k, cores)
                for k in range(n + 1)
            )
            / cores
        )

    n = workers_to_fill(cores, blocked)
    filled = next(m for m in itertools.count(cores) if busy_share(m) >= FILL_TARGET - 1e-9)
    if filled > 256:
        assert n == 256  # the cap
    elif busy_share(filled) < (1 + OVERSUBSCRIBE_MIN_GAIN) * busy_share(cores):
        assert n == cores  # oversubscribing would add less than a trial can see
    else:
        assert n == filled and busy_share(n - 1) < FILL_TARGET
    assert workers_to_fill(cores, min(0.95, blocked + 0.05)) >= n  # more blocking, more workers


class BlockingPipeline(OversubscribedPipeline):
    """Workers blocked inside their samples a `blocked` share of their loading time: the cores
    do E[min(awake, cores)] work, so the rate grows up to workers_to_fill and flattens past it.
    The cores the awake workers leave read as idle."""

    def __init__(self, blocked: float, cores: int = 2, peak: float = 20.0, sampled: bool = True):
        super().__init__(best=cores, cores=cores, peak=peak)
        self.blocked, self.sampled = blocked, sampled

    def rate(self, workers: int) -> float:
        return self.peak * busy_cores(self.cores, self.blocked, workers) / self.cores

    def interval(self, workers: int, wall: float = 0.2) -> Observation:
        base = super().interval(workers, wall)
        busy = busy_cores(self.cores, self.blocked, workers)
        idle = {"cpu_s": busy * wall, "idle_cores": self.cores - busy}
        base = Observation(**{**base.__dict__, **idle})
        if not self.sampled:
            return base
        running = busy * wall
        blocked = running * self.blocked / (1 - self.blocked)
        sampled = {"blocked_s": blocked, "running_s": running, "sampled": workers}
        return Observation(**{**base.__dict__, **sampled})


def test_workers_blocked_in_their_samples_keep_the_oversubscription_that_covers_them():
    blocked = 0.6
    need = workers_to_fill(2, blocked)  # 13 for 2 cores
    history = _drive(Controller(start=16, max_workers=16), BlockingPipeline(blocked), 40)
    assert min(history) >= need and history[-1] == need, history
    # Unsampled (no blocked share known), the same pool is halved below it, and the trial
    # that shows the loss is what brings it back.
    plain = BlockingPipeline(blocked, sampled=False)
    history = _drive(Controller(start=16, max_workers=16), plain, 40)
    assert min(history) < need, history


def test_a_worker_that_would_fill_the_cores_by_less_than_a_trial_can_see_is_not_added():
    # CPU-bound workers that read 2% blocked (descheduled beside the main process): the fill
    # target alone would ask for a third worker on 2 cores, for 2% more busy cores.
    assert busy_cores(2, 0.02, 3) >= FILL_TARGET * 2 > busy_cores(2, 0.02, 2)
    assert workers_to_fill(2, 0.02) == 2
    # The loader starts the controller from the backend probe's share.
    ctrl = Controller(start=2, max_workers=32)
    ctrl.assume_blocked(0.02)
    history = _drive(ctrl, BlockingPipeline(0.02), 40)
    assert set(history) == {2}, history
    # Blocked 10%, a third worker fills 5% more of the cores: it is added.
    need = workers_to_fill(2, 0.1)
    ctrl = Controller(start=2, max_workers=32)
    ctrl.assume_blocked(0.1)
    history = _drive(ctrl, BlockingPipeline(0.1), 40)
    assert history[0] == history[-1] == need > 2, history


class MisleadingPipeline(BlockingPipeline):
    """A blocking pipeline whose delivered rate reads 30% lower at every count above the start,
    as heavy-tailed batches do when a slow sample lands in a trial's window."""

    def __init__(self, blocked: float, start: int) -> None:
        super().__init__(blocked)
        self.start = start

    def interval(self, workers: int, wall: float = 0.2) -> Observation:
        obs = super().interval(workers, wall)
        if workers > self.start:
            obs = Observation(**{**obs.__dict__, "batches": round(0.7 * obs.batches)})
        return obs


def test_blocked_workers_are_grown_straight_to_the_need_and_a_noisy_trial_keeps_them():
    blocked = 0.5
    need = workers_to_fill(2, blocked)
    ctrl = Controller(start=1, max_workers=32)
    history = _drive(ctrl, MisleadingPipeline(blocked, start=1), 30)
    first = history.index(need) if need in history else None
    # By the model, not one worker at a time (each step waits for its evidence: the share
    # must not rise with the workers, or it measured contention).
    assert first is not None and first <= 2 * EVAL_INTERVALS, history
    assert min(history[first:]) >= need, history  # the "lower" rate does not take them back
    assert any("blocked 50%" in d.reason for d in ctrl.history)


class WaitingForEachOther(BlockingPipeline):
    """Thread workers that wait for the GIL (or a lock) as well as in their samples: the
    cores work as for `blocked`, but the workers read as blocked a larger `reads` share (the
    time they wait for each other counts)."""

    def __init__(self, blocked: float, reads: float) -> None:
        super().__init__(blocked)
        self.reads = reads

    def interval(self, workers: int, wall: float = 0.2) -> Observation:
        obs = super().interval(workers, wall)
        running = obs.running_s or 0.0
        blocked = running * self.reads / (1 - self.reads)
        return Observation(**{**obs.__dict__, "blocked_s": blocked})


def test_workers_waiting_for_each_other_are_grown_to_what_the_idle_cores_call_for():
    # Blocked 40% in the samples (6 fill two cores) but reading 70% (13 would): growth goes to
    # the count the measured idle time calls for, not the one the inflated share does.
    real, reads = 0.4, 0.7
    pipe = WaitingForEachOther(real, reads)
    fill, inflated = workers_to_fill(2, real), workers_to_fill(2, reads)
    assert inflated > fill + 4
    ctrl = Controller(start=2, max_workers=32, shrink=False)
    history = _drive(ctrl, pipe, 60)
    assert fill <= history[-1] < inflated, history
    assert pipe.rate(history[-1]) >= 0.95 * pipe.rate(inflated)
    # A pool that arrives with more workers than the cores call for (a process pool handed
    # over to threads) is not grown further.
    history = _drive(Controller(start=12, max_workers=32, shrink=False), pipe, 60)
    assert set(history) == {12}, history


def test_share_for_idle_inverts_busy_cores():
    for cores, workers, blocked in [(2, 1, 0.5), (2, 4, 0.4), (2, 12, 0.62), (1.5, 7, 0.5)]:
        idle = cores - busy_cores(cores, blocked, workers)
        assert abs(share_for_idle(cores, workers, idle) - blocked) < 1e-3
    # Busier than never-blocked workers keep them (other processes on the cores): no share.
    assert share_for_idle(2, 1, 0.5) == 0.0


def test_the_blocked_share_is_not_acted_on_before_enough_batches_were_sampled():
    pipe = BlockingPipeline(0.5)
    ctrl = Controller(start=2, max_workers=32)
    obs = pipe.interval(2)
    one = Observation(**{**obs.__dict__, "sampled": 1, "wait_s": 0.9 * obs.wall_s})
    decision = ctrl.observe(one)  # the start-up burst interval: nothing measured yet
    assert decision is None or "blocked" not in decision.reason
    decision = ctrl.observe(one)
    assert decision is None or "blocked" not in decision.reason


def test_a_shrink_is_judged_against_a_measured_rate_not_the_start_up_burst():
    pipe = OversubscribedPipeline(best=2, cores=2)
    ctrl = Controller(start=16, max_workers=16)
    assert ctrl.observe(pipe.interval(16)) is None  # the burst interval only
    decision = ctrl.observe(pipe.interval(16))
    assert decision is not None and decision.workers == 8
    assert ctrl._trial is not None and ctrl._trial.rate == pipe.interval(16).batches / 0.2


def test_a_measured_share_shrinks_an_oversubscribed_pool_straight_to_the_need_unjudged():
    # CPU-bound (nothing blocked, sampled): 16 -> 2 in one step, where unsampled it halves.
    pipe = BlockingPipeline(0.0)
    ctrl = Controller(start=16, max_workers=16)
    history = _drive(ctrl, pipe, 12)
    assert 8 not in history and history[-1] == 2, history
    assert ctrl.history[0].workers == 2 and "blocked 0%" in ctrl.history[0].reason

    # A shrink the share calls for is no trial: a rate that reads 30% lower below the start
    # does not bring the workers back.
    class Lower(BlockingPipeline):
        def interval(self, workers: int, wall: float = 0.2) -> Observation:
            obs = super().interval(workers, wall)
            if workers < 16:
                obs = Observation(**{**obs.__dict__, "batches": round(0.7 * obs.batches)})
            return obs

    history = _drive(Controller(start=16, max_workers=16), Lower(0.0), 40)
    assert history[-30:] == [2] * 30, history


def test_the_cores_the_main_process_uses_are_not_filled_with_workers():
    # Workers blocked half the time: ten fill two idle cores, nine fill the 1.5 cores a
    # training loop using half a core leaves (the tenth would only queue).
    assert workers_to_fill(2, 0.5) == 10 and workers_to_fill(1.5, 0.5) == 9
    assert workers_to_fill(1.5, 0.0) == 2 and workers_to_fill(1.0, 0.0) == 1

    class Busy(BlockingPipeline):
        def interval(self, workers: int, wall: float = 0.2) -> Observation:
            obs = super().interval(workers, wall)
            return Observation(**{**obs.__dict__, "consumer_cpu_s": 0.5 * wall})

    history = _drive(Controller(start=16, max_workers=16), Busy(0.5), 20)
    assert history[-1] == 9, history
    history = _drive(Controller(start=16, max_workers=16), BlockingPipeline(0.5), 20)
    assert history[-1] == 10, history


def test_no_workers_are_added_while_a_slow_start_window_limits_loading():
    pipe = SimulatedPipeline(cpu_s=0.0005, wait_s=0.005, step_s=0.0002, cores=2)
    ctrl = Controller(start=4, max_workers=32)
    for _ in range(10):
        obs = Observation(**{**pipe.interval(4).__dict__, "limited": True})
        decision = ctrl.observe(obs)
        assert decision is None or decision.workers == 4
    assert run(ctrl, pipe, 10) > 4  # the window lifted: the same waits grow the pool


def _first_change(ctrl: Controller, pipe, intervals: int, limited: bool) -> int | None:
    for _ in range(intervals):
        obs = Observation(**{**pipe.interval(ctrl.workers).__dict__, "limited": limited})
        decision = ctrl.observe(obs)
        if decision is not None and decision.workers != obs.workers:
            return decision.workers
    return None


def test_a_slow_start_waits_for_the_blocked_share_instead_of_halving():
    pipe = OversubscribedPipeline(best=2, cores=2)
    ctrl = Controller(start=16, max_workers=16)
    # Unsampled, no share: no shrink while the window limits; once lifted, halving as before.
    assert _first_change(ctrl, pipe, 10, limited=True) is None
    assert _first_change(ctrl, pipe, 3, limited=False) == 8
    # Sampled, the share arrives within the window: straight to the cores.
    ctrl = Controller(start=16, max_workers=16)
    assert _first_change(ctrl, BlockingPipeline(0.0), 4, limited=True) == 2


def test_a_wavering_share_needs_two_oversubscribed_intervals_to_shrink():
    pipe = BlockingPipeline(0.0)
    ctrl = Controller(start=16, max_workers=16)
    free = Observation(**{**pipe.interval(16).__dict__, "idle_cores": 1.0, "cpu_s": 0.2})
    ctrl.observe(free)  # start-up burst
    for _ in range(5):  # a waiting spell frees the cores every other interval
        decision = ctrl.observe(free)
        assert decision is None or decision.workers >= 16
        assert ctrl.observe(pipe.interval(16)) is None
    assert ctrl.observe(pipe.interval(16)).workers == 2  # type: ignore[union-attr]


class ContendingPipeline(BlockingPipeline):
    """Workers whose blocked share grows with their count (they wait for each other: a lock,
    the memory system) and whose rate falls past the cores: no count covers the blocking."""

    def __init__(self) -> None:
        super().__init__(0.02)

    def interval(self, workers: int, wall: float = 0.2) -> Observation:
        self.blocked = min(0.8, 0.02 + 0.12 * (workers - 1))
        obs = super().interval(workers, wall)
        rate = 20.0 * (1 - 0.08 * max(0, workers - 2))
        return Observation(**{**obs.__dict__, "batches": round(rate * wall)})


def test_blocking_that_grows_with_the_workers_is_judged_and_taken_back():
    ctrl = Controller(start=1, max_workers=32)
    history = _drive(ctrl, ContendingPipeline(), 60)
    # Taken back, and tried again only once the plateau is forgotten (PLATEAU_INTERVALS).
    assert max(history) <= 4 and sum(w > 3 for w in history) < len(history) // 4, history
    assert any("did not raise" in d.reason or "lowered" in d.reason for d in ctrl.history)


def test_a_controller_that_takes_over_a_pool_starts_from_its_measured_share():
    # Processes measured a 50% blocked share; the threads replacing them start with the
    # count that share calls for, however many processes there were.
    old = Controller(start=4, max_workers=4)
    _drive(old, BlockingPipeline(0.5), 10)
    new = Controller(start=4, max_workers=32, shrink=False)
    assert new.take_over(old) == new.workers == workers_to_fill(2, 0.5)
    # Nothing sampled: the count handed over stands.
    assert Controller(start=4, max_workers=32).take_over(Controller(start=4, max_workers=4)) == 4


def _hand_clocked_scaler(monkeypatch) -> tuple[Any, list[float], list[Observation]]:
    """An AutoScaler of a one-thread pool on a hand-driven clock, whose controller records
    what it observes: ``(scaler, clock, observations)``."""
    from stoker.autotune import _scaling

    clock = [0.0]
    monkeypatch.setattr(_scaling, "_clock", lambda: clock[0])
    seen: list[Observation] = []

    class Recorder:
        def observe(self, obs: Observation) -> None:
            seen.append(obs)

    return _scaling.AutoScaler(Recorder(), "thread"), clock, seen  # type: ignore[arg-type]


def test_start_up_ends_at_the_first_delivery_and_the_first_measured_interval_is_short(
    monkeypatch,
):
    """The scaler's schedule, on a hand-driven clock: nothing is measured until a batch was
    delivered; the first interval measured from there is short; the next ones are whole."""
    from types import SimpleNamespace

    from stoker.autotune import _scaling

    scaler, clock, seen = _hand_clocked_scaler(monkeypatch)
    pool = SimpleNamespace(active=[0])

    def step(t: float, delivered: int) -> None:
        clock[0] = t
        scaler.step(pool, wait_s=t, busy_s=0.0, delivered=delivered, on_added=lambda i: None)

    interval = _scaling.CONTROL_INTERVAL_S + 1e-9  # (a whole one, whatever the rounding)
    first = _scaling.CONTROL_INTERVAL_S * _scaling.FIRST_INTERVAL_SHARE + 1e-9
    step(1.0, 0)  # a second of start-up, nothing delivered yet: nothing measured
    step(1.5, 1)  # the first delivery: start-up ends here
    step(1.5 + first / 2, 2)
    assert seen == []
    step(1.5 + first, 3)
    assert len(seen) == 1 and not seen[0].settling
    assert seen[0].wall_s == pytest.approx(first) and seen[0].batches == 2
    step(1.5 + first + interval / 2, 4)
    assert len(seen) == 1
    step(1.5 + first + interval, 5)
    assert len(seen) == 2 and seen[1].wall_s == pytest.approx(interval)


def test_a_new_epoch_is_measured_from_its_first_delivery(monkeypatch):
    """The wait for a new epoch's first batch (its pipeline is empty) and a pause before it
    are not measured: the next observation starts at the epoch's first delivery."""
    from types import SimpleNamespace

    from stoker.autotune import _scaling

    scaler, clock, seen = _hand_clocked_scaler(monkeypatch)
    pool = SimpleNamespace(active=[0])
    waited = [0.0]

    def step(t: float, delivered: int, wait: float = 0.0) -> None:
        clock[0] = t
        waited[0] += wait
        scaler.step(
            pool, wait_s=waited[0], busy_s=0.0, delivered=delivered, on_added=lambda i: None
        )

    interval = _scaling.CONTROL_INTERVAL_S + 1e-9
    step(0.0, 1)  # start-up over
    step(interval, 5)
    step(2 * interval, 9)
    assert len(seen) == 2
    scaler.new_epoch()  # the loop paused 10 s, then the new epoch's first batch took 0.2 s
    waited[0] = 0.0  # (the iterator's wait counts from the epoch's start)
    step(2 * interval + 10.2, 1, wait=0.2)
    assert len(seen) == 2  # the first delivery only starts the measurement again
    step(3 * interval + 10.2, 5)
    assert len(seen) == 3
    assert seen[2].wall_s == pytest.approx(interval) and seen[2].wait_s == 0.0
    assert seen[2].batches == 4


def test_a_prior_share_of_zero_spares_saturated_cores_the_probing_trial():
    """The backend probe measured loading that never blocks: on saturated cores one more
    worker could only queue for them, so none is tried (without the prior, one is, and taken
    back once judged)."""
    pipe = OversubscribedPipeline(best=2, cores=2)
    assert 3 in _drive(Controller(start=2, max_workers=16), pipe, 20)
    ctrl = Controller(start=2, max_workers=16)
    ctrl.assume_blocked(0.0)
    assert _drive(ctrl, pipe, 20) == [2] * 20 and ctrl.history == []


def test_a_prior_share_grows_the_pool_to_its_need_before_any_span_is_sampled():
    blocked = 0.6
    need = workers_to_fill(2, blocked)
    pipe = BlockingPipeline(blocked, sampled=False)
    ctrl = Controller(start=2, max_workers=16)
    ctrl.assume_blocked(blocked)
    history = _drive(ctrl, pipe, 10)
    assert history[-1] == need and history == sorted(history), history
    assert "blocked 60%" in ctrl.history[0].reason


def test_measured_spans_outweigh_the_prior_share():
    # The probe saw waits the workers do not have (the storage was cold then): measured spans
    # take over, and the pool comes back to the cores.
    ctrl = Controller(start=8, max_workers=16)
    ctrl.assume_blocked(0.6)
    history = _drive(ctrl, BlockingPipeline(0.0), 30)
    assert history[-1] == 2, history
