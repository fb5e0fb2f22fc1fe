"""One definition of a run's figures and its verdict, shared by ``stoker.watch`` and
``stoker report``, so that the same run gives the same numbers live and from its log.

* **step**: from the request of a batch to the request of the next one, less the watch's own
  bookkeeping: ``wait`` (blocked in ``next()``) plus ``compute`` (the loop's work).
* **start-up** of a pass over the loader: from the ``iter()`` call to the arrival of the first
  batch (worker start, the pipeline's fill): ``iter()``'s own time plus the first step's wait.
* **steady state**: every step but the first of each pass. The verdict and the data-wait
  fraction are judged on it alone: a slow start says nothing about the steps after it.
* **wall time**: per pass, from ``iter()`` to the end of its last step (``iter()``'s time plus
  every step), summed over passes; the ``next()`` that ends a pass is not in it.
* **throughput**: samples (or steps, without batch sizes) over the wall time.
* **short run**: fewer than ``SHORT_RUN_STEPS`` steady-state steps: too few to judge.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from stoker.monitor._detect import diagnose, wait_fraction
from stoker.monitor._types import LoaderHealth, Sawtooth, StallEvent, Verdict

__all__ = ["SHORT_RUN_STEPS", "Figures", "Judgement", "Totals", "judge", "ms"]

#: Fewest steady-state steps (after each pass's first) that a run's verdict is judged on.
SHORT_RUN_STEPS = 10


class Totals(Protocol):
    """What the watch's meter and a health interval accumulate (see :class:`Figures`)."""

    steps: int
    samples: int
    sized: bool
    iter_s: float
    wait_s: float
    compute_s: float
    startup_steps: int
    startup_wait_s: float
    startup_compute_s: float


def ms(seconds: float) -> str:
    """A duration in milliseconds with about two significant digits (``0.31 ms``, ``26 ms``)."""
    x = seconds * 1e3
    if x >= 10:
        return f"{x:,.0f} ms"
    return f"{x:.1f} ms" if x >= 1 else f"{x:.2f} ms"


@dataclass(frozen=True)
class Figures:
    """A run's (or an interval's) figures under the module's definitions.

    Attributes:
        steps: every step; ``samples``: their samples (``None`` when sizes are unknown).
        wait_s, compute_s: totals over every step.
        startup_s: the passes' start-ups (``iter()`` to the first batch), summed.
        steady_steps, steady_wait_s, steady_compute_s: the steady-state steps and totals.
        wall_s: the wall time.
    """

    steps: int
    samples: int | None
    wait_s: float
    compute_s: float
    startup_s: float
    steady_steps: int
    steady_wait_s: float
    steady_compute_s: float
    wall_s: float

    @classmethod
    def of(cls, totals: Totals) -> Figures:
        """The figures of the watch's meter or of one of its intervals."""
        return cls(
            steps=totals.steps,
            samples=totals.samples if totals.sized else None,
            wait_s=totals.wait_s,
            compute_s=totals.compute_s,
            startup_s=totals.iter_s + totals.startup_wait_s,
            steady_steps=totals.steps - totals.startup_steps,
            steady_wait_s=totals.wait_s - totals.startup_wait_s,
            steady_compute_s=totals.compute_s - totals.startup_compute_s,
            wall_s=totals.iter_s + totals.wait_s + totals.compute_s,
        )

    @property
    def wait_fraction(self) -> float:
        """The steady state's share of step time spent waiting for data."""
        return wait_fraction(self.steady_wait_s, self.steady_compute_s)

    @property
    def samples_per_s(self) -> float | None:
        """Samples over the wall time (``None`` without batch sizes)."""
        if self.samples is None or self.wall_s <= 0:
            return None
        return self.samples / self.wall_s

    @property
    def steps_per_s(self) -> float:
        """Steps over the wall time."""
        return self.steps / self.wall_s if self.wall_s > 0 else 0.0

    def evidence(self) -> str:
        """What the verdict rests on, e.g. ``steady state: waits 0.30 ms of 2.3 ms per step
        (13%); start-up 26 ms``."""
        n = self.steady_steps
        if n == 0:
            return f"start-up only: first batch after {ms(self.startup_s)}"
        wait, step = self.steady_wait_s / n, (self.steady_wait_s + self.steady_compute_s) / n
        return (
            f"steady state: waits {ms(wait)} of {ms(step)} per step ({self.wait_fraction:.0%}); "
            f"start-up {ms(self.startup_s)}"
        )


@dataclass(frozen=True)
class Judgement:
    """The verdict on some figures, what it rests on, and what to do."""

    verdict: Verdict
    diagnosis: str
    action: str | None
    evidence: str


def judge(
    figures: Figures,
    *,
    min_steps: int = SHORT_RUN_STEPS,
    loader: LoaderHealth | None = None,
    num_workers: int | None = None,
    sawtooth: Sawtooth | None = None,
    stalls: Sequence[StallEvent] = (),
    cores: int = 1,
) -> Judgement:
    """The verdict on the steady state of ``figures`` (see the module doc).

    Args:
        figures: the run's or the interval's figures.
        min_steps: fewest steady-state steps to judge; fewer give the verdict ``"short"``.
        loader, num_workers, sawtooth, stalls, cores: as for
            :func:`stoker.monitor._detect.diagnose`.

    Returns:
        A :class:`Judgement`; its action is ``None`` unless the verdict is mild or starved.
    """
    evidence = figures.evidence()
    if figures.steady_steps == 0:  # an interval of nothing but a pass's first step
        return Judgement("short", evidence, None, evidence)
    if figures.steady_steps < min_steps:
        text = (
            f"too short to judge: {figures.steady_steps} steps after start-up "
            f"(the verdict needs {min_steps})"
        )
        return Judgement("short", text, None, evidence)
    verdict, text, action = diagnose(
        figures.wait_fraction,
        loader=loader,
        num_workers=num_workers,
        sawtooth=sawtooth,
        stalls=stalls,
        cores=cores,
    )
    return Judgement(verdict, text, action, evidence)
