"""Medians, spreads, ratios and the ideal."""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from stoker.bench._stats import Ideal, fraction_of, median, rank_p_lower, ratio, spread
from stoker.errors import ConfigError


def test_median_odd_and_even_counts() -> None:
    assert median([3.0, 1.0, 2.0]) == 2.0
    assert median([4.0, 1.0, 3.0, 2.0]) == 2.5
    assert median([7.0]) == 7.0


def test_median_rejects_empty_and_nan() -> None:
    with pytest.raises(ConfigError, match="at least one"):
        median([])
    with pytest.raises(ConfigError, match="NaN"):
        median([1.0, math.nan])


@given(st.lists(st.floats(-1e6, 1e6), min_size=1, max_size=30))
def test_median_lies_between_min_and_max(values: list[float]) -> None:
    m = median(values)
    assert min(values) <= m <= max(values)
    below = sum(v <= m for v in values)
    above = sum(v >= m for v in values)
    assert below >= len(values) / 2 and above >= len(values) / 2


def test_spread_is_half_range_over_median() -> None:
    assert spread([90.0, 100.0, 110.0]) == pytest.approx(0.10)
    assert spread([5.0]) == 0.0
    assert spread([2.0, 2.0]) == 0.0
    assert spread([-1.0, 0.0, 1.0]) == math.inf


def test_ratio_and_fraction_handle_missing_values() -> None:
    assert ratio(3.0, 2.0) == 1.5
    assert ratio(None, 2.0) is None
    assert ratio(3.0, None) is None
    assert ratio(3.0, 0.0) is None
    assert fraction_of(50.0, 200.0) == 0.25


def test_ideal_is_cores_over_cpu_cost_per_sample() -> None:
    ideal = Ideal.from_measurement(cores=2, cpu_s=0.5, wall_s=1.0, samples=250, note="n")
    assert ideal.cpu_s_per_sample == pytest.approx(0.002)
    assert ideal.wall_s_per_sample == pytest.approx(0.004)
    assert ideal.samples_per_s == pytest.approx(1000.0)
    assert ideal.note == "n"


def test_ideal_uses_cpu_not_wall_time() -> None:
    # Waiting (wall >> cpu) does not lower the limit: concurrency can hide it.
    waiting = Ideal.from_measurement(cores=4, cpu_s=0.1, wall_s=10.0, samples=100)
    busy = Ideal.from_measurement(cores=4, cpu_s=0.1, wall_s=0.1, samples=100)
    assert waiting.samples_per_s == busy.samples_per_s == pytest.approx(4000.0)


def test_ideal_survives_unmeasurably_cheap_work() -> None:
    ideal = Ideal.from_measurement(cores=1, cpu_s=0.0, wall_s=0.0, samples=10)
    assert math.isfinite(ideal.samples_per_s) and ideal.samples_per_s > 0


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"cores": 0}, "`cores`"),
        ({"cpu_s_per_sample": 0.0}, "`cpu_s_per_sample`"),
        ({"wall_s_per_sample": -1.0}, "`wall_s_per_sample`"),
        ({"samples": 0}, "`samples`"),
    ],
)
def test_ideal_validates_its_fields(kwargs: dict[str, float], match: str) -> None:
    fields = {"cores": 2, "cpu_s_per_sample": 0.001, "wall_s_per_sample": 0.001, "samples": 5}
    with pytest.raises(ConfigError, match=match):
        Ideal(**{**fields, **kwargs})  # type: ignore[arg-type]


def test_ideal_from_measurement_rejects_zero_samples() -> None:
    with pytest.raises(ConfigError, match="`samples`"):
        Ideal.from_measurement(cores=2, cpu_s=1.0, wall_s=1.0, samples=0)


def test_rank_p_lower_known_values() -> None:
    assert rank_p_lower([1, 2, 3], [4, 5, 6]) == pytest.approx(1 / 20)  # all below: 1 of 20
    assert rank_p_lower([1, 2, 4], [3, 5, 6]) == pytest.approx(2 / 20)
    assert rank_p_lower([4, 5, 6], [1, 2, 3]) == 1.0
    assert rank_p_lower([1, 2, 3, 4, 5], [6, 7, 8, 9, 10]) == pytest.approx(1 / 252)
    assert rank_p_lower([1], [2]) == 0.5
    assert rank_p_lower([1, 2], [1, 2]) == pytest.approx(5 / 6)  # tied runs share ranks
    assert rank_p_lower([3, 3], [3, 3, 3]) == 1.0
    with pytest.raises(ConfigError, match="runs on both sides"):
        rank_p_lower([], [1.0])


def _by_enumeration(mine: list[float], theirs: list[float]) -> float:
    """Every way of labelling the pooled runs as ``mine``, equally likely when both are equal."""
    pooled = mine + theirs
    n = len(mine)

    def u(a: list[float], b: list[float]) -> float:
        return sum(1.0 if x > y else 0.5 if x == y else 0.0 for x in a for y in b)

    seen = u(mine, theirs)
    hits = total = 0
    for chosen in itertools.combinations(range(len(pooled)), n):
        a = [pooled[i] for i in chosen]
        b = [pooled[i] for i in range(len(pooled)) if i not in chosen]
        total += 1
        hits += u(a, b) <= seen
    return hits / total


@given(
    st.lists(st.integers(0, 6), min_size=1, max_size=5),
    st.lists(st.integers(0, 6), min_size=1, max_size=5),
)
def test_rank_p_lower_is_the_share_of_labellings_as_low(mine: list[int], theirs: list[int]) -> None:
    a, b = [float(x) for x in mine], [float(x) for x in theirs]
    assert rank_p_lower(a, b) == pytest.approx(_by_enumeration(a, b))
