"""``stoker.watch``: iterate a loader unchanged while measuring data wait against compute."""

# Over 400 lines: the public watch() with its documented options and the one loop it runs.

from __future__ import annotations

import dataclasses
import operator
import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from typing import IO, Any, Generic, TypeVar

from stoker._introspect.platform import usable_cores
from stoker.errors import ConfigError
from stoker.monitor._detect import find_sawtooth
from stoker.monitor._display import REFRESH_HZ, Display, make_display
from stoker.monitor._figures import Figures, Judgement, judge
from stoker.monitor._meter import StepMeter, batch_size
from stoker.monitor._probe import LoaderProbe
from stoker.monitor._sinks import JsonlSink, TensorBoardSink
from stoker.monitor._types import HealthReport, LoaderHealth, WatchSummary

__all__ = ["Watch", "watch"]

T = TypeVar("T")


def _source_name(source: object) -> str:
    cls = type(source)
    return f"{cls.__module__}.{cls.__qualname__}"


class Watch(Generic[T]):
    """Iterates ``source`` unchanged and measures each step; see :func:`stoker.watch`.

    Iterating a ``Watch`` again starts a new pass over ``source`` (an epoch) and continues the
    same run: step indices, totals, stall detection and the log carry on.

    Args:
        source: a ``DataLoader`` (stoker's or torch's) or any iterable.
        every: steps per health interval (>= 1). Default 100.
        progress: show a progress bar (terminal, Jupyter) or plain periodic lines (logs).
            Default ``True``.
        log: path of a jsonl file to write one record per step, stall and interval.
        tensorboard: directory for TensorBoard scalars (needs the ``tensorboard`` package).
        size: counts the samples of a batch; default :func:`stoker.monitor._meter.batch_size`.
        clock: monotonic clock in seconds. Default ``time.perf_counter`` (tests inject one).
        file: stream for the display. Default ``sys.stdout``.

    Raises:
        ConfigError: for an invalid argument, an unwritable ``log`` or a ``tensorboard``
            directory without the ``tensorboard`` package.
    """

    def __init__(
        self,
        source: Iterable[T],
        *,
        every: int = 100,
        progress: bool = True,
        log: str | os.PathLike[str] | None = None,
        tensorboard: str | os.PathLike[str] | None = None,
        size: Callable[[Any], int | None] | None = None,
        clock: Callable[[], float] = time.perf_counter,
        file: IO[str] | None = None,
    ) -> None:
        if not isinstance(source, Iterable):
            raise ConfigError(
                f"`stoker.watch` needs an iterable (a DataLoader, a generator, ...). "
                f"Found: {type(source).__name__}."
            )
        if not isinstance(every, int) or isinstance(every, bool) or every < 1:
            raise ConfigError(f"`every` must be an int >= 1. Found: {every!r}.")
        if not isinstance(progress, bool):
            raise ConfigError(f"`progress` must be True or False. Found: {progress!r}.")
        if size is not None and not callable(size):
            raise ConfigError(f"`size` must be a callable or None. Found: {size!r}.")
        self.source = source
        self.every = every
        self._progress = progress
        self._log = log
        self._size = size or batch_size
        self._clock = clock
        self._file = file
        self._tensorboard = tensorboard
        if tensorboard is not None:  # fail now, before training starts, without the package
            TensorBoardSink.check(tensorboard)
        self._probe = LoaderProbe(source)
        self._meter = StepMeter()
        self._cores = usable_cores()
        self._epoch = -1
        self._t0: float | None = None
        self._own_s = 0.0
        self._health: LoaderHealth | None = None
        self._header_written = False
        self._sink: JsonlSink | None = None  # the log of the pass under way
        self.reports: list[HealthReport] = []
        if log is not None:  # open now so that a bad path fails before training starts
            self._open_log().close()

    # -- public ------------------------------------------------------------------------

    @property
    def steps(self) -> int:
        """Steps completed so far."""
        return self._meter.steps + len(self._meter.pending)

    def summary(self) -> WatchSummary:
        """The run so far, for all passes: totals, starvation ratio, stalls and verdict."""
        self._fold()
        m = self._meter
        figures = Figures.of(m)
        saw = find_sawtooth(list(m.recent_wait), list(m.recent_compute))
        stalls = tuple(m.stall_events)
        verdict = self._judge(figures, saw, stalls)
        return WatchSummary(
            steps=m.steps,
            samples=figures.samples,
            elapsed_s=figures.wall_s,
            wait_s=m.wait_s,
            compute_s=m.compute_s,
            wait_fraction=figures.wait_fraction,
            samples_per_s=figures.samples_per_s,
            median_wait_s=m.wait_hist.quantile(0.5),
            p95_wait_s=m.wait_hist.quantile(0.95),
            max_wait_s=m.max_wait_s,
            median_compute_s=m.compute_hist.quantile(0.5),
            verdict=verdict.verdict,
            diagnosis=verdict.diagnosis,
            action=verdict.action,
            stalls=stalls,
            sawtooth=saw,
            overhead_s=self._own_s,
            startup_s=figures.startup_s,
            steady_steps=figures.steady_steps,
            evidence=verdict.evidence,
        )

    def __iter__(self) -> Iterator[T]:
        return self._run()

    # -- internals -----------------------------------------------------------------------

    def _open_log(self) -> JsonlSink:
        header = None
        if not self._header_written:
            header = {
                "source": _source_name(self.source),
                "num_workers": self._probe.num_workers,
                "every": self.every,
            }
            self._header_written = True
        assert self._log is not None
        return JsonlSink(self._log, header)

    def _judge(
        self, figures: Figures, saw: Any, stalls: tuple[Any, ...], min_steps: int | None = None
    ) -> Judgement:
        extra = {} if min_steps is None else {"min_steps": min_steps}
        return judge(
            figures,
            loader=self._health,
            num_workers=self._probe.num_workers,
            sawtooth=saw,
            stalls=stalls,
            cores=self._cores,
            **extra,
        )

    def _sample_loader(self, now: float) -> None:
        """Read the loader's health when due (keeping the last busy fraction once the
        workers are gone, at the end of a pass)."""
        if self._probe.enabled and (self._probe.due(now) or self._health is None):
            health, before = self._probe.sample(now), self._health
            if health is not None and health.busy_fraction is None and before is not None:
                health = dataclasses.replace(
                    health, busy_fraction=before.busy_fraction, busy_source=before.busy_source
                )
            self._health = health

    def _interval(
        self, now: float, sink: JsonlSink | None, tb: TensorBoardSink | None = None
    ) -> HealthReport:
        m = self._meter
        iv, stalls = m.take_interval(now)
        figures = Figures.of(iv)
        saw = find_sawtooth(list(m.recent_wait), list(m.recent_compute))
        self._sample_loader(now)
        # An interval is judged on whatever steady steps it has (a run needs more: summary()).
        verdict = self._judge(figures, saw, stalls, min_steps=1)
        report = HealthReport(
            step=m.steps,
            elapsed_s=Figures.of(m).wall_s,
            steps=iv.steps,
            samples=figures.samples,
            wait_s=iv.wait_s,
            compute_s=iv.compute_s,
            wait_fraction=figures.wait_fraction,
            samples_per_s=figures.samples_per_s,
            steps_per_s=figures.steps_per_s,
            verdict=verdict.verdict,
            diagnosis=verdict.diagnosis,
            action=verdict.action,
            stalls=stalls,
            sawtooth=saw,
            loader=self._health,
            evidence=verdict.evidence,
        )
        self.reports.append(report)
        if sink is not None:
            sink.interval(report)
        if tb is not None:
            tb.interval(report)
        return report

    def _fold(self) -> None:
        """Fold the steps the loop recorded into the meter; log them and their stalls."""
        m = self._meter
        pending = m.pending
        if not len(pending):
            return
        sink, t0 = self._sink, self._t0
        if sink is not None and t0 is not None:
            first = m.steps
            for k, (t, w, c, size) in enumerate(
                zip(pending.start, pending.wait, pending.compute, pending.size, strict=True)
            ):
                sink.step(first + k, t - t0, w, c, size)
        events = m.fold()
        if sink is not None:
            for event in events:
                sink.stall(event)

    def _begin_pass(
        self,
    ) -> tuple[Iterator[T], Display, JsonlSink | None, TensorBoardSink | None]:
        """Start a pass: display, log, TensorBoard writer, and ``iter()``, timed."""
        meter = self._meter
        self._epoch += 1
        if self._epoch > 0:
            meter.start_epoch()
        display = make_display(
            self._progress,
            operator.length_hint(self.source, 0) or None,
            self._file,
            first_step=meter.steps,
        )
        sink = self._open_log() if self._log is not None else None
        # One writer (one event file) per pass, closed with it: no writer thread outlives it.
        tb = TensorBoardSink(self._tensorboard) if self._tensorboard is not None else None
        start = self._clock()
        if self._t0 is None:
            self._t0 = start
        try:
            it = iter(self.source)
        except BaseException:
            for part in (sink, tb):
                if part is not None:
                    part.close()
            display.close(None)
            raise
        iter_s = self._clock() - start
        meter.start_pass(iter_s)
        meter.interval.start_time = start
        self._sink = sink
        if sink is not None:
            sink.epoch(self._epoch, meter.steps, iter_s)
        self._probe.attach(it)
        return it, display, sink, tb

    def _run(self) -> Iterator[T]:
        it, display, sink, tb = self._begin_pass()
        clock, meter, every, size_of = self._clock, self._meter, self.every, self._size
        period = 1.0 / REFRESH_HZ
        t_req = t_got = clock()
        next_refresh = t_req + period
        holding = False  # the loop holds a batch (not yet recorded as a step)
        size: int | None = None
        own = 0.0  # this pass's bookkeeping time (the watch's own cost)
        # Each step is only appended to meter.pending; it is folded into the meter when the
        # health interval is complete or the progress display is due.
        record = meter.pending
        push_start, push_wait = record.start.append, record.wait.append
        push_compute, push_size = record.compute.append, record.size.append
        due = every - meter.interval.steps
        try:
            while True:
                try:
                    batch = next(it)
                except StopIteration:
                    break
                t_got = clock()
                size = size_of(batch)
                holding = True
                t_yield = clock()
                yield batch
                # Drop the batch before the clock: when the caller holds no other reference,
                # freeing it (and returning its slot to a stoker loader) is the step's work,
                # as it is when the caller's loop variable lets go of it after next().
                batch = None  # type: ignore[assignment]  # do not keep the batch alive
                t_done = clock()
                holding = False
                push_start(t_req)
                push_wait(t_got - t_req)
                push_compute(t_done - t_yield)
                push_size(size)
                own += t_yield - t_got
                due -= 1
                if due <= 0 or t_done >= next_refresh:
                    self._fold()
                    if meter.interval.steps >= every:
                        display.health(self._interval(t_done, sink, tb))
                    due = every - meter.interval.steps
                    if t_done >= next_refresh:
                        self._refresh(display)
                        next_refresh = t_done + period
                t_req = clock()
                own += t_req - t_done
        finally:
            # Collected at interpreter exit (never finished): modules are going away, so
            # nothing is summarised or written.
            if not sys.is_finalizing():
                if holding:  # the loop stopped (break, exception) while holding a batch
                    now = clock()
                    self._fold()
                    push_start(t_req)
                    push_wait(t_got - t_req)
                    push_compute(now - t_got)
                    push_size(size)
                self._end_pass(clock(), own, display, sink, tb)

    def _refresh(self, display: Display) -> None:
        meter = self._meter
        wait_frac, rate = meter.recent_rates()
        n = len(meter.recent_wait)
        total = sum(meter.recent_wait) + sum(meter.recent_compute)
        display.refresh(meter.steps, rate, wait_frac, n / total if total else 0.0)

    def _end_pass(
        self,
        now: float,
        own: float,
        display: Display,
        sink: JsonlSink | None,
        tb: TensorBoardSink | None,
    ) -> None:
        """Fold the pass's last steps, close its interval, log and show its summary."""
        self._fold()
        if self._meter.interval.steps:
            self._interval(now, sink, tb)
        self._probe.close()
        self._own_s += own
        self._sink = None
        summary = self.summary()
        try:
            if sink is not None:
                sink.summary(summary)
        finally:
            if sink is not None:
                sink.close()
            if tb is not None:
                tb.close()
            display.close(summary)


def watch(
    loader: Iterable[T],
    *,
    every: int = 100,
    progress: bool = True,
    log: str | os.PathLike[str] | None = None,
    tensorboard: str | os.PathLike[str] | None = None,
    size: Callable[[Any], int | None] | None = None,
) -> Watch[T]:
    """Iterate ``loader`` unchanged while measuring whether training waits for data.

    Per step it measures the time blocked in ``next()`` (data wait), the time from the yield to
    the next request (compute) and the batch size; it computes the starvation ratio
    ``wait / (wait + compute)``, throughput, stalls (a wait far above its running median) and
    periodic wait spikes (a sawtooth). Every ``every`` steps it prints a health line with a
    diagnosis and an action, e.g. ``data-wait 41% of step time: workers 100% busy -> more
    workers or a cheaper transform``. With stoker's ``DataLoader`` it also reads
    ``loader.stats()`` (worker busy fraction, reorder depth, slots, failures, restarts) and the
    workers' PSS; with torch's, the workers' CPU use; with ``pynvml`` and CUDA, GPU use.

    The per-step cost is about two microseconds: four clock reads, a batch-size lookup and
    four appends; the steps are folded into the statistics (and the log) at each health
    interval and progress refresh, the progress bar redraws at most ``REFRESH_HZ`` times a
    second and the loader is read at most every ``SAMPLE_MIN_INTERVAL_S``. The watch times
    its own bookkeeping: ``summary().overhead_s`` is what it added to the run (finished
    passes).

    Example::

        for x, y in stoker.watch(loader, log="run.jsonl"):
            ...
        # later: stoker report run.jsonl -o timeline.png

    Args:
        loader: a ``DataLoader`` (stoker's or torch's) or any iterable, generators included.
        every: steps per health line and interval record (>= 1). Default 100.
        progress: show a progress bar on a terminal or in Jupyter, plain periodic lines
            elsewhere; ``False`` prints nothing. Default ``True``.
        log: write one jsonl record per step, per stall and per interval to this path
            (schema ``stoker.watch`` v1, read by ``stoker report``). Default ``None``.
        tensorboard: write interval scalars to this directory through
            ``torch.utils.tensorboard.SummaryWriter``. Default ``None``.
        size: function counting the samples in a batch, for layouts the default detection
            (first dimension of the first tensor) gets wrong. Default ``None``.

    Returns:
        A :class:`Watch`: iterate it (again for each epoch); ``summary()`` and ``reports``
        hold the results.

    Raises:
        ConfigError: for an invalid argument, an unwritable ``log``, or ``tensorboard`` set
            without the ``tensorboard`` package installed.
    """
    return Watch(
        loader, every=every, progress=progress, log=log, tensorboard=tensorboard, size=size
    )
