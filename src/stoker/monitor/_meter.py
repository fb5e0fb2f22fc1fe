"""Per-step bookkeeping: batch sizes, totals, the recent window and the current interval.

The meter never reads a clock itself: :class:`stoker.monitor._watch.Watch` passes it the
measured wait and compute of each step, so tests can feed exact timings.

The watch's loop only appends each step's numbers to :class:`Pending` (a few list appends);
:meth:`StepMeter.fold` does the rest for many steps at once, at each health interval and
progress refresh. One step's bookkeeping therefore costs the training loop well under a
microsecond of its own, and the folding runs as a tight loop with warm caches instead of a
few cold instructions between every two batches.
"""

from __future__ import annotations

from array import array
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from stoker.monitor._detect import StallDetector
from stoker.monitor._types import StallEvent

__all__ = ["RECENT_WINDOW", "Interval", "LogHistogram", "Pending", "StepMeter", "batch_size"]

# Steps kept for the progress bar's recent rates and the sawtooth detector.
RECENT_WINDOW = 256
# Quantile histogram of waits and computes: range and resolution.
HIST_MIN_S = 1e-7
HIST_MAX_S = 1e4
HIST_BINS_PER_DECADE = 20
# Values buffered before they are folded into the bins (bounds the buffer's memory).
HIST_FOLD_AT = 1 << 16
# How deep `batch_size` looks into nested containers.
_MAX_DEPTH = 4


def batch_size(batch: Any, _depth: int = 0) -> int | None:
    """Count the samples in a batch; ``None`` when it cannot tell.

    A tensor or array counts its first dimension (a 0-d one counts 1); a mapping counts its
    first value; a tuple or list counts its first element when that is a tensor, an array or a
    container (the collated ``(inputs, targets)`` layout), and its length otherwise (a list of
    strings or numbers).

    Args:
        batch: what the loader yielded.

    Returns:
        The sample count, or ``None``.
    """
    # Runs every step: the common layouts (a tensor, a tuple or list led by one) are tried
    # first, without the slower abstract Mapping check.
    kind = type(batch)
    if kind is tuple or kind is list:
        if batch and type(batch[0]) is torch.Tensor:
            batch = batch[0]
            kind = torch.Tensor
    if kind is torch.Tensor:
        dims = batch.shape
        return int(dims[0]) if dims else 1
    shape = getattr(batch, "shape", None)
    if shape is not None:
        try:
            return int(shape[0]) if len(shape) else 1
        except (TypeError, ValueError):
            return None
    if _depth >= _MAX_DEPTH:
        return None
    if isinstance(batch, (list, tuple)):
        if not batch:
            return 0
        first = batch[0]
        if hasattr(first, "shape") or isinstance(first, (list, tuple, Mapping)):
            return batch_size(first, _depth + 1)
        return len(batch)
    if isinstance(batch, Mapping):
        for value in batch.values():
            return batch_size(value, _depth + 1)
        return 0
    return None


class LogHistogram:
    """Quantiles of a long series of durations in constant memory.

    Values are buffered and folded into ``HIST_BINS_PER_DECADE`` log-spaced bins per decade
    between ``HIST_MIN_S`` and ``HIST_MAX_S`` (a quantile is then within about 6% of the exact
    one); values outside the range land in the end bins.
    """

    def __init__(self) -> None:
        decades = np.log10(HIST_MAX_S / HIST_MIN_S)
        self._edges = np.logspace(
            np.log10(HIST_MIN_S),
            np.log10(HIST_MAX_S),
            round(float(decades) * HIST_BINS_PER_DECADE) + 1,
        )
        self._counts = np.zeros(len(self._edges) + 1, dtype=np.int64)
        self._pending = array("d")

    def extend(self, values: array[float]) -> None:
        """Add many values (folded into the bins once ``HIST_FOLD_AT`` wait)."""
        self._pending.extend(values)
        if len(self._pending) >= HIST_FOLD_AT:
            self._fold()

    def _fold(self) -> None:
        if self._pending:
            values = np.frombuffer(self._pending, dtype=np.float64)
            self._counts += np.bincount(
                np.searchsorted(self._edges, values), minlength=len(self._counts)
            )
            self._pending = array("d")

    def quantile(self, q: float) -> float:
        """The ``q`` quantile (0..1) as the geometric centre of its bin; 0 when empty."""
        self._fold()
        total = int(self._counts.sum())
        if total == 0:
            return 0.0
        i = int(np.searchsorted(np.cumsum(self._counts), q * total, side="left"))
        if i == 0:
            return 0.0 if self._counts[0] else float(self._edges[0])
        if i >= len(self._edges):
            return float(self._edges[-1])
        return float(np.sqrt(self._edges[i - 1] * self._edges[i]))


@dataclass
class Interval:
    """Accumulators of the current health interval (mutable, internal)."""

    start_step: int = 0
    start_time: float = 0.0
    steps: int = 0
    wait_s: float = 0.0
    compute_s: float = 0.0
    samples: int = 0
    sized: bool = True
    iter_s: float = 0.0  # iter() calls that began a pass in this interval
    startup_steps: int = 0  # passes' first steps in this interval, and their times
    startup_wait_s: float = 0.0
    startup_compute_s: float = 0.0


class Pending:
    """Steps recorded by the watch's loop and not yet folded into the meter.

    The containers are cleared in place by :meth:`clear`, so bound ``append`` methods taken
    once stay valid for a whole pass.
    """

    def __init__(self) -> None:
        self.start: array[float] = array("d")  # the batch request, on the watch's clock
        self.wait: array[float] = array("d")
        self.compute: array[float] = array("d")
        self.size: list[int | None] = []

    def __len__(self) -> int:
        return len(self.size)

    def clear(self) -> None:
        """Forget the recorded steps (keeping the containers)."""
        del self.start[:], self.wait[:], self.compute[:], self.size[:]


class StepMeter:
    """Accumulates steps: totals, a recent window, the current interval and stall events.

    Args:
        stall_detector: the detector to run on each wait (a fresh default one if ``None``).
    """

    def __init__(self, stall_detector: StallDetector | None = None) -> None:
        self.stalls = stall_detector or StallDetector()
        self.steps = 0
        self.samples = 0
        self.sized = True
        self.wait_s = 0.0
        self.compute_s = 0.0
        self.max_wait_s = 0.0
        self.wait_hist = LogHistogram()
        self.compute_hist = LogHistogram()
        self.recent_wait: deque[float] = deque(maxlen=RECENT_WINDOW)
        self.recent_compute: deque[float] = deque(maxlen=RECENT_WINDOW)
        self.recent_size: deque[int] = deque(maxlen=RECENT_WINDOW)
        self.stall_events: list[StallEvent] = []
        self.interval = Interval()
        self.pending = Pending()
        self._interval_stalls = 0
        self._epoch_start = False
        self._pass_start = False
        self.iter_s = 0.0
        self.startup_steps = 0
        self.startup_wait_s = 0.0
        self.startup_compute_s = 0.0

    def start_epoch(self) -> None:
        """Mark the next step added as the first of a later pass over the loader."""
        self._epoch_start = True

    def start_pass(self, iter_s: float) -> None:
        """A pass began with an ``iter()`` that took ``iter_s``: its start-up counts it, and
        the next step added is the pass's first (start-up, not steady state)."""
        self._pass_start = True
        self.iter_s += iter_s
        self.interval.iter_s += iter_s

    def fold(self) -> list[StallEvent]:
        """Add the steps in :attr:`pending` (in order), then clear it.

        The same as :meth:`add` for each step, with the sums taken over all of them at once.

        Returns:
            The stall events among them.
        """
        p = self.pending
        n = len(p)
        if not n:
            return []
        waits, computes, sizes = p.wait, p.compute, p.size
        step0 = self.steps
        wait, compute = sum(waits), sum(computes)
        self.steps += n
        self.wait_s += wait
        self.compute_s += compute
        self.max_wait_s = max(self.max_wait_s, max(waits))
        self.recent_wait.extend(waits)
        self.recent_compute.extend(computes)
        self.wait_hist.extend(waits)
        self.compute_hist.extend(computes)
        iv = self.interval
        iv.steps += n
        iv.wait_s += wait
        iv.compute_s += compute
        if None in sizes:
            self.sized = iv.sized = False
            known = [0 if size is None else size for size in sizes]
        else:
            known = sizes  # type: ignore[assignment]  # no None in it
        samples = sum(known)
        self.samples += samples
        iv.samples += samples
        self.recent_size.extend(known)
        if self._pass_start:
            self._pass_start = False
            for acc in (self, iv):
                acc.startup_steps += 1
                acc.startup_wait_s += waits[0]
                acc.startup_compute_s += computes[0]
        events = self.stalls.check_many(step0, waits, epoch_start=self._epoch_start)
        self._epoch_start = False
        self.stall_events.extend(events)
        self._interval_stalls += len(events)
        p.clear()
        return events

    def add(self, wait_s: float, compute_s: float, size: int | None) -> StallEvent | None:
        """Record one completed step now, after any steps in :attr:`pending`.

        Args:
            wait_s: time blocked waiting for the batch.
            compute_s: time from the yield to the next request.
            size: samples in the batch, or ``None`` when unknown.

        Returns:
            The step's :class:`StallEvent`, if it was a stall (or a pending step's).
        """
        p = self.pending
        p.start.append(0.0)
        p.wait.append(wait_s)
        p.compute.append(compute_s)
        p.size.append(size)
        events = self.fold()
        return events[-1] if events else None

    def take_interval(self, now: float) -> tuple[Interval, tuple[StallEvent, ...]]:
        """Close the current interval at time ``now`` and start the next one.

        Returns:
            The closed interval's accumulators and its stall events.
        """
        done = self.interval
        stalls = tuple(self.stall_events[-self._interval_stalls :]) if self._interval_stalls else ()
        self.interval = Interval(start_step=self.steps, start_time=now)
        self._interval_stalls = 0
        return done, stalls

    def recent_rates(self) -> tuple[float, float | None]:
        """(data-wait fraction, samples per second) over the recent window."""
        wait = sum(self.recent_wait)
        total = wait + sum(self.recent_compute)
        if total <= 0:
            return 0.0, None
        rate = sum(self.recent_size) / total if self.sized else None
        return wait / total, rate
