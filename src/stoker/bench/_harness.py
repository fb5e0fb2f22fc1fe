"""The bench harness: measure the ideal, search the grids, then time contenders alternately.

For each workload, in one process tree:

1. build the dataset (generating data on first use) and measure the single-process per-sample
   cost, which gives this machine's ideal (:class:`~stoker.bench._stats.Ideal`);
2. ``steady`` workloads: run torch's grid (``num_workers`` x ``prefetch_factor``, short runs)
   and each installed peer's (SPDL's thread counts, torchdata.nodes' workers x prefetch), no
   larger than torch's, to find each library's best configuration and torch's better
   ``prefetch_factor`` at stoker's worker count;
3. for each repeat, for each contender (the order rotates every repeat so no contender always
   runs first or last): build the loader, warm it up (workers started, a few batches through),
   time one run, and shut it down before the next contender starts (:mod:`._runs`);
4. the ``train`` family (:mod:`._train`): the recommended, same-workers and best contenders
   feed a training step, with the same rotation.
"""

from __future__ import annotations

import dataclasses
import itertools
import time
from collections.abc import Iterator
from typing import Any

import torch
import torch.utils.data as tud

from stoker.bench._contenders import (
    PEER_ORDER_NOTES,
    ContenderSpec,
    installed_peers,
    merge,
    standard_contenders,
)
from stoker.bench._measure import TreeMeter
from stoker.bench._plan import Plan, Progress, Report, SeededSampler
from stoker.bench._ramp import RAMP_STARTS, REACH, measure_ramp, ramps_planned
from stoker.bench._result import (
    ContenderResult,
    GridPoint,
    Ramp,
    RunSample,
    WorkloadResult,
    fastest,
)
from stoker.bench._runs import alternate, describe, timed_run, wait_children_exit
from stoker.bench._stats import Ideal, median
from stoker.bench._train import bench_train, train_roles
from stoker.bench._train_result import TrainTable
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

# Indices the ideal's measurement may draw.
ENDLESS_SAMPLES = 10**8
# Batches the ideal's single-process measurement times at least.
IDEAL_MIN_BATCHES = 3


def measure_ideal(dataset: Any, workload: Workload, cores: int, seconds: float) -> Ideal:
    """Single-process cost of fetching and collating samples -> this machine's ideal.

    After one warm-up batch, fetches whole batches (``dataset[i]`` then ``default_collate``)
    until ``seconds`` have passed and at least :data:`IDEAL_MIN_BATCHES` batches are done,
    timing CPU (all threads of the process) and wall time, with one intra-op thread as in a
    loader's worker: idle intra-op threads spin, and counting that CPU put the ideal below
    what the loaders reached (117% of it on jpeg, 2 cores; 206% on 16).
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _measure_ideal(dataset, workload, cores, seconds)
    finally:
        torch.set_num_threads(threads)


def _measure_ideal(dataset: Any, workload: Workload, cores: int, seconds: float) -> Ideal:
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


def _search_grid(
    dataset: Any, workload: Workload, plan: Plan, ideal: Ideal, progress: Report
) -> list[GridPoint]:
    points = []
    for spec in plan.grid():
        try:
            run = timed_run(
                spec,
                dataset,
                workload,
                plan,
                seed=0,
                run_s=plan.grid_run_s,
                ideal=ideal,
                rounds=1,
                warm_up=plan.warm_up,
            )
            point = GridPoint(
                spec.num_workers, spec.prefetch_factor, run.samples_per_s, library=spec.library
            )
        except Exception as exc:  # a configuration that fails is reported, not fatal
            point = GridPoint(
                spec.num_workers, spec.prefetch_factor, None, describe(exc), library=spec.library
            )
        points.append(point)
        rate = f"{point.samples_per_s:,.0f} samples/s" if point.samples_per_s else point.error
        progress(f"{workload.name}: grid {spec.name}: {rate}", 1)
    return points


def _grid_best(grid: list[GridPoint], library: str) -> GridPoint | None:
    ok = [p for p in grid if p.samples_per_s is not None and p.library == library]
    return max(ok, key=lambda p: p.samples_per_s or 0.0, default=None)


def _epoch_contenders(plan: Plan) -> tuple[list[ContenderSpec], list[str]]:
    nw = plan.stoker_workers
    specs = [
        ContenderSpec("stoker", nw, roles=("stoker",)),
        ContenderSpec("torch", 0, roles=("torch-nw0",)),
        ContenderSpec("torch", nw, 2, False, roles=("torch-same",)),
        ContenderSpec("torch", nw, 2, True, roles=("torch-persistent",)),
    ]
    note = "fresh = persistent_workers=False (torch's default): workers start again every epoch"
    return specs, [note]


def _contenders(
    workload: Workload, plan: Plan, grid: list[GridPoint], peer_notes: list[str]
) -> tuple[list[ContenderSpec], list[str]]:
    if workload.mode == "epochs":
        return _epoch_contenders(plan)
    best_point = _grid_best(grid, "torch")
    best = None
    if best_point is not None:
        nw = best_point.num_workers
        best = ContenderSpec(
            "torch", nw, best_point.prefetch_factor if nw else None, True if nw else None
        )
    at_same = [
        p
        for p in grid
        if p.library == "torch" and p.samples_per_s is not None
        if p.num_workers == plan.stoker_workers
    ]
    same_pf = max(at_same, key=lambda p: p.samples_per_s or 0.0).prefetch_factor if at_same else 2
    specs = standard_contenders(
        plan.cores,
        plan.stoker_workers,
        best,
        same_pf or 2,
        stoker_auto=plan.stoker_auto,
        stoker_watched=plan.stoker_watched,
        references=plan.references,
    )
    for library in plan.peers:  # each peer at the best point of its own grid
        point = _grid_best(grid, library)
        if point is None:
            peer_notes.append(f"{library}: no configuration of its grid ran: not compared")
            continue
        specs.append(
            ContenderSpec(library, point.num_workers, point.prefetch_factor, roles=("optional",))
        )
        if library in PEER_ORDER_NOTES:
            peer_notes.append(PEER_ORDER_NOTES[library])
    return merge(specs), [plan.grid_note, *peer_notes]


def _loader_runs(
    specs: list[ContenderSpec],
    dataset: Any,
    workload: Workload,
    plan: Plan,
    ideal: Ideal,
    report: Report,
) -> tuple[dict[int, list[RunSample]], dict[int, str]]:
    """Every contender's timed runs, alternating (the order rotates each repeat)."""

    def one(i: int, r: int) -> RunSample:
        return timed_run(
            specs[i],
            dataset,
            workload,
            plan,
            seed=r + 1,
            run_s=plan.run_s,
            ideal=ideal,
            warm_up=plan.warm_up,
        )

    names = [s.name for s in specs]

    def said(sample: RunSample) -> str:
        return f"{sample.samples_per_s:,.0f} samples/s"

    return alternate(names, plan.repeats, one, said, report, f"{workload.name}: ")


def trains(workload: Workload, plan: Plan) -> bool:
    """Whether the ``train`` family runs for ``workload`` (time-bounded steady runs only)."""
    return bool(plan.train_shapes) and workload.mode == "steady" and not workload.samples_per_run


def train_specs(
    specs: list[ContenderSpec], roles: frozenset[str] | None = None
) -> list[ContenderSpec]:
    """The contenders that also feed the training step (those with one of ``roles``; None:
    every role of :func:`train_roles`)."""
    wanted = train_roles() if roles is None else roles
    return [s for s in specs if wanted & set(s.roles)]


def bench_workload(
    workload: Workload, plan: Plan, *, quick: bool, progress: Report | None = None
) -> WorkloadResult:
    """Measure one workload (see the module docstring for the procedure).

    Args:
        workload: what to measure.
        plan: how long and how often.
        quick: passed to ``workload.make_dataset``; the batches then hold
            ``workload.quick_batch_size`` samples where it is set.
        progress: called with a message and a step count as the work advances.

    Returns:
        The workload's result; a workload whose dataset cannot be built comes back with
        ``error`` set, and a contender that fails comes back with its ``error`` set.
    """
    report = progress or (lambda message, steps: None)
    if quick and workload.quick_batch_size is not None:
        workload = dataclasses.replace(workload, batch_size=workload.quick_batch_size)
    if workload.runner is not None:  # it measures its own contenders (see Workload.runner)
        result: WorkloadResult = workload.runner(workload, plan, quick, report)
        return result
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
        report(f"{workload.name}: skipped ({describe(exc)})", 1)
        return WorkloadResult(**base, ideal=None, contenders=(), error=describe(exc))
    report(f"{workload.name}: ideal {ideal.samples_per_s:,.0f} samples/s", 1)
    peers, peer_notes = installed_peers() if plan.peers else ([], [])
    plan = dataclasses.replace(plan, peers=tuple(p for p in plan.peers if p in peers))
    grid = _search_grid(dataset, workload, plan, ideal, report) if workload.mode == "steady" else []
    specs, notes = _contenders(workload, plan, grid, peer_notes)
    runs, errors = _loader_runs(specs, dataset, workload, plan, ideal, report)
    ramps: tuple[Ramp, ...] = ()
    auto = next((i for i, s in enumerate(specs) if s.auto and runs[i]), None)
    if ramps_planned(workload, plan) and auto is not None:
        reference = median([r.samples_per_s for r in runs[auto]])
        ramps = tuple(
            _ramp(dataset, workload, plan, start, reference, report) for start in RAMP_STARTS
        )
    contenders = tuple(
        ContenderResult(s.name, s.library, s.roles, s.config, tuple(runs[i]), errors.get(i))
        for i, s in enumerate(specs)
    )
    train: tuple[TrainTable, ...] = ()
    if trains(workload, plan):
        feeding = train_specs(specs, plan.train_roles)
        starred = fastest(contenders, "torch")
        if plan.train_roles is not None and starred is not None:
            # One torch row feeds the step: the one the loader table stars as torch's best
            # (the short grid's winner may lose the timed runs), so both verdicts name it.
            starred_spec = specs[contenders.index(starred)]
            feeding = [s for s in feeding if s.library != "torch"] + [starred_spec]
        train = bench_train(dataset, workload, plan, feeding, ideal, report)
    return WorkloadResult(
        **base,
        ideal=ideal,
        contenders=contenders,
        grid=tuple(grid),
        notes=tuple(n for n in notes if n),
        ramps=ramps,
        train=train,
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
        ramp = Ramp(start, 0.0, reference, None, None, 0, "?", error=describe(exc))
    finally:
        wait_children_exit(baseline)
    if ramp.error:
        said = f"failed ({ramp.error})"
    elif ramp.reach_s is None:
        said = f"did not reach {REACH:.0%} of {reference:,.0f} samples/s in {ramp.seconds:.1f} s"
    else:
        said = f"{REACH:.0%} of {reference:,.0f} samples/s after {ramp.reach_s:.1f} s"
    report(f"{workload.name}: auto ramp from {start} workers: {said}", 1)
    return ramp
