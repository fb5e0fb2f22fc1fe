"""The bench harness: measure the ideal, search torch's grid, then time contenders alternately.

For each workload, in one process tree:

1. build the dataset (generating data on first use) and measure the single-process per-sample
   cost, which gives this machine's ideal (:class:`~stoker.bench._stats.Ideal`);
2. ``steady`` workloads: run torch's grid (``num_workers`` x ``prefetch_factor``, short runs)
   to find its best configuration and its better ``prefetch_factor`` at stoker's worker count;
3. for each repeat, for each contender (the order rotates every repeat so no contender always
   runs first or last): build the loader, warm it up (workers started, a few batches through),
   time one run, and shut it down before the next contender starts.

A timed run iterates ``iter(loader)`` and passes every batch to
:func:`~stoker._commands.step.consume` (one read per 4 KiB page of every tensor).
"""

from __future__ import annotations

import gc
import itertools
import time
from collections.abc import Iterable, Iterator
from typing import Any

import torch.utils.data as tud

from stoker._commands.step import consume
from stoker.bench._contenders import (
    ContenderSpec,
    build_loader,
    close_loader,
    merge,
    optional_contenders,
    standard_contenders,
)
from stoker.bench._measure import Meter, TreeMeter
from stoker.bench._plan import Plan, Progress, Report, SeededSampler
from stoker.bench._ramp import RAMP_STARTS, REACH, measure_ramp, ramps_planned
from stoker.bench._result import ContenderResult, GridPoint, Ramp, RunSample, WorkloadResult
from stoker.bench._stats import Ideal, median
from stoker.bench._workloads import Workload
from stoker.errors import ConfigError

__all__ = [
    "Plan",
    "Progress",
    "Report",
    "SeededSampler",
    "bench_workload",
    "measure_ideal",
]

# Seconds a child process may take to exit after its loader is closed.
CHILD_EXIT_S = 5.0
CHILD_POLL_S = 0.02
# A time-bounded run's sampler holds this many times the samples the ideal rate would
# deliver in the run time (the run stops at the time limit long before it runs out).
RUN_SAMPLES_HEADROOM = 10
# Indices the ideal's measurement may draw.
ENDLESS_SAMPLES = 10**8
# Batches the ideal's single-process measurement times at least.
IDEAL_MIN_BATCHES = 3


def _sampler(
    dataset: Any, workload: Workload, seed: int, samples: int, warmup: int | None
) -> SeededSampler | None:
    if isinstance(dataset, tud.IterableDataset):
        return None
    return SeededSampler(len(dataset), workload.samples_per_run or samples, seed, warmup)


def measure_ideal(dataset: Any, workload: Workload, cores: int, seconds: float) -> Ideal:
    """Single-process cost of fetching and collating samples -> this machine's ideal.

    After one warm-up batch, fetches whole batches (``dataset[i]`` then ``default_collate``)
    until ``seconds`` have passed and at least :data:`IDEAL_MIN_BATCHES` batches are done,
    timing CPU (all threads of the process) and wall time.
    """
    if isinstance(dataset, tud.IterableDataset):
        source: Iterator[Any] = iter(dataset)

        def fetch(n: int) -> list[Any]:
            return list(itertools.islice(source, n))
    else:
        order = iter(SeededSampler(len(dataset), ENDLESS_SAMPLES, seed=-1))

        def fetch(n: int) -> list[Any]:
            return [dataset[next(order)] for _ in range(n)]

    tud.default_collate(fetch(workload.batch_size))  # warm-up: first-touch costs
    samples = batches = 0
    wall0, cpu0 = time.perf_counter(), time.process_time()
    while True:
        items = fetch(workload.batch_size)
        if not items:
            break
        tud.default_collate(items)
        samples, batches = samples + len(items), batches + 1
        if time.perf_counter() - wall0 >= seconds and batches >= IDEAL_MIN_BATCHES:
            break
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    if samples == 0:
        raise ConfigError(f"workload {workload.name!r}: the dataset yielded no samples.")
    return Ideal.from_measurement(
        cores=cores,
        cpu_s=cpu,
        wall_s=wall,
        samples=samples,
        note=workload.ideal_note,
        is_limit=workload.ideal_is_limit,
    )


def _wait_children_exit(baseline: set[int]) -> None:
    deadline = time.monotonic() + CHILD_EXIT_S
    while TreeMeter.children_now() - baseline and time.monotonic() < deadline:
        time.sleep(CHILD_POLL_S)


def _iterate(
    loader: Iterable[Any], *, min_batches: int, seconds: float | None, t0: float
) -> tuple[int, int, float, float]:
    """Consume batches; return (samples, batches, first_batch_s, seconds to the last one).

    ``loader`` may be an epoch's iterator: the iteration then goes on where it stands.
    """
    samples = batches = 0
    first = last = 0.0
    it = iter(loader)
    try:
        for batch in it:
            samples += consume(batch)
            del batch
            batches += 1
            last = time.perf_counter() - t0
            if batches == 1:
                first = last
            if seconds is not None and last >= seconds and batches >= min_batches:
                break
    finally:
        del it
    return samples, batches, first, last


def _timed_run(
    spec: ContenderSpec,
    dataset: Any,
    workload: Workload,
    plan: Plan,
    *,
    seed: int,
    run_s: float,
    ideal: Ideal,
    rounds: int = 2,
) -> RunSample:
    """Build, warm up, time one run (or ``workload.epochs`` epochs), shut down.

    The warm-up (``steady`` mode) is a complete short pass of one batch per worker, so that
    every worker has started and no warm-up work is still in flight when the timed pass
    starts. A time-bounded run lasts ``run_s`` and at least ``rounds`` batches per worker
    (whole rounds, so that the last round is not half empty), timed after the epoch's first
    ``plan.fill_s`` seconds (the pipeline's fill; the first batch's latency is measured from
    ``iter()``).
    """
    baseline = TreeMeter.children_now()
    steady = workload.mode == "steady"
    bs = workload.batch_size
    if steady:
        samples = max(
            8 * bs, int(ideal.samples_per_s * (run_s + plan.fill_s) * RUN_SAMPLES_HEADROOM)
        )
        first_pass = bs * max(1, spec.num_workers)
        if spec.auto:  # warm up by time: the controller settles
            first_pass = max(
                first_pass, int(ideal.samples_per_s * plan.auto_settle_s * RUN_SAMPLES_HEADROOM)
            )
        warmup: int | None = first_pass
    else:  # one epoch = one pass over the dataset
        samples, warmup = (0 if isinstance(dataset, tud.IterableDataset) else len(dataset)), None
    sampler = _sampler(dataset, workload, seed, samples, warmup)
    loader = build_loader(spec, dataset, bs, sampler, plan.multiprocessing_context)
    min_batches = rounds * max(1, spec.num_workers)
    time_bound = run_s if workload.samples_per_run is None else None
    try:
        if steady:
            # Iterable datasets warm up by time, as does num_workers="auto" (it settles).
            warm_s = plan.auto_settle_s if spec.auto else None
            if sampler is None:
                warm_s = max(warm_s or 0.0, plan.warmup_s)
            _iterate(loader, min_batches=1, seconds=warm_s, t0=time.perf_counter())
        epochs = workload.epochs if workload.mode == "epochs" else 1
        firsts: list[float] = []
        samples = batches = 0
        source: Iterable[Any] = loader
        filled: float | None = None
        if steady and time_bound is not None and plan.fill_s > 0:
            # The epoch starts untimed: the pipeline fills (see Plan.fill_s).
            start = time.perf_counter()
            source = iter(loader)
            filled = _iterate(source, min_batches=1, seconds=plan.fill_s, t0=start)[2]
        own0 = _monitor_overhead(loader)
        with Meter(baseline) as meter:
            t0 = time.perf_counter()
            for _ in range(epochs):
                start = time.perf_counter()
                s, b, first, _ = _iterate(
                    source,
                    min_batches=min_batches,
                    seconds=None if workload.mode == "epochs" else time_bound,
                    t0=start,
                )
                samples, batches = samples + s, batches + b
                firsts.append(first if filled is None else filled)
            seconds = time.perf_counter() - t0
        del source
        own1 = _monitor_overhead(loader)
    finally:
        close_loader(loader)
        del loader
        gc.collect()
        _wait_children_exit(baseline)
    usage = meter.usage
    assert usage is not None  # set by Meter.__exit__
    return RunSample(
        seconds=seconds,
        samples=samples,
        batches=batches,
        first_batch_s=firsts[0],
        main_cpu_s=usage.main_cpu_s,
        tree_cpu_s=usage.tree_cpu_s,
        peak_pss_bytes=usage.peak_pss_bytes,
        epoch_first_batch_s=tuple(firsts) if workload.mode == "epochs" else (),
        monitor_overhead_s=own1 - own0 if own0 is not None and own1 is not None else None,
    )


def _monitor_overhead(loader: Any) -> float | None:
    """Bookkeeping seconds so far of a loader wrapped in ``stoker.watch``, else None."""
    summary = getattr(loader, "summary", None)
    return float(summary().overhead_s) if callable(summary) else None


def _describe(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".strip()
    first_line = text.splitlines()[0] if text else type(exc).__name__
    return first_line[:200]


def _search_grid(
    dataset: Any, workload: Workload, plan: Plan, ideal: Ideal, progress: Report
) -> list[GridPoint]:
    points = []
    for spec in plan.grid():
        try:
            run = _timed_run(
                spec, dataset, workload, plan, seed=0, run_s=plan.grid_run_s, ideal=ideal, rounds=1
            )
            point = GridPoint(spec.num_workers, spec.prefetch_factor, run.samples_per_s)
        except Exception as exc:  # a configuration that fails is reported, not fatal
            point = GridPoint(spec.num_workers, spec.prefetch_factor, None, _describe(exc))
        points.append(point)
        rate = f"{point.samples_per_s:,.0f} samples/s" if point.samples_per_s else point.error
        progress(f"{workload.name}: grid {spec.name}: {rate}", 1)
    return points


def _contenders(
    workload: Workload, plan: Plan, grid: list[GridPoint]
) -> tuple[list[ContenderSpec], list[str]]:
    notes: list[str] = []
    if workload.mode == "epochs":
        nw = plan.stoker_workers
        specs = [
            ContenderSpec("torch", 0, roles=("torch-nw0",)),
            ContenderSpec("torch", nw, 2, False, roles=("torch-same",)),
            ContenderSpec("torch", nw, 2, True, roles=("torch-persistent",)),
            ContenderSpec("stoker", nw, roles=("stoker",)),
        ]
        notes.append(
            "fresh = persistent_workers=False (torch's default): workers start again every epoch"
        )
        return specs, notes
    ok = [p for p in grid if p.samples_per_s is not None]
    best_point = max(ok, key=lambda p: p.samples_per_s or 0.0, default=None)
    best = None
    if best_point is not None:
        best = ContenderSpec(
            "torch",
            best_point.num_workers,
            best_point.prefetch_factor if best_point.num_workers else None,
            True if best_point.num_workers else None,
        )
    at_same = [p for p in ok if p.num_workers == plan.stoker_workers]
    same_pf = max(at_same, key=lambda p: p.samples_per_s or 0.0).prefetch_factor if at_same else 2
    specs = standard_contenders(
        plan.cores,
        plan.stoker_workers,
        best,
        same_pf or 2,
        stoker_auto=plan.stoker_auto,
        stoker_watched=plan.stoker_watched,
    )
    extra, missing = optional_contenders(plan.stoker_workers)
    notes.append(plan.grid_note)
    notes.extend(missing)
    return merge(specs + extra), notes


def bench_workload(
    workload: Workload, plan: Plan, *, quick: bool, progress: Report | None = None
) -> WorkloadResult:
    """Measure one workload (see the module docstring for the procedure).

    Args:
        workload: what to measure.
        plan: how long and how often.
        quick: passed to ``workload.make_dataset``.
        progress: called with a message and a step count as the work advances.

    Returns:
        The workload's result; a workload whose dataset cannot be built comes back with
        ``error`` set, and a contender that fails comes back with its ``error`` set.
    """
    report = progress or (lambda message, steps: None)
    base: dict[str, Any] = {
        "name": workload.name,
        "description": workload.description,
        "batch_size": workload.batch_size,
        "mode": workload.mode,
    }
    try:
        dataset = workload.make_dataset(quick)
        ideal = measure_ideal(dataset, workload, plan.cores, plan.ideal_s)
    except (ConfigError, ImportError, OSError) as exc:
        report(f"{workload.name}: skipped ({_describe(exc)})", 1)
        return WorkloadResult(**base, ideal=None, contenders=(), error=_describe(exc))
    report(f"{workload.name}: ideal {ideal.samples_per_s:,.0f} samples/s", 1)
    grid = _search_grid(dataset, workload, plan, ideal, report) if workload.mode == "steady" else []
    specs, notes = _contenders(workload, plan, grid)
    runs: dict[int, list[RunSample]] = {i: [] for i in range(len(specs))}
    errors: dict[int, str] = {}
    for r in range(plan.repeats):
        order = [(r + k) % len(specs) for k in range(len(specs))]
        for i in order:
            spec = specs[i]
            if i in errors:
                report(f"{workload.name}: {spec.name}: failed earlier", 1)
                continue
            try:
                sample = _timed_run(
                    spec, dataset, workload, plan, seed=r + 1, run_s=plan.run_s, ideal=ideal
                )
            except Exception as exc:  # reported in the table; the others still run
                errors[i] = _describe(exc)
                report(f"{workload.name}: {spec.name}: failed ({errors[i]})", 1)
                continue
            runs[i].append(sample)
            report(
                f"{workload.name}: {spec.name} run {r + 1}/{plan.repeats}: "
                f"{sample.samples_per_s:,.0f} samples/s",
                1,
            )
    ramps: tuple[Ramp, ...] = ()
    auto = next((i for i, s in enumerate(specs) if s.auto and runs[i]), None)
    if ramps_planned(workload, plan) and auto is not None:
        reference = median([r.samples_per_s for r in runs[auto]])
        ramps = tuple(
            _ramp(dataset, workload, plan, start, reference, report) for start in RAMP_STARTS
        )
    contenders = tuple(
        ContenderResult(
            name=s.name,
            library=s.library,
            roles=s.roles,
            config=s.config,
            runs=tuple(runs[i]),
            error=errors.get(i),
        )
        for i, s in enumerate(specs)
    )
    return WorkloadResult(
        **base,
        ideal=ideal,
        contenders=contenders,
        grid=tuple(grid),
        notes=tuple(n for n in notes if n),
        ramps=ramps,
    )


def _ramp(
    dataset: Any, workload: Workload, plan: Plan, start: int, reference: float, report: Report
) -> Ramp:
    baseline = TreeMeter.children_now()
    try:
        ramp = measure_ramp(
            dataset, workload, start, plan.ramp_s, reference, plan.multiprocessing_context
        )
    except Exception as exc:  # reported with the workload; the bench goes on
        ramp = Ramp(start, 0.0, reference, None, None, 0, "?", error=_describe(exc))
    finally:
        _wait_children_exit(baseline)
    if ramp.error:
        said = f"failed ({ramp.error})"
    elif ramp.reach_s is None:
        said = f"did not reach {REACH:.0%} of {reference:,.0f} samples/s in {ramp.seconds:.1f} s"
    else:
        said = f"{REACH:.0%} of {reference:,.0f} samples/s after {ramp.reach_s:.1f} s"
    report(f"{workload.name}: auto ramp from {start} workers: {said}", 1)
    return ramp
