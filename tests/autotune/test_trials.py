"""Judging a trial of the worker count, and the blocked share's bookkeeping, on synthetic
figures (no timing)."""

from __future__ import annotations

import pytest

from stoker.autotune._fill import BLOCKED_MIN_SPANS, BlockedShare
from stoker.autotune._trials import MIN_GAIN, SHARE_RISE, Trial, judge


def test_growth_that_raised_the_rate_is_kept_and_sets_a_floor() -> None:
    verdict = judge(Trial("grow", 2, 100.0, None), 120.0, None, 4, None, 1)
    assert verdict.back_to is None and verdict.floor == 4
    assert verdict.gained == pytest.approx(0.2)


@pytest.mark.parametrize(("rate", "effect"), [(100.5, "did not raise"), (80.0, "lowered")])
def test_growth_that_did_not_pay_is_taken_back_and_sets_a_plateau(rate: float, effect: str) -> None:
    verdict = judge(Trial("grow", 2, 100.0, None), rate, None, 4, None, 1)
    assert verdict.back_to == 2 and verdict.plateau == 2
    assert effect in verdict.reason and "4 -> 2 workers" in verdict.reason


def test_growth_the_blocked_share_calls_for_needs_no_judging() -> None:
    verdict = judge(Trial("grow", 2, 100.0, 0.4), 90.0, 0.4, 4, 6, 1)
    assert verdict == type(verdict)(None)


def test_blocking_that_grew_with_the_workers_is_judged_and_taken_back() -> None:
    verdict = judge(Trial("grow", 2, 100.0, 0.2), 90.0, 0.2 + SHARE_RISE * 2, 4, 6, 1)
    assert verdict.back_to == 2


def test_the_need_keeps_workers_a_noisy_rate_would_take_back() -> None:
    # The share calls for 3 of the 4: a failed growth goes back to 3, not 2.
    verdict = judge(Trial("grow", 2, 100.0, 0.3), 99.0, 0.3, 4, 3, 1)
    assert verdict.back_to == 3


def test_a_shrink_that_lowered_the_rate_is_taken_back_and_sets_a_floor() -> None:
    verdict = judge(Trial("shrink", 8, 100.0, None), 100.0 * (1 - 3 * MIN_GAIN), None, 4, None, 1)
    assert verdict.back_to == 8 and verdict.floor == 8 and "fewer workers" in verdict.reason


def test_a_shrink_that_cost_nothing_is_kept_and_growth_past_it_stops() -> None:
    verdict = judge(Trial("shrink", 8, 100.0, None), 100.0, None, 4, None, 1)
    assert verdict.back_to is None and verdict.plateau == 4 and verdict.gained is None


def test_the_blocked_share_needs_enough_spans_and_decays() -> None:
    share = BlockedShare()
    assert share.share() is None
    share.add(0.3, 0.7, 1, None, 1.0)
    assert share.share() is None  # one span is not enough
    for _ in range(2 * BLOCKED_MIN_SPANS):  # decayed, a few more than the minimum
        share.add(0.3, 0.7, 1, None, 1.0)
    assert share.enough() and share.share() == pytest.approx(0.3)
    for _ in range(40):  # the old spans fade
        share.add(0.0, 1.0, 1, None, 1.0)
    assert share.share() == pytest.approx(0.0, abs=0.01)


def test_the_cores_the_main_process_uses_are_not_loading_cores() -> None:
    share = BlockedShare()
    assert share.loading_cores(4) == 4.0
    share.add(None, None, 0, 1.5, 1.0)  # the main process used 1.5 cores
    assert share.loading_cores(4) == pytest.approx(2.5)
    assert share.loading_cores(1) == 1.0  # never below one


def test_a_prior_share_counts_as_enough_spans_and_a_copy_is_independent() -> None:
    share = BlockedShare()
    share.assume(0.6)
    twin = share.copy()
    assert twin.share() == pytest.approx(0.6)
    twin.add(0.0, 10.0, 10, None, 1.0)
    assert share.share() == pytest.approx(0.6) and twin.share() < 0.1
