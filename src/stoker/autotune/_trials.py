"""Judging a trial: a change of the worker count that the blocked share did not call for,
kept or taken back on the delivered rate (pure logic)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["MIN_GAIN", "SHARE_RISE", "Trial", "Verdict", "judge"]

# A trial must raise the delivered batch rate by at least this share to count as paying
# (hill climbing); growth stops once one did not.
MIN_GAIN = 0.03
# A blocked share that rose by more than this over a growth trial came from contention.
SHARE_RISE = 0.1


@dataclass(frozen=True)
class Trial:
    """A change of the worker count that is judged on the delivered rate.

    Attributes:
        kind: ``"grow"`` or ``"shrink"``.
        workers: the count before it.
        rate: the delivered batch rate before it.
        share: the blocked share when it started (None: unmeasured).
    """

    kind: Literal["grow", "shrink"]
    workers: int
    rate: float
    share: float | None


@dataclass(frozen=True)
class Verdict:
    """What a judged trial calls for.

    Attributes:
        gained: the rate's relative gain under a growth trial, for the next growth step
            (None: it needed no judging, the rate was unknown, or it was a shrink).
        back_to: the count to go back to (None: keep the count), and ``reason`` why.
        plateau: a count past which growth does not pay (None: unchanged).
        floor: a count below which shrinking does not pay (None: unchanged).
    """

    gained: float | None
    back_to: int | None = None
    reason: str = ""
    plateau: int | None = None
    floor: int | None = None


def judge(
    trial: Trial,
    rate: float,
    blocked: float | None,
    workers: int,
    need: int | None,
    min_workers: int,
) -> Verdict:
    """Judge ``trial`` at ``workers`` by the ``rate`` measured since, the blocked share now
    and the workers that share calls for (``need``; None: unmeasured)."""
    keep = min(workers, need) if need is not None else 0
    # Blocking that grew with the workers is contention (for a lock, the memory system), not
    # waits more workers cover: the share no longer vouches for them.
    contended = (
        blocked is not None and trial.share is not None and blocked > trial.share + SHARE_RISE
    )
    gained = (rate - trial.rate) / trial.rate if trial.rate > 0 else None
    if trial.kind == "grow" and keep == workers and not contended:
        return Verdict(None)  # growth the blocked share calls for needs no judging
    if trial.kind == "shrink":
        if gained is not None and gained < -MIN_GAIN:
            # Many workers that mostly wait (I/O) can saturate the cores too.
            return Verdict(
                gained,
                trial.workers,
                f"fewer workers lowered the rate ({gained:+.0%}): "
                f"{workers} -> {trial.workers} workers",
                floor=trial.workers,
            )
        # As fast with fewer: growing back past this count would not pay either.
        return Verdict(None, plateau=max(workers, need or 0))
    if gained is None:
        return Verdict(None)
    if gained >= MIN_GAIN:
        # Growth paid: shrinking below this count is not tried for a while.
        return Verdict(gained, floor=workers)
    revert = max(min_workers, trial.workers, 0 if contended else keep)
    if revert >= workers:
        return Verdict(gained, plateau=max(workers, need or 0))
    # The added workers did not raise the rate (the cores are saturated, or something else
    # limits loading): take them back, they cost memory and lengthen every pass's first wave.
    effect = "lowered" if gained < -MIN_GAIN else "did not raise"
    return Verdict(
        gained,
        revert,
        f"adding workers {effect} the rate ({gained:+.0%}): {workers} -> {revert} workers",
        plateau=revert,
    )
