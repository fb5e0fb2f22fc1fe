"""What happens when a sample cannot be loaded: the ``on_error`` policy and its limit.

``on_error="raise"`` (default) re-raises the worker's exception in the main process, as
torch does. ``"skip"`` drops the sample (the batch is smaller); ``"replace"`` loads another
sample chosen from the batch's seed instead, so every batch keeps its size (and every DDP rank
its step count). Either way each failure is recorded as a :class:`Failure` in
``loader.failures`` and counted in ``loader.stats()``; once more samples failed than
``max_failures`` allows, :class:`stoker.FailureLimitError` is raised listing them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, get_args

from stoker.errors import ConfigError, FailureLimitError

__all__ = ["Failure", "FailurePolicy", "OnError"]

OnError = Literal["raise", "skip", "replace"]
_ON_ERROR: tuple[str, ...] = get_args(OnError)
# A fractional `max_failures` is enforced only after this many samples have been seen, so
# that one bad sample among the first few does not stop a run.
PROBATION_SAMPLES = 100
# A replacement is drawn at most this many times before the failed sample is skipped.
MAX_REPLACEMENT_TRIES = 10
_SHOWN = 20


@dataclass(frozen=True)
class Failure:
    """One sample (or batch) that could not be loaded.

    Attributes:
        index: the sample index (for a failed ``collate_fn``: the batch's indices).
        epoch: the loader's epoch (0 for the first).
        worker_id: the worker that tried.
        exc_type: qualified name of the exception's type.
        message: the exception's message.
        replacement: the index loaded instead (``on_error="replace"``), else None.
    """

    index: object
    epoch: int
    worker_id: int
    exc_type: str
    message: str
    replacement: object | None = None

    def __str__(self) -> str:
        where = f"sample {self.index!r} (epoch {self.epoch}, worker {self.worker_id})"
        repl = f", replaced by {self.replacement!r}" if self.replacement is not None else ""
        return f"{where}: {self.exc_type}: {self.message}{repl}"


@dataclass(frozen=True)
class FailurePolicy:
    """``on_error`` and ``max_failures``, validated.

    Args:
        on_error: ``"raise"``, ``"skip"`` or ``"replace"``.
        max_failures: an ``int`` >= 0 (a count), a ``float`` in [0, 1) (a fraction of the
            samples seen, enforced after :data:`PROBATION_SAMPLES`), or ``None`` for no limit.
    """

    on_error: OnError = "raise"
    max_failures: int | float | None = None

    def __post_init__(self) -> None:
        if self.on_error not in _ON_ERROR:
            raise ConfigError(
                f"`on_error` must be one of {', '.join(map(repr, _ON_ERROR))}. "
                f"Found: {self.on_error!r}."
            )
        m = self.max_failures
        if m is None:
            return
        if isinstance(m, bool) or not isinstance(m, (int, float)):
            raise ConfigError(
                f"`max_failures` must be an int count, a float fraction in [0, 1) or None. "
                f"Found: {m!r}."
            )
        if isinstance(m, int) and m < 0:
            raise ConfigError(f"`max_failures` as a count must be >= 0. Found: {m}.")
        if isinstance(m, float) and not (0.0 <= m < 1.0 and math.isfinite(m)):
            raise ConfigError(
                f"`max_failures` as a fraction must be in [0, 1) (e.g. 0.001). Found: {m}. "
                "Pass an int for a count."
            )

    @property
    def tolerant(self) -> bool:
        return self.on_error != "raise"

    def check(self, failures: list[Failure], samples_seen: int) -> None:
        """Raise :class:`FailureLimitError` if ``failures`` exceed the limit.

        Args:
            failures: all failures so far.
            samples_seen: samples delivered plus samples that failed.
        """
        m = self.max_failures
        n = len(failures)
        if m is None or n == 0:
            return
        if isinstance(m, int):
            over = n > m
            limit = f"`max_failures={m}`"
        else:
            over = samples_seen >= PROBATION_SAMPLES and n > m * samples_seen
            limit = f"`max_failures={m}` ({m * samples_seen:.1f} of {samples_seen} samples seen)"
        if not over:
            return
        shown = "\n".join(f"  - {f}" for f in failures[:_SHOWN])
        more = f"\n  ... and {n - _SHOWN} more" if n > _SHOWN else ""
        raise FailureLimitError(
            f"{n} samples failed to load, more than {limit} allows:\n{shown}{more}\n"
            "Fix or remove the bad samples, or raise `max_failures`. All failures are in "
            "`loader.failures`.",
            list(failures),
        )
