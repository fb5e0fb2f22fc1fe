"""The arithmetic of the bench: medians, spreads, ratios and this machine's ideal.

Every figure the bench prints is a median over repeats; the spread is the half range relative
to the median (``(max - min) / 2 / median``), which for 3 to 10 repeats says honestly how far
apart the runs were. Ratios are ratios of medians measured in the same run.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass

from stoker.errors import ConfigError

__all__ = ["Ideal", "fraction_of", "median", "rank_p_lower", "ratio", "spread"]


def median(values: Sequence[float]) -> float:
    """The median of ``values`` (the mean of the two middle values for an even count).

    Raises:
        ConfigError: if ``values`` is empty or holds a NaN.
    """
    if not values:
        raise ConfigError("`values` must hold at least one number. Found: [].")
    if any(math.isnan(v) for v in values):
        raise ConfigError(f"`values` must not hold NaN. Found: {list(values)!r}.")
    ordered = sorted(values)
    mid = len(ordered) // 2
    if len(ordered) % 2:
        return float(ordered[mid])
    return (ordered[mid - 1] + ordered[mid]) / 2


def rank_p_lower(mine: Sequence[float], theirs: Sequence[float]) -> float:
    """How likely runs of two equal contenders fall as low as ``mine`` fell against ``theirs``:
    the exact one-sided p-value of the Mann-Whitney rank test (tied runs share their ranks).

    Only the order of the runs counts, so one disturbed run moves it by one rank at most,
    where it widens a half-range spread. Three runs against three can reach 0.05 at best: all
    of ``mine`` below all of ``theirs``.

    Raises:
        ConfigError: if either is empty.
    """
    if not mine or not theirs:
        raise ConfigError(
            f"rank_p_lower needs runs on both sides. Found: {list(mine)!r}, {list(theirs)!r}."
        )
    n = len(mine)
    pooled = sorted([*mine, *theirs])
    # Doubled mid-ranks (whole numbers): tied runs share the mean of their ranks. U rises with
    # the rank sum of ``mine``, so the p-value is the share of n-run subsets of the pooled
    # runs whose rank sum is no larger than that of ``mine``.
    doubled = {
        v: bisect.bisect_left(pooled, v) + bisect.bisect_right(pooled, v) + 1 for v in pooled
    }
    seen = sum(doubled[v] for v in mine)
    top = sum(doubled[v] for v in pooled)
    # ways[k][t]: subsets of k runs of those seen so far with doubled rank sum t.
    ways = [[0] * (top + 1) for _ in range(n + 1)]
    ways[0][0] = 1
    for value in pooled:
        r = doubled[value]
        for k in range(n, 0, -1):
            below, row = ways[k - 1], ways[k]
            for t in range(top, r - 1, -1):
                row[t] += below[t - r]
    return sum(ways[n][: seen + 1]) / math.comb(len(pooled), n)


def spread(values: Sequence[float]) -> float:
    """Half the range of ``values`` relative to their median (0.05 means +-5%).

    Returns 0.0 for a single value and ``inf`` when the median is 0 but the values differ.

    Raises:
        ConfigError: if ``values`` is empty.
    """
    mid = median(values)
    half_range = (max(values) - min(values)) / 2
    if half_range == 0:
        return 0.0
    if mid == 0:
        return math.inf
    return abs(half_range / mid)


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    """``numerator / denominator``, or ``None`` when either is missing or the denominator <= 0."""
    if numerator is None or denominator is None or denominator <= 0:
        return None
    return numerator / denominator


def fraction_of(value: float | None, limit: float | None) -> float | None:
    """``value`` as a fraction of ``limit`` (``None`` when either is missing or limit <= 0)."""
    return ratio(value, limit)


@dataclass(frozen=True)
class Ideal:
    """This machine's limit for a workload: every usable core busy with nothing but samples.

    ``samples_per_s = cores / cpu_s_per_sample``, where ``cpu_s_per_sample`` is the CPU time
    (all threads of the process) that fetching and collating one sample costs in a single
    process, measured before the contenders run. For CPU-bound work no loader can beat it
    (transport and the consumer's own work come on top); for work that mostly waits (``io``)
    it is the CPU limit that enough concurrency could reach.

    Attributes:
        cores: usable cores (affinity and cgroup quota).
        cpu_s_per_sample: single-process CPU seconds per sample.
        wall_s_per_sample: single-process wall seconds per sample (includes waiting).
        samples: samples the measurement fetched.
        note: how to read the ideal for this workload.
        is_limit: whether every contender must do the measured work, so that the ideal bounds
            them all and a contender's rate reads as a fraction of it. ``False`` where a
            loader can skip part of it (``large``: stoker collates into reused memory, without
            the allocation and page faults measured here): the ideal is then torch's
            reference, and no fraction is reported. Default ``True``.
    """

    cores: int
    cpu_s_per_sample: float
    wall_s_per_sample: float
    samples: int
    note: str = ""
    is_limit: bool = True

    def __post_init__(self) -> None:
        if self.cores < 1:
            raise ConfigError(f"`cores` must be >= 1. Found: {self.cores!r}.")
        if not self.cpu_s_per_sample > 0:
            raise ConfigError(f"`cpu_s_per_sample` must be > 0. Found: {self.cpu_s_per_sample!r}.")
        if self.wall_s_per_sample < 0:
            raise ConfigError(
                f"`wall_s_per_sample` must be >= 0. Found: {self.wall_s_per_sample!r}."
            )
        if self.samples < 1:
            raise ConfigError(f"`samples` must be >= 1. Found: {self.samples!r}.")

    @property
    def samples_per_s(self) -> float:
        """The ideal throughput: ``cores / cpu_s_per_sample``."""
        return self.cores / self.cpu_s_per_sample

    @classmethod
    def from_measurement(
        cls,
        *,
        cores: int,
        cpu_s: float,
        wall_s: float,
        samples: int,
        note: str = "",
        is_limit: bool = True,
    ) -> Ideal:
        """Build an ideal from a single-process measurement.

        Args:
            cores: usable cores.
            cpu_s: CPU seconds the measurement took.
            wall_s: wall seconds it took.
            samples: samples it fetched.
            note: how to read the ideal.
            is_limit: see :class:`Ideal`. Default ``True``.

        Raises:
            ConfigError: if ``samples`` < 1 or ``cpu_s`` <= 0 (too short to measure).
        """
        if samples < 1:
            raise ConfigError(f"`samples` must be >= 1. Found: {samples!r}.")
        # A clock tick of CPU time is the floor: never divide by zero for trivial work.
        cpu = max(cpu_s, 1e-6)
        return cls(
            cores=cores,
            cpu_s_per_sample=cpu / samples,
            wall_s_per_sample=wall_s / samples,
            samples=samples,
            note=note,
            is_limit=is_limit,
        )
