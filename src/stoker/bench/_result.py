"""What a bench run returns: runs, contenders, workloads, and the whole result.

Raw measurements are stored (one :class:`RunSample` per timed run); every figure the report
shows is derived from them by properties here, so that the JSON file can be re-read and
re-reported exactly (see :mod:`stoker.bench._report` for the JSON schema).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from stoker.bench._stats import Ideal, fraction_of, median, ratio, spread
from stoker.bench._train_result import TrainTable
from stoker.errors import ConfigError

__all__ = [
    "BenchResult",
    "ContenderResult",
    "GridPoint",
    "Ramp",
    "Role",
    "RunSample",
    "WorkloadResult",
    "fastest",
]

# What a contender stands for in the comparison (one contender may play several roles).
Role = Literal[
    "torch-nw0",
    "torch-recommended",
    "torch-same",
    "torch-best",
    "torch-persistent",
    "torch-other",
    "stoker",
    "stoker-auto",
    "stoker-watched",
    "optional",
]


@dataclass(frozen=True)
class RunSample:
    """One timed run of one contender.

    Attributes:
        seconds: wall time from ``iter(loader)`` to the last batch consumed.
        samples: samples consumed.
        batches: batches consumed.
        first_batch_s: seconds from ``iter(loader)`` to the first batch.
        main_cpu_s: CPU seconds of the main process during the run.
        tree_cpu_s: CPU seconds of the main process and its workers during the run.
        peak_pss_bytes: peak total PSS of the main process and its workers.
        epoch_first_batch_s: first-batch latency of each epoch (``epochs`` mode only).
        monitor_overhead_s: for a contender wrapped in ``stoker.watch``, the time the watch
            spent on its own bookkeeping during the run (its self-timed cost), else ``None``.
    """

    seconds: float
    samples: int
    batches: int
    first_batch_s: float
    main_cpu_s: float
    tree_cpu_s: float
    peak_pss_bytes: int
    epoch_first_batch_s: tuple[float, ...] = ()
    monitor_overhead_s: float | None = None

    def __post_init__(self) -> None:
        if not self.seconds > 0:
            raise ConfigError(f"`seconds` must be > 0. Found: {self.seconds!r}.")
        if self.samples < 1 or self.batches < 1:
            raise ConfigError(
                f"a run must consume at least one batch. Found: samples={self.samples}, "
                f"batches={self.batches}."
            )

    @property
    def samples_per_s(self) -> float:
        return self.samples / self.seconds

    @property
    def main_cpu_ms_per_batch(self) -> float:
        return 1000 * self.main_cpu_s / self.batches

    @property
    def cpu_s_per_1k_samples(self) -> float:
        return 1000 * self.tree_cpu_s / self.samples


@dataclass(frozen=True)
class ContenderResult:
    """One contender's configuration and runs.

    Attributes:
        name: label shown in the table (``"torch nw=2 pf=4"``, ``"stoker"``).
        library: ``"torch"``, ``"stoker"`` or the optional library's name.
        roles: what it stands for (see :data:`Role`).
        config: loader arguments that define it (``num_workers``, ``prefetch_factor``...).
        runs: one sample per repeat.
        error: why it could not run (then ``runs`` is empty), else ``None``.
    """

    name: str
    library: str
    roles: tuple[Role, ...]
    config: dict[str, Any]
    runs: tuple[RunSample, ...] = ()
    error: str | None = None

    @property
    def monitor_overhead(self) -> float | None:
        """Median share of the run's wall time a ``stoker.watch`` spent on itself, if watched."""
        shares = [r.monitor_overhead_s / r.seconds for r in self.runs if r.monitor_overhead_s]
        return median(shares) if shares else None

    def _median(self, attr: str) -> float | None:
        if not self.runs:
            return None
        return median([float(getattr(r, attr)) for r in self.runs])

    @property
    def ok(self) -> bool:
        return self.error is None and bool(self.runs)

    @property
    def samples_per_s(self) -> float | None:
        return self._median("samples_per_s")

    @property
    def spread(self) -> float | None:
        return spread([r.samples_per_s for r in self.runs]) if self.runs else None

    @property
    def main_cpu_ms_per_batch(self) -> float | None:
        return self._median("main_cpu_ms_per_batch")

    @property
    def cpu_s_per_1k_samples(self) -> float | None:
        return self._median("cpu_s_per_1k_samples")

    @property
    def peak_pss_bytes(self) -> float | None:
        return self._median("peak_pss_bytes")

    @property
    def first_batch_s(self) -> float | None:
        return self._median("first_batch_s")

    @property
    def epoch_first_batch_s(self) -> tuple[float, ...]:
        """Median first-batch latency of each epoch (``epochs`` mode), else ``()``."""
        lists = [r.epoch_first_batch_s for r in self.runs if r.epoch_first_batch_s]
        if not lists:
            return ()
        n = min(len(x) for x in lists)
        return tuple(median([x[i] for x in lists]) for i in range(n))


@dataclass(frozen=True)
class GridPoint:
    """One configuration of a library's grid search (short runs) and its throughput."""

    num_workers: int
    prefetch_factor: int | None
    samples_per_s: float | None
    error: str | None = None
    library: str = "torch"  # or a peer's name: SPDL's num_workers is its thread count


@dataclass(frozen=True)
class Ramp:
    """One ramp run of ``num_workers="auto"``.

    Attributes:
        start_workers: the worker count the controller started from.
        seconds: length of the run, from ``iter()``.
        reference_samples_per_s: the rate the ramp is measured against.
        reach_s: seconds from ``iter()`` to the start of the first window over which the
            loader delivered ``95%`` of the reference (``None``: not within the run).
        epoch_s: an epoch of the workload at the reference rate (``None``: no ``len()``).
        final_workers: workers running at the end (0: the loader loads in the main process).
        backend: the backend the loader chose.
        decisions: the loader's notes (backend choice and worker-count changes).
        error: why the run failed, else ``None``.
    """

    start_workers: int
    seconds: float
    reference_samples_per_s: float
    reach_s: float | None
    epoch_s: float | None
    final_workers: int
    backend: str
    decisions: tuple[str, ...] = ()
    error: str | None = None

    @property
    def share_of_epoch(self) -> float | None:
        """``reach_s`` as a share of an epoch."""
        if self.reach_s is None or not self.epoch_s:
            return None
        return self.reach_s / self.epoch_s


def fastest(contenders: Sequence[ContenderResult], library: str) -> ContenderResult | None:
    """``library``'s contender with the highest median samples/s in the repeats."""
    ran = [c for c in contenders if c.library == library and c.ok]
    return max(ran, key=lambda c: c.samples_per_s or 0.0, default=None)


@dataclass(frozen=True)
class WorkloadResult:
    """Everything measured for one workload.

    Attributes:
        name: workload name.
        description: what it stresses.
        batch_size: samples per batch.
        mode: ``"steady"`` or ``"epochs"``.
        ideal: this machine's limit (or torch's reference where it is not a limit), or
            ``None`` when it could not be measured.
        contenders: every contender, in the order they ran.
        grid: torch's grid search points (empty in ``epochs`` mode).
        notes: remarks printed under the table (reduced grid, skipped contenders...).
        error: why the workload could not run at all, else ``None``.
        duration_s: wall seconds the workload took (data generation included).
        ramps: ramp runs of ``num_workers="auto"`` (full mode, steady workloads).
        train: the ``train`` family's tables, one per step shape (steady workloads).
    """

    name: str
    description: str
    batch_size: int
    mode: str
    ideal: Ideal | None
    contenders: tuple[ContenderResult, ...]
    grid: tuple[GridPoint, ...] = ()
    notes: tuple[str, ...] = ()
    error: str | None = None
    duration_s: float = 0.0
    ramps: tuple[Ramp, ...] = ()
    train: tuple[TrainTable, ...] = ()

    def with_role(self, role: Role) -> ContenderResult | None:
        """The first contender playing ``role`` that ran, or ``None``."""
        for c in self.contenders:
            if role in c.roles and c.ok:
                return c
        return None

    def best(self, library: str) -> ContenderResult | None:
        """``library``'s contender with the highest median samples/s in the repeats."""
        return fastest(self.contenders, library)

    @property
    def torch_best(self) -> ContenderResult | None:
        """The torch contender with the highest median samples/s in the repeats."""
        return self.best("torch")

    @property
    def torch_same(self) -> ContenderResult | None:
        """torch at stoker's ``num_workers`` (its better ``prefetch_factor``)."""
        return self.with_role("torch-same")

    @property
    def stoker(self) -> ContenderResult | None:
        return self.with_role("stoker")

    def ratio_to_best(self, c: ContenderResult) -> float | None:
        best = self.torch_best
        return ratio(c.samples_per_s, best.samples_per_s if best else None)

    def ratio_to_same(self, c: ContenderResult) -> float | None:
        same = self.torch_same
        return ratio(c.samples_per_s, same.samples_per_s if same else None)

    def fraction_of_ideal(self, c: ContenderResult) -> float | None:
        """``c``'s rate as a fraction of this machine's limit; ``None`` where there is no
        limit (not measured, or a reference only: :attr:`Ideal.is_limit`)."""
        limit = self.ideal.samples_per_s if self.ideal and self.ideal.is_limit else None
        return fraction_of(c.samples_per_s, limit)


@dataclass(frozen=True)
class BenchResult:
    """A whole bench run.

    Attributes:
        workloads: one result per workload, in the order they ran.
        quick: whether ``quick`` mode was used.
        repeats: timed runs per contender.
        machine: facts about the machine and versions (cores, platform, torch, stoker...).
        started_at: ISO 8601 UTC time the run started.
        duration_s: wall seconds the whole run took.
    """

    workloads: tuple[WorkloadResult, ...]
    quick: bool
    repeats: int
    machine: dict[str, Any] = field(default_factory=dict)
    started_at: str = ""
    duration_s: float = 0.0

    def workload(self, name: str) -> WorkloadResult:
        """The result of the workload called ``name``.

        Raises:
            KeyError: if it was not run.
        """
        for w in self.workloads:
            if w.name == name:
                return w
        raise KeyError(f"workload {name!r} was not run; ran: {[w.name for w in self.workloads]}")
