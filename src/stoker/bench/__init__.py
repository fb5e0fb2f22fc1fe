"""``stoker bench``: torch's DataLoader and stoker side by side on built-in workloads.

Use it from Python to bench a dataset of your own::

    from stoker.bench import Workload, run
    result = run([Workload(name="mine", description="my data", batch_size=64,
                           make_dataset=lambda quick: MyDataset())], quick=True)
    print(result.workload("mine").stoker.samples_per_s)

Modules: ``_workloads`` (what a workload is, the registry, the cache), ``_synthetic`` and
``_jpeg`` (built-in workloads), ``_contenders`` (loader configurations), ``_harness``
(measurement procedure), ``_measure`` (CPU and PSS meters), ``_stats`` (medians, ratios, the
ideal), ``_result`` (result types), ``_roles`` (the words for the contenders' roles),
``_report`` (table, verdicts, JSON), ``_plot`` (PNG), ``_cli`` (the command).
"""

# Imports inside functions are deferred so that `import stoker.bench` (and the CLI) start fast.

from __future__ import annotations

import dataclasses
import multiprocessing
import os
import platform
import sys
import time
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from types import MappingProxyType
from typing import Any

from stoker.bench._harness import Plan, Progress, bench_workload, trains
from stoker.bench._ramp import RAMP_STARTS, ramps_planned
from stoker.bench._result import (
    BenchResult,
    ContenderResult,
    GridPoint,
    RunSample,
    WorkloadResult,
)
from stoker.bench._stats import Ideal
from stoker.bench._workloads import Workload, builtin_workloads, get_workload, register
from stoker.errors import ConfigError

__all__ = [
    "BenchResult",
    "ContenderResult",
    "GridPoint",
    "Ideal",
    "Plan",
    "Progress",
    "RunSample",
    "Workload",
    "WorkloadResult",
    "builtin_workloads",
    "make_plan",
    "register",
    "run",
]

# Quick mode's torch worker counts, per usable core: no workers, stoker's count (one per core)
# and twice it. 0.5 per core was never torch's best in quick runs on 2 cores (tiny, large,
# jpeg, io) and each point costs a loader's start and warm-up (1.4 s on jpeg).
QUICK_GRID_WORKERS_PER_CORE = (0, 1, 2)
PREFETCH_GRID = (2, 4)
QUICK_REPEATS = 3
# Steps each full-mode training run takes at least (jpeg's and shards' slow steps: about 5 s;
# the others' 1.5 s windows already hold 15 to 190). Quick mode keeps its time windows.
FULL_TRAIN_MIN_STEPS = 30
FULL_REPEATS = 5
# Seconds per timed run, warm-up, grid run, ideal measurement, auto's settling, ramp run and
# untimed pipeline fill at the start of each timed run (tests shrink them).
QUICK_TIMINGS: Mapping[str, float] = MappingProxyType(
    {
        "run_s": 0.4,
        "warmup_s": 0.05,
        "grid_run_s": 0.2,
        "ideal_s": 0.25,
        "auto_settle_s": 0.2,
        "fill_s": 0.05,
        "train_run_s": 0.4,
    }
)
FULL_TIMINGS: Mapping[str, float] = MappingProxyType(
    {
        "run_s": 3.0,
        "warmup_s": 0.5,
        "grid_run_s": 1.0,
        "ideal_s": 1.5,
        "auto_settle_s": 3.0,
        "ramp_s": 10.0,
        "fill_s": 0.5,
        "train_run_s": 1.5,
    }
)
# The train family's step shapes: quick mode keeps the GPU-like one (the common case).
QUICK_TRAIN_SHAPES = ("gpu",)
# ... fed by the headline pair only (auto and torch's best; each train run starts a loader):
# the loader-only table still has every contender.
QUICK_TRAIN_ROLES = frozenset({"stoker-auto", "torch-best"})
FULL_TRAIN_SHAPES = ("gpu", "cpu")
# Optional libraries whose grids run where they are installed, and their knobs: SPDL's
# thread counts; torchdata.nodes takes torch's worker counts (from 1) x these prefetch
# factors. Quick mode tries a few points each to finish in about 2 minutes; its SPDL threads
# are these multiples of the cores (the quick workloads are CPU-bound: 16 threads per core
# only cost jpeg 11 s of pipeline fill on 2 cores).
PEERS = ("torchdata", "spdl")
FULL_PEER_THREADS = (1, 2, 4, 8, 16, 32, 64)
QUICK_PEER_THREADS_PER_CORE = (1, 4)
QUICK_PEER_PREFETCH = (2,)


def _grid_workers(cores: int, quick: bool) -> tuple[int, ...]:
    """torch ``num_workers`` values to try: 0 to 4 x cores (geometric beyond 8); quick mode
    tries :data:`QUICK_GRID_WORKERS_PER_CORE` per core (on 16 cores a grid that stopped at 4
    workers left torch far from its best)."""
    top = 4 * cores
    if quick:
        return tuple(sorted({k * max(1, cores) for k in QUICK_GRID_WORKERS_PER_CORE}))
    values = set(range(min(top, 8) + 1))
    n = 8
    while n < top:
        n = int(n * 1.5)
        values.add(min(n, top))
    return tuple(sorted(values))


def make_plan(
    *,
    quick: bool,
    repeats: int | None = None,
    cores: int | None = None,
    multiprocessing_context: str | None = None,
) -> Plan:
    """The measuring plan for quick or full mode.

    Args:
        quick: short runs, 3 repeats, reduced grids and the GPU-like training step only
            instead of 5 repeats, the full grids and both step shapes.
        repeats: timed runs per contender. Default 3 in quick mode, 5 otherwise.
        cores: usable cores. Default :func:`stoker._introspect.platform.usable_cores`.
        multiprocessing_context: start method for loaders with workers. Default: platform's.

    Raises:
        ConfigError: if ``repeats`` < 1.
    """
    from stoker._introspect.platform import usable_cores

    n = cores or usable_cores()
    grid = _grid_workers(n, quick)
    quick_threads = tuple(k * n for k in QUICK_PEER_THREADS_PER_CORE)
    timings = QUICK_TIMINGS if quick else FULL_TIMINGS
    if quick:
        note = (
            f"quick mode: torch grid reduced to num_workers in {{{', '.join(map(str, grid))}}}"
            f" x prefetch_factor 2, and 4 at {n} workers, with short runs (full grid: 0 to"
            f" {4 * n} x {{2, 4}}); SPDL threads {{{', '.join(map(str, quick_threads))}}},"
            f" torchdata.nodes workers {{{', '.join(str(w) for w in grid if w)}}} x prefetch 2;"
            " runs not warmed up (each times its loader's first epoch, after its fill);"
            " torch without workers and the seed recipe timed only as grid best"
        )
    else:
        note = (
            f"torch grid: num_workers in {{{', '.join(map(str, grid))}}} x prefetch_factor {{2, 4}}"
        )
    return Plan(
        stoker_auto=True,
        stoker_watched=not quick,
        train_shapes=QUICK_TRAIN_SHAPES if quick else FULL_TRAIN_SHAPES,
        peers=PEERS,
        peer_threads=quick_threads if quick else FULL_PEER_THREADS,
        peer_prefetch=QUICK_PEER_PREFETCH if quick else PREFETCH_GRID,
        references=not quick,
        train_roles=QUICK_TRAIN_ROLES if quick else None,
        prefetch_everywhere=not quick,
        warm_up=not quick,
        repeats=repeats or (QUICK_REPEATS if quick else FULL_REPEATS),
        grid_workers=grid,
        grid_prefetch=PREFETCH_GRID,
        grid_note=note,
        stoker_workers=n,
        cores=n,
        multiprocessing_context=multiprocessing_context,
        run_s=timings["run_s"],
        warmup_s=timings["warmup_s"],
        grid_run_s=timings["grid_run_s"],
        ideal_s=timings["ideal_s"],
        auto_settle_s=timings["auto_settle_s"],
        ramp_s=timings.get("ramp_s", 0.0),
        fill_s=timings["fill_s"],
        train_run_s=timings["train_run_s"],
        train_min_steps=0 if quick else FULL_TRAIN_MIN_STEPS,
    )


def _machine(plan: Plan) -> dict[str, Any]:
    import torch

    import stoker

    cpu = platform.processor() or ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {
        "usable_cores": plan.cores,
        "cpu_count": os.cpu_count(),
        "cpu": cpu,
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "stoker": stoker.__version__,
        "cuda": torch.cuda.is_available(),
        "start_method": plan.multiprocessing_context or multiprocessing.get_start_method(),
        "fill_s": plan.fill_s,  # untimed start of each timed run's epoch
        "train_min_steps": plan.train_min_steps,  # each training run's floor
    }


def _steps(workload: Workload, plan: Plan) -> int:
    """The workload's progress steps, as planned (an estimate: merged contenders and missing
    peers make fewer; the remainder is advanced when the workload ends)."""
    peers = len(plan.peers)
    steady = 3 + 2 * plan.references + plan.stoker_auto + plan.stoker_watched
    contenders = 4 if workload.mode == "epochs" else steady
    contenders += 0 if workload.mode == "epochs" else peers
    grid = len(plan.grid()) if workload.mode == "steady" else 0
    ramps = len(RAMP_STARTS) if ramps_planned(workload, plan) else 0
    train = (4 + peers) * len(plan.train_shapes) * plan.repeats if trains(workload, plan) else 0
    return 1 + grid + plan.repeats * contenders + ramps + train


def run(
    workloads: Sequence[str | Workload] | None = None,
    *,
    quick: bool = False,
    repeats: int | None = None,
    multiprocessing_context: str | None = None,
    progress: Progress | None = None,
    plan: Plan | None = None,
) -> BenchResult:
    """Run the bench and return every measurement.

    Args:
        workloads: workload names (see :func:`builtin_workloads`) or :class:`Workload`
            objects. Default: the quick set in quick mode, every built-in workload otherwise.
        quick: short runs, 3 repeats, reduced torch grid (see :func:`make_plan`).
        repeats: timed runs per contender (default 3 quick, 5 full).
        multiprocessing_context: start method for loaders with workers (``"fork"``,
            ``"spawn"``, ``"forkserver"``). Default: the platform's.
        progress: receives the total number of steps, then each step as it completes
            (see :class:`~stoker.bench._harness.Progress`). Default: silent.
        plan: a complete measuring plan, overriding ``quick``'s timings and ``repeats``.

    Returns:
        A :class:`BenchResult`.

    Raises:
        ConfigError: for an unknown workload name or an invalid ``repeats``.
    """
    if repeats is not None and repeats < 1:
        raise ConfigError(f"`repeats` must be >= 1. Found: {repeats!r}.")
    if plan is None:
        plan = make_plan(
            quick=quick, repeats=repeats, multiprocessing_context=multiprocessing_context
        )
    if workloads is None:
        chosen = [w for w in builtin_workloads().values() if w.in_quick or not quick]
    else:
        chosen = [w if isinstance(w, Workload) else get_workload(w) for w in workloads]
    if progress is not None:
        progress.start(sum(_steps(w, plan) for w in chosen))
    started = datetime.now(timezone.utc).isoformat(timespec="seconds")
    t0 = time.perf_counter()
    results = []
    for workload in chosen:
        done = 0

        def counting(message: str, steps: int) -> None:
            nonlocal done
            done += steps
            if progress is not None:
                progress.advance(message, steps)

        w0 = time.perf_counter()
        done_result = bench_workload(workload, plan, quick=quick, progress=counting)
        results.append(dataclasses.replace(done_result, duration_s=time.perf_counter() - w0))
        if progress is not None and done < _steps(workload, plan):
            progress.advance("", _steps(workload, plan) - done)
    return BenchResult(
        workloads=tuple(results),
        quick=quick,
        repeats=plan.repeats,
        machine=_machine(plan),
        started_at=started,
        duration_s=time.perf_counter() - t0,
    )
