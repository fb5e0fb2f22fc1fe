"""What happens when a sample cannot be loaded: the ``on_error`` policy and its limit.

``on_error="raise"`` (default) re-raises the worker's exception in the main process, as
torch does. ``"skip"`` drops the sample (the batch is smaller); ``"replace"`` loads another
sample chosen from the batch's seed instead, so every batch keeps its size (and every DDP rank
its step count; a sample for which :data:`MAX_REPLACEMENT_TRIES` draws all failed is skipped).
In an ``IterableDataset`` the item that raised is dropped, or replaced by the stream's next
item; the stream goes on if its iterator can (a generator that raised is over: Python ends it).
Either way each failure is recorded as a :class:`Failure` in ``loader.failures`` and counted
in ``loader.stats()``; once more samples failed in one epoch than ``max_failures`` allows,
:class:`stoker.FailureLimitError` is raised listing them. The limit is per epoch: a dataset
with a few corrupt files fails on them every epoch, and that is no reason to stop a long run
at its tenth. An epoch in which every sample failed raises it too, whatever the limit: a
training loop must not run zero steps in silence.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal, get_args

from stoker.errors import ConfigError, FailureLimitError

__all__ = ["Failure", "FailurePolicy", "FailureTally", "OnError"]

OnError = Literal["raise", "skip", "replace"]
_ON_ERROR: tuple[str, ...] = get_args(OnError)
# A fractional `max_failures` is enforced only after this many samples of the epoch have been
# seen (or at the epoch's end, if it is shorter), so that one bad sample among the first few
# does not stop a run.
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

    def check(self, failures: list[Failure], samples_seen: int, epoch_over: bool = False) -> None:
        """Raise :class:`FailureLimitError` if one epoch's ``failures`` exceed the limit.

        Args:
            failures: the epoch's failures so far.
            samples_seen: the epoch's samples delivered plus samples that failed.
            epoch_over: the epoch ended: a fraction is enforced however few samples it had.
        """
        m = self.max_failures
        n = len(failures)
        if m is None or n == 0:
            return
        epoch = failures[0].epoch
        if isinstance(m, int):
            over = n > m
            limit = f"`max_failures={m}`"
        else:
            over = (epoch_over or samples_seen >= PROBATION_SAMPLES) and n > m * samples_seen
            limit = f"`max_failures={m}` ({m * samples_seen:.1f} of {samples_seen} samples seen)"
        if not over:
            return
        raise FailureLimitError(
            f"{n} samples failed to load in epoch {epoch}, more than {limit} allows in an "
            f"epoch:\n{_listing(failures)}\n"
            "Fix or remove the bad samples, or raise `max_failures`. All failures are in "
            "`loader.failures`.",
            list(failures),
        )


def _listing(failures: list[Failure]) -> str:
    shown = "\n".join(f"  - {f}" for f in failures[:_SHOWN])
    more = f"\n  ... and {len(failures) - _SHOWN} more" if len(failures) > _SHOWN else ""
    return shown + more


class FailureTally:
    """One epoch's failures and samples, held against the policy's limit.

    Every failure also goes to ``log`` (``loader.failures``: all epochs).

    Args:
        policy: the loader's policy.
        log: where every failure is appended.
    """

    def __init__(self, policy: FailurePolicy, log: list[Failure]) -> None:
        self.policy = policy
        self.log = log
        self.new_epoch()

    def new_epoch(self) -> None:
        self.failures: list[Failure] = []
        self.samples = 0  # delivered
        self.failed_samples = 0  # failed and not replaced
        self._over = False

    @property
    def seen(self) -> int:
        return self.samples + self.failed_samples

    def record(self, failures: Iterable[tuple[Any, ...]], epoch: int, worker_id: int) -> None:
        """Count a batch's failures ``(index, exc_type, message, replacement)``; raises
        :class:`FailureLimitError` past the limit."""
        for index, exc_type, message, replacement in failures:
            failure = Failure(index, epoch, worker_id, exc_type, message, replacement)
            self.failures.append(failure)
            self.log.append(failure)
            if replacement is None:
                self.failed_samples += 1
        self.policy.check(self.failures, self.seen)

    def delivered(self, requested: int, failures: Iterable[tuple[Any, ...]] = ()) -> None:
        """Count a delivered batch: the ``requested`` samples less those of its ``failures``
        that were skipped. A fraction can be exceeded by early failures alone: it is checked
        as samples come."""
        self.samples += requested
        if failures:  # (most batches have none: this is the per-batch path)
            self.samples -= sum(1 for failure in failures if failure[3] is None)
        if self.failures and isinstance(self.policy.max_failures, float):
            self.policy.check(self.failures, self.seen)

    def end_epoch(self) -> None:
        """The epoch delivered its last batch: enforce a fraction on a short epoch, and raise
        if every sample failed. Once per epoch."""
        if self._over:
            return
        self._over = True
        self.policy.check(self.failures, self.seen, epoch_over=True)
        if self.failures and self.samples == 0:
            raise FailureLimitError(
                f"every sample of epoch {self.failures[0].epoch} failed to load "
                f"({len(self.failures)} failures, nothing delivered):\n{_listing(self.failures)}"
                "\nThe dataset cannot be read as it is: fix the cause above (a path, a mount, "
                "a format). All failures are in `loader.failures`.",
                list(self.failures),
            )
