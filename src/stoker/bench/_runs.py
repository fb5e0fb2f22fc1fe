"""One run of one contender: build its loader, warm it up, time it, shut it down.

The loader-only runs (:func:`timed_run`) and the training-step runs (:mod:`stoker.bench._train`)
share the loader's life: :func:`open_run` builds the loader with a sampler sized for the run,
warms it up and closes it afterwards, waiting for its child processes to exit.

A timed loader run iterates ``iter(loader)`` and passes every batch to
:func:`~stoker._commands.step.consume` (one read per 4 KiB page of every tensor).
"""

from __future__ import annotations

import gc
import multiprocessing
import os
import signal
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

import psutil
import torch.utils.data as tud

from stoker._commands.step import consume
from stoker.bench._contenders import ContenderSpec, build_loader, close_loader
from stoker.bench._measure import Meter, TreeMeter
from stoker.bench._plan import Plan, Report, SeededSampler
from stoker.bench._result import RunSample
from stoker.bench._stats import Ideal
from stoker.bench._workloads import Workload

__all__ = [
    "OpenRun",
    "PassRanOut",
    "RunHung",
    "alternate",
    "collect_if_held",
    "describe",
    "iterate",
    "open_run",
    "timed_run",
    "wait_children_exit",
]

# Seconds a child process may take to exit after its loader is closed.
CHILD_EXIT_S = 5.0
CHILD_POLL_S = 0.02
# Seconds a run (build, warm-up, timing) may last, and its shutdown after, before it is taken
# for hung: a torchdata.nodes worker that died of 'double free or corruption' (2026-11-26,
# tiny's grid) left its loader waiting on a queue forever, and the whole bench with it.
RUN_LIMIT_S = 300.0
CLOSE_LIMIT_S = 30.0
# A time-bounded run's sampler holds this many times the samples the ideal rate would
# deliver in the run time (the run stops at the time limit long before it runs out).
RUN_SAMPLES_HEADROOM = 10

T = TypeVar("T")


def collect_if_held(ref: Callable[[], object] | None) -> None:
    """A full garbage collection if the object ``ref`` refers to outlived the caller's last
    reference to it (``None``: no weak reference could be taken).

    A closed loader held in a reference cycle keeps whatever it holds (batches, an iterator,
    finalizers that stop workers) until a collection: it must not be left to weigh on the
    next contender's memory and time. One freed by its reference count leaves nothing, and
    a full collection scans every object of the process (torch's modules make most of
    170,000): 0.12-0.17 s a run on the 2-core VM, about 93 runs in a quick bench
    (benchmarks/README.md).
    """
    if ref is None or ref() is not None:
        gc.collect()


def weak(obj: object) -> Callable[[], object] | None:
    """A weak reference to ``obj``, or None where its type takes none."""
    try:
        return weakref.ref(obj)
    except TypeError:
        return None


def describe(exc: BaseException) -> str:
    """The first line of ``exc`` as ``Type: message`` (at most 200 characters)."""
    text = f"{type(exc).__name__}: {exc}".strip()
    first_line = text.splitlines()[0] if text else type(exc).__name__
    return first_line[:200]


def alternate(
    names: list[str],
    repeats: int,
    run: Callable[[int, int], T],
    said: Callable[[T], str],
    report: Report,
    prefix: str,
) -> tuple[dict[int, list[T]], dict[int, str]]:
    """``run(i, r)`` for each contender ``i`` in each repeat ``r``, the order rotating every
    repeat so that no contender always runs first or last.

    Returns each contender's samples and, for a contender whose run raised, the error (it
    does not run again; the others still do). ``report`` hears of each run as
    ``"{prefix}{name} run r/repeats: {said(sample)}"``.
    """
    runs: dict[int, list[T]] = {i: [] for i in range(len(names))}
    errors: dict[int, str] = {}
    for r in range(repeats):
        for i in [(r + k) % len(names) for k in range(len(names))]:
            if i in errors:
                report(f"{prefix}{names[i]}: failed earlier", 1)
                continue
            try:
                sample = run(i, r)
            except Exception as exc:  # reported in the table; the others still run
                errors[i] = describe(exc)
                report(f"{prefix}{names[i]}: failed ({errors[i]})", 1)
                continue
            runs[i].append(sample)
            report(f"{prefix}{names[i]} run {r + 1}/{repeats}: {said(sample)}", 1)
    return runs, errors


def _running_children(baseline: set[int]) -> set[int]:
    """Children beyond ``baseline`` that have not exited: multiprocessing's own finished ones
    are reaped first, and zombies no one reaps are left out (they hold no memory or CPU)."""
    multiprocessing.active_children()  # reaps the processes it started that have exited
    running = set()
    for proc in psutil.Process().children(recursive=True):
        try:
            if proc.pid not in baseline and proc.status() != psutil.STATUS_ZOMBIE:
                running.add(proc.pid)
        except psutil.Error:  # gone since
            pass
    return running


def wait_children_exit(baseline: set[int], kill: bool = False) -> None:
    """Wait (up to :data:`CHILD_EXIT_S`) until no child beyond ``baseline`` is running; with
    ``kill``, then kill those left (a hung loader's workers).

    A child that exited is not waited for: torchdata's mapper joins its workers for 0.5 s
    and moves on, and a worker that exits later stays a zombie until multiprocessing reaps
    it; waiting for it to vanish cost quick jpeg 5 s in three of four torchdata runs.
    """
    deadline = time.monotonic() + CHILD_EXIT_S
    while _running_children(baseline) and time.monotonic() < deadline:
        time.sleep(CHILD_POLL_S)
    if kill:
        for pid in TreeMeter.children_now() - baseline:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:  # gone already
                pass


class RunHung(RuntimeError):
    """A run outlasted its limit (see :data:`RUN_LIMIT_S`)."""


class PassRanOut(RuntimeError):
    """A time-bounded window ended with its pass, before its time bound (a bench bug)."""


@contextmanager
def time_limit(seconds: float, what: str) -> Iterator[None]:
    """Raise :class:`RunHung` in this (main) thread if the block lasts over ``seconds``: a
    loader waiting on a dead worker blocks in a lock, which a signal interrupts. Elsewhere
    (another thread, no ``setitimer``) the block runs unbounded."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(
        signal, "setitimer"
    ):
        yield
        return

    def expired(signum: int, frame: Any) -> None:
        raise RunHung(f"{what} did not end within {seconds:.0f} s: the loader hung")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def iterate(
    loader: Iterable[Any],
    *,
    min_batches: int,
    seconds: float | None,
    t0: float,
    step: Callable[[Any], object] | None = None,
) -> tuple[int, int, float, float]:
    """Consume batches; return (samples, batches, first_batch_s, seconds to the last one).

    ``loader`` may be an epoch's iterator: the iteration then goes on where it stands.
    ``step``, if given, runs on each batch after it is consumed (a training step).
    """
    samples = batches = 0
    first = last = 0.0
    it = iter(loader)
    try:
        for batch in it:
            samples += consume(batch)
            if step is not None:
                step(batch)
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


@dataclass
class OpenRun:
    """A contender's loader, built and warmed up for one run.

    Attributes:
        loader: the iterable over batches.
        min_batches: batches a time-bounded run consumes at least (whole rounds of workers).
        time_bound: seconds a run lasts (``None``: the workload fixes the samples instead).
        fill_batches: batches the untimed fill consumes at least: the loader's first wave
            (:attr:`ContenderSpec.width`), so that the window does not start by draining
            batches that were built before it.
        sized: whether the run's sampler was sized to outlast the window (see
            :meth:`check_outlasted`).
    """

    loader: Iterable[Any]
    min_batches: int
    time_bound: float | None
    fill_batches: int = 1
    sized: bool = False

    def check_outlasted(self, batches: int, seconds: float) -> None:
        """Raise if a time-bounded window ended because the run's pass ran out.

        A window cut short by the end of the pass drains batches built before it started
        and times none of the work it would have waited on: its rate reads too high.
        """
        if not self.sized or self.time_bound is None:
            return
        if batches < self.min_batches or seconds < self.time_bound:
            raise PassRanOut(
                f"the run's pass ran out after {batches} batches in {seconds:.2f} s (the window "
                f"needs {self.min_batches} batches and {self.time_bound:.2f} s): the bench sized "
                "its sampler too small for this loader; please report it"
            )


def _sampler_size(
    spec: ContenderSpec,
    dataset: Any,
    workload: Workload,
    plan: Plan,
    run_s: float,
    ideal: Ideal,
    min_batches: int,
) -> tuple[int, int | None]:
    """(samples per pass, samples of the first pass: the warm-up) for the run's sampler.

    A timed pass holds :data:`RUN_SAMPLES_HEADROOM` times what the ideal rate would deliver
    in the fill and the window, and as many times the batches that the fill and the window
    consume at least and that the loader holds in flight beyond them: a loader that builds
    many batches at once fills for longer than ``plan.fill_s`` (SPDL's 64 threads took 20 s
    on shards) and must not reach the end of its pass inside the window.

    The warm-up (``steady`` mode) is a complete short pass of one batch per worker, so that
    every worker has started and no warm-up work is still in flight when the timed pass
    starts; ``num_workers="auto"`` warms up by time (its controller settles).
    """
    bs = workload.batch_size
    if workload.mode != "steady":  # one epoch = one pass over the dataset
        return (0 if isinstance(dataset, tud.IterableDataset) else len(dataset)), None
    by_time = ideal.samples_per_s * (run_s + plan.fill_s)
    by_batches = bs * (spec.width + min_batches + spec.in_flight)
    samples = max(8 * bs, int(max(by_time, by_batches) * RUN_SAMPLES_HEADROOM))
    first_pass = bs * spec.width
    if spec.auto:
        first_pass = max(
            first_pass, int(ideal.samples_per_s * plan.auto_settle_s * RUN_SAMPLES_HEADROOM)
        )
    return samples, first_pass


@contextmanager
def open_run(
    spec: ContenderSpec,
    dataset: Any,
    workload: Workload,
    plan: Plan,
    *,
    seed: int,
    run_s: float,
    ideal: Ideal,
    rounds: int = 2,
    warm_up: bool = True,
    step: Callable[[Any], object] | None = None,
    min_batches: int = 0,
) -> Iterator[OpenRun]:
    """Build ``spec``'s loader, warm it up (``steady`` mode), yield it, then shut it down.

    A time-bounded run lasts ``run_s``, at least ``rounds`` batches per worker (whole rounds,
    so that the last round is not half empty) and at least ``min_batches`` batches. Without
    ``warm_up`` the run is the loader's first epoch (its fill then includes starting the
    workers). ``step`` runs on each warm-up batch: a training run's loader settles
    (``num_workers="auto"`` picks its workers and backend) beside the step it will feed, not
    beside an idle loop. A loader whose warm-up would not outlast its epoch
    (:attr:`ContenderSpec.warm_up_lasts`: torch's non-persistent workers) skips it and runs
    the pass the others time after theirs.
    """
    baseline = TreeMeter.children_now()
    min_batches = max(rounds * spec.width, min_batches)
    samples, warmup = _sampler_size(spec, dataset, workload, plan, run_s, ideal, min_batches)
    skipped = warm_up and warmup is not None and not spec.warm_up_lasts
    if skipped or not warm_up:
        warm_up, warmup = False, None
    sampler = None
    if not isinstance(dataset, tud.IterableDataset):
        sampler = SeededSampler(
            len(dataset), workload.samples_per_run or samples, seed, warmup, skip_first=skipped
        )
    loader = build_loader(spec, dataset, workload.batch_size, sampler, plan.multiprocessing_context)
    time_bound = run_s if workload.samples_per_run is None else None
    sized = sampler is not None and workload.mode == "steady" and time_bound is not None
    opened = OpenRun(loader, min_batches, time_bound, spec.width, sized)
    hung = False
    try:
        with time_limit(RUN_LIMIT_S, f"a run of {spec.name}"):
            if workload.mode == "steady" and warm_up:
                # Iterable datasets warm up by time, as does num_workers="auto" (it settles).
                warm_s = plan.auto_settle_s if spec.auto else None
                if sampler is None:
                    warm_s = max(warm_s or 0.0, plan.warmup_s)
                iterate(loader, min_batches=1, seconds=warm_s, t0=time.perf_counter(), step=step)
            yield opened
    except RunHung:
        hung = True
        raise
    finally:
        try:
            with time_limit(CLOSE_LIMIT_S, f"shutting down {spec.name}"):
                close_loader(loader)
        except RunHung:
            hung = True  # its workers are killed below
        ref = weak(loader)
        opened.loader = ()  # spent: the caller's name for the run does not keep it alive
        del loader
        collect_if_held(ref)
        wait_children_exit(baseline, kill=hung)


def timed_run(
    spec: ContenderSpec,
    dataset: Any,
    workload: Workload,
    plan: Plan,
    *,
    seed: int,
    run_s: float,
    ideal: Ideal,
    rounds: int = 2,
    warm_up: bool = True,
) -> RunSample:
    """Build, warm up (unless told not to), time one run (or ``workload.epochs`` epochs), shut
    down.

    A time-bounded ``steady`` run is timed after the epoch's first ``plan.fill_s`` seconds
    (the pipeline's fill; the first batch's latency is measured from ``iter()``).
    """
    baseline = TreeMeter.children_now()
    with open_run(
        spec,
        dataset,
        workload,
        plan,
        seed=seed,
        run_s=run_s,
        ideal=ideal,
        rounds=rounds,
        warm_up=warm_up,
    ) as run:
        epochs = workload.epochs if workload.mode == "epochs" else 1
        firsts: list[float] = []
        samples = batches = 0
        source: Iterable[Any] = run.loader
        filled: float | None = None
        if workload.mode == "steady" and run.time_bound is not None and plan.fill_s > 0:
            start = time.perf_counter()
            source = iter(run.loader)
            filled = iterate(source, min_batches=run.fill_batches, seconds=plan.fill_s, t0=start)[2]
        own0 = _monitor_overhead(run.loader)
        with Meter(baseline) as meter:
            t0 = time.perf_counter()
            for _ in range(epochs):
                s, b, first, _ = iterate(
                    source,
                    min_batches=run.min_batches,
                    seconds=None if workload.mode == "epochs" else run.time_bound,
                    t0=time.perf_counter(),
                )
                samples, batches = samples + s, batches + b
                firsts.append(first if filled is None else filled)
            seconds = time.perf_counter() - t0
        if workload.mode == "steady":
            run.check_outlasted(batches, seconds)
        del source
        own1 = _monitor_overhead(run.loader)
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
