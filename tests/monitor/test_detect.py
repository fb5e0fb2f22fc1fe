"""Detectors on exact series: running median, stalls, sawtooth, diagnosis."""

from __future__ import annotations

import statistics

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stoker.monitor import _detect as d
from stoker.monitor._types import LoaderHealth


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(0, 10, allow_nan=False), min_size=1, max_size=80), st.integers(1, 15))
def test_running_median_matches_statistics(values: list[float], window: int) -> None:
    rm = d.RunningMedian(window)
    for i, v in enumerate(values):
        rm.add(v)
        assert rm.median() == pytest.approx(
            statistics.median(values[max(0, i + 1 - window) : i + 1])
        )


def test_stall_rule_is_max_of_factor_and_excess() -> None:
    det = d.StallDetector(window=11, warmup=5)
    for i in range(10):  # median 10 ms: threshold max(50 ms, 60 ms) = 60 ms
        assert det.check(i, 0.010) is None
    assert det.threshold() == pytest.approx(0.010 + d.STALL_MIN_EXCESS_S)
    assert det.check(10, 0.059) is None
    ev = det.check(11, 0.061)
    assert ev is not None and ev.step == 11 and ev.median_s == pytest.approx(0.010)
    det2 = d.StallDetector(window=11, warmup=5)
    for i in range(10):  # median 100 ms: the factor rule wins, 500 ms
        det2.check(i, 0.100)
    assert det2.check(10, 0.45) is None
    assert det2.check(11, 0.51) is not None


def test_no_stall_during_warmup() -> None:
    det = d.StallDetector(window=11, warmup=5)
    assert [det.check(i, w) for i, w in enumerate([0.001, 5.0, 0.001, 0.001, 5.0])] == [None] * 5


@pytest.mark.parametrize("period", [2, 3, 4, 8])
def test_sawtooth_period_found(period: int) -> None:
    waits = [0.020 if i % period == period - 1 else 0.0002 for i in range(128)]
    saw = d.find_sawtooth(waits, [0.005] * 128)
    assert saw is not None and saw.period == period
    assert saw.spike_wait_s == pytest.approx(0.020)
    assert saw.first_spike == period - 1


def test_sawtooth_tolerates_jitter_and_a_missed_spike() -> None:
    waits = [0.0002] * 120
    for k, i in enumerate(range(3, 120, 6)):
        waits[i + (1 if k % 5 == 0 else 0)] = 0.015
    waits[51] = 0.0002  # one spike missing
    saw = d.find_sawtooth(waits, [0.004] * 120)
    assert saw is not None and saw.period == 6


@pytest.mark.parametrize(
    "waits",
    [
        [0.0002] * 100,  # flat
        [0.030] * 100,  # constantly starved: not a sawtooth
        [0.020 if i in (5, 17, 18, 40, 77, 90) else 0.0002 for i in range(100)],  # irregular
        [0.0012 if i % 4 == 0 else 0.0001 for i in range(100)],  # regular but costs ~nothing
    ],
)
def test_no_sawtooth(waits: list[float]) -> None:
    assert d.find_sawtooth(waits, [0.050] * len(waits)) is None


def test_scan_sawtooth_finds_a_late_sawtooth() -> None:
    waits = [0.0002] * 600 + [0.02 if i % 3 == 0 else 0.0002 for i in range(300)]
    saw = d.scan_sawtooth(waits, [0.005] * 900)
    assert saw is not None and saw.period == 3 and saw.first_spike >= 600


def test_diagnosis_lines() -> None:
    v, text, action = d.diagnose(0.02)
    assert (v, text, action) == (
        "healthy",
        "data-wait 2%: input pipeline is not the bottleneck",
        None,
    )
    busy = LoaderHealth(backend="process", num_workers=4, busy_fraction=1.0, busy_source="stats")
    v, text, action = d.diagnose(0.41, loader=busy, cores=16)
    assert v == "starved"
    assert f"{text} -> {action}" == (
        "data-wait 41% of step time: workers 100% busy -> more workers or a cheaper transform"
    )
    idle = LoaderHealth(backend="process", num_workers=4, busy_fraction=0.3, busy_source="stats")
    assert d.diagnose(0.38, loader=idle, cores=16)[1:] == (
        "data-wait 38% of step time: workers 30% busy",
        "the bottleneck is transport or the main process",
    )
    full = LoaderHealth(backend="process", num_workers=8, busy_fraction=0.95, busy_source="stats")
    assert "all 8 cores" in str(d.diagnose(0.5, loader=full, cores=8)[2])
    assert d.diagnose(0.3, num_workers=0, cores=4)[1:] == (
        "data-wait 30% of step time: loading runs in the main process",
        "set `num_workers` (4 cores here)",
    )
    assert d.diagnose(0.10)[0] == "mild"


def test_lockstep_advice_names_stoker_only_to_users_of_another_loader() -> None:
    """A stoker.DataLoader user was told that stoker.DataLoader dispatches to any idle worker."""
    saw = d.find_sawtooth([0.001, 0.001, 0.001, 0.04] * 32, [0.005] * 128)
    assert saw is not None and saw.period == 4
    ours = LoaderHealth(backend="process", num_workers=4, busy_fraction=0.5, busy_source="stats")
    theirs = LoaderHealth(backend="process", num_workers=4, busy_fraction=0.5, busy_source="cpu")
    for health, names_stoker in ((ours, False), (theirs, True), (None, True)):
        _, text, action = d.diagnose(0.3, loader=health, num_workers=4, sawtooth=saw, cores=4)
        assert "workers deliver in lockstep" in text and "raise `prefetch_factor`" in str(action)
        assert ("stoker.DataLoader dispatches" in str(action)) is names_stoker, (health, action)
