"""Public records of the health monitor: one per health interval, one per stall, one per run.

Step timing model (the same in :func:`stoker.watch`, the jsonl log and ``stoker report``)::

    request batch i        batch i arrives          request batch i+1
         |---- wait_i (data wait) ----|---- compute_i (training step) ----|
         |------------------------- step_i -------------------------------|

``wait_i`` is the time the training loop spent blocked in ``next()``; ``compute_i`` is the time
between the yield of batch ``i`` and the request for batch ``i + 1``; the starvation ratio (the
*data-wait fraction*) is ``sum(wait) / sum(wait + compute)`` over the steady-state steps of a
span (all but each pass's first). Start-up, wall time and throughput are defined once, in
:mod:`stoker.monitor._figures`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

__all__ = ["HealthReport", "LoaderHealth", "Sawtooth", "StallEvent", "Verdict", "WatchSummary"]

Verdict = Literal["healthy", "mild", "starved", "short"]
BusySource = Literal["stats", "cpu"]


def _check_fraction(name: str, value: float | None) -> None:
    if value is not None and not 0.0 <= value <= 1.0:
        raise ValueError(f"`{name}` must be in [0, 1]. Found: {value!r}.")


@dataclass(frozen=True)
class StallEvent:
    """A step whose data wait was far above the running median of the waits before it.

    Attributes:
        step: 0-based step index within the watched run.
        wait_s: the step's data wait in seconds.
        median_s: running median of the preceding waits.
        threshold_s: the wait above which the step counted as a stall.
        epoch_start: the stall is the first batch of a new pass over the loader (typically
            workers starting: ``persistent_workers=True`` avoids it).
    """

    step: int
    wait_s: float
    median_s: float
    threshold_s: float
    epoch_start: bool = False

    def __post_init__(self) -> None:
        if self.step < 0 or self.wait_s < 0:
            raise ValueError(
                f"`step` and `wait_s` must be >= 0. Found: {self.step!r}, {self.wait_s!r}."
            )


@dataclass(frozen=True)
class Sawtooth:
    """Data-wait spikes that recur with a regular period.

    Attributes:
        period: steps between consecutive spikes (>= 2).
        spikes: spikes found in the analysed window.
        regularity: share of the gaps between spikes equal to ``period`` (within tolerance).
        spike_wait_s: mean wait of a spike step.
        base_wait_s: typical wait of the other steps (25th percentile of the window).
        cost_fraction: share of the window's step time spent in the spikes' waits.
        first_spike: index of the first spike in the analysed series.
    """

    period: int
    spikes: int
    regularity: float
    spike_wait_s: float
    base_wait_s: float
    cost_fraction: float
    first_spike: int = 0

    def __post_init__(self) -> None:
        if self.period < 2:
            raise ValueError(f"`period` must be >= 2. Found: {self.period!r}.")
        _check_fraction("regularity", self.regularity)


@dataclass(frozen=True)
class LoaderHealth:
    """What the loader itself says at a health interval (``None`` where it cannot tell).

    Attributes:
        backend: ``"inline"``, ``"process"`` or ``"thread"``; ``None`` when unknown.
        num_workers: worker count.
        busy_fraction: mean share of the interval the workers spent fetching and collating
            (0..1), or ``None`` when unknown.
        busy_source: ``"stats"`` (stoker's own busy time) or ``"cpu"`` (CPU time of torch's
            worker processes, which misses time blocked on I/O).
        outstanding: batches dispatched to workers and not yet delivered.
        reorder_depth: batches waiting for an earlier one (in-order delivery).
        slots: shared-memory slots mapped; ``slots_in_use``: slots holding a batch.
        failures: failed samples or batches so far; ``worker_restarts``: respawned workers.
        off_shm_batches: batches so far that the shared-memory directory had no room for
            (carried in slots under the temp directory, or through the pipe).
        pss_bytes: proportional set size of each worker process (bytes), when readable.
        gpu_util: GPU utilisation (0..1) from NVML, when ``pynvml`` and CUDA are present.
    """

    backend: str | None = None
    num_workers: int | None = None
    busy_fraction: float | None = None
    busy_source: BusySource | None = None
    outstanding: int | None = None
    reorder_depth: int | None = None
    slots: int | None = None
    slots_in_use: int | None = None
    failures: int | None = None
    worker_restarts: int | None = None
    off_shm_batches: int | None = None
    pss_bytes: tuple[int, ...] = ()
    gpu_util: float | None = None

    def __post_init__(self) -> None:
        _check_fraction("busy_fraction", self.busy_fraction)
        _check_fraction("gpu_util", self.gpu_util)


@dataclass(frozen=True)
class HealthReport:
    """The monitor's view of one health interval (``every`` steps).

    Attributes:
        step: steps completed so far in the run (the interval ends after this many).
        elapsed_s: wall time since the run started.
        steps: steps in the interval.
        samples: samples in the interval, or ``None`` when batch sizes are unknown.
        wait_s: total data wait in the interval; ``compute_s``: total compute.
        wait_fraction: the data-wait fraction of the interval's steady-state steps.
        samples_per_s: samples over the interval's wall time (``None`` without sizes).
        steps_per_s: steps over the interval's wall time.
        stalls: stall events in the interval.
        sawtooth: periodic wait spikes over the recent window, if any.
        verdict: ``"healthy"``, ``"mild"``, ``"starved"``, or ``"short"`` (an interval of
            nothing but a pass's first step).
        diagnosis: what is happening, e.g. ``"data-wait 41% of step time: workers 100% busy"``.
        action: what to do about it, e.g. ``"more workers or a cheaper transform"``.
        loader: loader internals at the end of the interval, when the loader can tell.
        evidence: what the verdict rests on (see :meth:`Figures.evidence
            <stoker.monitor._figures.Figures.evidence>`).
    """

    step: int
    elapsed_s: float
    steps: int
    samples: int | None
    wait_s: float
    compute_s: float
    wait_fraction: float
    samples_per_s: float | None
    steps_per_s: float
    verdict: Verdict
    diagnosis: str
    action: str | None = None
    stalls: tuple[StallEvent, ...] = ()
    sawtooth: Sawtooth | None = None
    loader: LoaderHealth | None = None
    evidence: str = ""

    def __post_init__(self) -> None:
        _check_fraction("wait_fraction", self.wait_fraction)
        if self.steps < 0 or self.step < self.steps:
            raise ValueError(
                f"`steps` must be in [0, step]. Found: steps={self.steps!r}, step={self.step!r}."
            )

    def line(self) -> str:
        """The health line printed every ``every`` steps."""
        rate = (
            f"{self.samples_per_s:,.0f} samples/s"
            if self.samples_per_s is not None
            else f"{self.steps_per_s:,.1f} steps/s"
        )
        text = f"step {self.step} | {rate} | {self.diagnosis}"
        if self.verdict == "short" and self.evidence != self.diagnosis:
            text += f" ({self.evidence})"
        if self.action:
            text += f" -> {self.action}"
        return text


@dataclass(frozen=True)
class WatchSummary:
    """A whole watched run (or the part of it seen so far).

    Attributes:
        steps: steps completed; ``samples``: samples seen (``None`` when sizes are unknown).
        elapsed_s: wall time of the run (each pass from ``iter()`` to its last step's end).
        wait_s: total data wait; ``compute_s``: total compute (every step).
        wait_fraction: the steady state's starvation ratio (each pass's first step left out).
        samples_per_s: samples over ``elapsed_s`` (``None`` without sizes).
        startup_s: the passes' start-ups (``iter()`` to the first batch), summed.
        steady_steps: the steps the verdict is judged on.
        evidence: what the verdict rests on, e.g. ``steady state: waits 0.30 ms of 2.3 ms per
            step (13%); start-up 26 ms``.
        median_wait_s, p95_wait_s, max_wait_s: distribution of per-step waits.
        median_compute_s: median per-step compute.
        stalls: every stall event of the run.
        sawtooth: periodic wait spikes over the whole run, if any.
        verdict, diagnosis, action: as in :class:`HealthReport`, for the whole run
            (``"short"``: fewer steady-state steps than a verdict needs).
        overhead_s: time the watch itself spent per step between handing over a batch and
            asking for the next (its bookkeeping: its cost to the run), summed over finished
            passes.
    """

    steps: int
    samples: int | None
    elapsed_s: float
    wait_s: float
    compute_s: float
    wait_fraction: float
    samples_per_s: float | None
    median_wait_s: float
    p95_wait_s: float
    max_wait_s: float
    median_compute_s: float
    verdict: Verdict
    diagnosis: str
    action: str | None = None
    stalls: tuple[StallEvent, ...] = field(default_factory=tuple)
    sawtooth: Sawtooth | None = None
    overhead_s: float = 0.0
    startup_s: float = 0.0
    steady_steps: int = 0
    evidence: str = ""

    def __post_init__(self) -> None:
        _check_fraction("wait_fraction", self.wait_fraction)
        if self.steps < 0:
            raise ValueError(f"`steps` must be >= 0. Found: {self.steps!r}.")
