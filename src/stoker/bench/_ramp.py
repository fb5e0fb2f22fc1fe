"""How fast ``num_workers="auto"`` gets up to speed: ramp runs from 1 worker and from 16.

A ramp run builds a fresh auto loader whose controller starts from a given worker count
(``DataLoader._start_with``), iterates for the plan's ``ramp_s`` seconds from
``iter()`` (the backend probe and worker start-up included) and records when each batch
arrived. The rate over a sliding window is compared with a reference rate, the auto
contender's median from the timed runs (where its controller had settled), and the ramp ends
where the first window that reaches :data:`REACH` of it begins: from then on the loader
delivered at speed. (Its end would add the window's length to every ramp: a loader at full
speed from the first batch would read as taking a whole window to get there.) An epoch of
the workload lasts ``len(dataset)`` / reference rate, so the ramp can be read as a share of
an epoch.
"""

from __future__ import annotations

import bisect
import time
from typing import Any

import torch.utils.data as tud

from stoker._commands.step import consume
from stoker.bench._contenders import close_loader
from stoker.bench._plan import Plan, SeededSampler
from stoker.bench._result import Ramp
from stoker.bench._runs import RUN_LIMIT_S, collect_if_held, time_limit, weak
from stoker.bench._workloads import Workload

__all__ = ["RAMP_STARTS", "REACH", "measure_ramp", "ramps_planned", "reach_time"]

# Worker counts the controller starts from, and the share of the reference rate that ends
# the ramp; the window is WINDOW_SHARE of the run, at least MIN_WINDOW_S.
RAMP_STARTS = (1, 16)
REACH = 0.95
WINDOW_SHARE = 0.1
MIN_WINDOW_S = 0.5
_SAMPLES = 10**9  # the sampler outlasts any ramp run


def reach_time(
    times: list[float], samples: list[int], reference: float, window_s: float
) -> float | None:
    """Start of the first window of ``window_s`` seconds over which the rate reached
    ``REACH`` x ``reference`` (the window ends at an arrival; it starts no earlier than 0).

    Args:
        times: arrival time of each batch (seconds from the start, increasing).
        samples: cumulative samples at each arrival.
        reference: samples/s to reach.
        window_s: window length (before ``window_s`` has passed, the window
            reaches back before the start, where nothing arrived).
    """
    goal = REACH * reference
    for i, t in enumerate(times):
        j = bisect.bisect_right(times, t - window_s)  # first arrival inside (t - window, t]
        before = samples[j - 1] if j > 0 else 0
        if (samples[i] - before) / window_s >= goal:
            return max(0.0, t - window_s)
    return None


def ramps_planned(workload: Workload, plan: Plan) -> bool:
    """Whether ``plan`` measures ramps of ``num_workers="auto"`` on ``workload``."""
    return plan.stoker_auto and plan.ramp_s > 0 and workload.mode == "steady"


def measure_ramp(
    dataset: Any,
    workload: Workload,
    start_workers: int,
    seconds: float,
    reference: float,
    multiprocessing_context: str | None = None,
) -> Ramp:
    """One ramp run (see the module docstring)."""
    from stoker.loader import _loader as loader_module

    sampler = (
        None
        if isinstance(dataset, tud.IterableDataset)
        else SeededSampler(len(dataset), _SAMPLES, seed=-2)
    )
    loader: Any = loader_module.DataLoader(
        dataset,
        batch_size=workload.batch_size,
        sampler=sampler,
        num_workers="auto",
        prefetch_factor="auto",
        multiprocessing_context=multiprocessing_context,
    )  # (no timeout, as the timed runs' auto contender: see _contenders.build_loader)
    loader._start_with(start_workers)
    times: list[float] = []
    counts: list[int] = []
    total = 0
    t0 = time.perf_counter()
    it = iter(loader)
    try:
        with time_limit(RUN_LIMIT_S, "an auto ramp"):
            for batch in it:
                total += consume(batch)
                del batch
                now = time.perf_counter() - t0
                times.append(now)
                counts.append(total)
                if now >= seconds:
                    break
        stats = loader.stats()
    finally:
        del it
        close_loader(loader)
        ref = weak(loader)
        del loader
        collect_if_held(ref)  # a full collection only for a loader held in a cycle
    run_s = times[-1] if times else seconds
    window = max(MIN_WINDOW_S, WINDOW_SHARE * run_s)
    try:
        n = len(dataset)
    except TypeError:
        n = 0
    return Ramp(
        start_workers=start_workers,
        seconds=run_s,
        reference_samples_per_s=reference,
        reach_s=reach_time(times, counts, reference, window),
        epoch_s=n / reference if n and reference > 0 else None,
        final_workers=stats.num_workers,
        backend=stats.backend,
        decisions=stats.notes,
    )
