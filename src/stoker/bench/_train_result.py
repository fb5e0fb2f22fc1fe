"""What the ``train`` family measures: training steps fed by each loader, and from memory.

One :class:`TrainSample` per timed run holds the raw accounting (wall seconds, steps, seconds
spent waiting for the next batch, seconds inside the step); every figure of the train table is
derived from them here, medians over the repeats.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from stoker.bench._stats import median, ratio, spread
from stoker.errors import ConfigError

__all__ = ["TrainContender", "TrainSample", "TrainTable"]


@dataclass(frozen=True)
class TrainSample:
    """One timed run of a training loop.

    Attributes:
        seconds: wall time from the first ``next()`` to the end of the last step.
        steps: training steps done.
        wait_s: seconds spent in ``next()``, waiting for a batch.
        step_s: seconds spent inside the step (``seconds = wait_s + step_s``).
        ended: where a stoker loader stood at the end of the run: ``"inline"``, or its
            backend and workers (``"process:8"``, ``"thread:16"``); None for other loaders.
    """

    seconds: float
    steps: int
    wait_s: float
    step_s: float
    ended: str | None = None

    def __post_init__(self) -> None:
        if not self.seconds > 0:
            raise ConfigError(f"`seconds` must be > 0. Found: {self.seconds!r}.")
        if self.steps < 1:
            raise ConfigError(f"a run must do at least one step. Found: steps={self.steps}.")
        if self.wait_s < 0 or self.step_s < 0:
            raise ConfigError(
                f"`wait_s` and `step_s` must be >= 0. Found: {self.wait_s!r}, {self.step_s!r}."
            )

    @property
    def steps_per_s(self) -> float:
        return self.steps / self.seconds

    @property
    def wait_share(self) -> float:
        """Share of the run's wall time spent waiting for data."""
        return self.wait_s / self.seconds

    @property
    def step_ms(self) -> float:
        """Mean milliseconds inside one step (longer than from memory when the loader slows
        the step down: its threads hold the GIL or its workers take the step's cores)."""
        return 1000 * self.step_s / self.steps


def _median_of(runs: tuple[TrainSample, ...], attr: str) -> float | None:
    return median([float(getattr(r, attr)) for r in runs]) if runs else None


@dataclass(frozen=True)
class TrainContender:
    """One loader configuration feeding the training step.

    Attributes:
        name: label shown in the table (as in the loader-only table).
        library: ``"torch"``, ``"stoker"`` or a peer's name.
        roles: what it stands for (the roles of :data:`stoker.bench._result.Role`).
        config: loader arguments that define it.
        runs: one sample per repeat.
        error: why it could not run (then ``runs`` is empty), else ``None``.
    """

    name: str
    library: str
    roles: tuple[str, ...]
    config: dict[str, Any]
    runs: tuple[TrainSample, ...] = ()
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and bool(self.runs)

    @property
    def steps_per_s(self) -> float | None:
        return _median_of(self.runs, "steps_per_s")

    @property
    def spread(self) -> float | None:
        return spread([r.steps_per_s for r in self.runs]) if self.runs else None

    @property
    def wait_share(self) -> float | None:
        return _median_of(self.runs, "wait_share")

    @property
    def step_ms(self) -> float | None:
        return _median_of(self.runs, "step_ms")


@dataclass(frozen=True)
class TrainTable:
    """Every contender feeding one step shape, and the same step fed from memory.

    Attributes:
        shape: ``"gpu"`` (launch phase holding the GIL, then a device wait) or ``"cpu"`` (a
            small model's forward and backward on torch's intra-op threads).
        description: what the step does.
        memory: runs of the same step fed from batches held in memory (no loader at all).
        contenders: every loader configuration, in the order they ran.
    """

    shape: str
    description: str
    memory: tuple[TrainSample, ...]
    contenders: tuple[TrainContender, ...]

    @property
    def memory_steps_per_s(self) -> float | None:
        return _median_of(self.memory, "steps_per_s")

    @property
    def memory_step_ms(self) -> float | None:
        return _median_of(self.memory, "step_ms")

    def slowdown(self, c: TrainContender) -> float | None:
        """The step's own time fed by ``c`` over its time fed from memory (1.0: no slower)."""
        return ratio(c.step_ms, self.memory_step_ms)

    def best(self, library: str) -> TrainContender | None:
        """``library``'s contender with the most training steps/s, or ``None``."""
        ran = [c for c in self.contenders if c.library == library and c.ok]
        return max(ran, key=lambda c: c.steps_per_s or 0.0, default=None)

    def with_role(self, role: str) -> TrainContender | None:
        return next((c for c in self.contenders if role in c.roles and c.ok), None)

    def ratio_to_best(self, c: TrainContender, library: str = "torch") -> float | None:
        """``c``'s steps/s over the best of ``library``'s contenders."""
        best = self.best(library)
        return ratio(c.steps_per_s, best.steps_per_s if best else None)
