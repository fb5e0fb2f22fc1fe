"""The online controller on simulated producers and consumers (no real timing)."""

from __future__ import annotations

from stoker._autotune import CALM_INTERVALS, MAX_PREFETCH, Controller, Observation


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


def test_prefetch_follows_latency_spread():
    ctrl = Controller(start=2, max_workers=2)
    obs = Observation(1.0, 0.0, 1.0, 1.0, 2, 2, latency_p50_s=0.01, latency_p95_s=0.2)
    decision = ctrl.observe(obs)
    assert decision is not None and decision.prefetch == MAX_PREFETCH
    calm = Observation(1.0, 0.0, 1.0, 1.0, 2, 2, latency_p50_s=0.01, latency_p95_s=0.011)
    decision = ctrl.observe(calm)
    assert decision is not None and decision.prefetch == 2


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
    from stoker._autotune import PLATEAU_INTERVALS

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
