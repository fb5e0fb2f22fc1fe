"""The GIL meter's second reading: the share of wall time the loop's thread (the one that
started the meter) spends on a CPU."""

from __future__ import annotations

import time

import pytest

from stoker.autotune._gil import GilMeter, InsideNext

# Readings of 5 wake-ups 10 ms apart: one every ~50 ms.
PERIOD_S, WAKEUPS = 0.01, 5
PHASE_S = 0.5


def _spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


@pytest.mark.measures
def test_the_loops_cpu_share_reads_a_busy_loop_high_and_a_sleeping_one_low() -> None:
    meter = GilMeter(PERIOD_S, WAKEUPS)
    meter.start()
    try:
        time.sleep(PHASE_S)
        asleep = len(meter.loop_cpu())
        _spin(2 * PHASE_S)  # the sentinel waits for the GIL at each wake-up: fewer readings
        shares = meter.loop_cpu()
    finally:
        meter.close()
    assert asleep >= 2 and len(shares) > asleep + 2, shares
    # The reading that straddles both phases is left out of each. On a loaded machine the
    # spinning thread gets a fraction of a core: compared with the sleeping one, not with 1.
    idle, busy = shares[: asleep - 1], shares[asleep + 1 :]
    assert sum(busy) / len(busy) > 5 * (sum(idle) / len(idle) + 0.01), shares
    # Both read once the meter has stopped: a reading may land between two calls while it runs.
    assert len(meter.loop_cpu()) == len(meter.readings())


def test_shares_split_the_loops_own_time_from_the_time_inside_next() -> None:
    # Clocks: (wall, loop's own wall, its CPU outside next, its whole CPU, process CPU).
    before = (10.0, 4.0, 1.0, 1.5, 3.0)
    # 1 s passed, 0.5 s of it outside next(); the loop's thread ran 0.4 s of CPU there (0.1 s
    # more inside next), the process 1.0 s: 0.55 s on other threads, 0.05 s the sentinel's.
    after = (11.0, 4.5, 1.4, 2.0, 4.0)
    share, own, cpu, others = GilMeter._shares(before, after, mine=0.05)
    assert share == pytest.approx(0.4)  # of the wall time
    assert (own, cpu, others) == pytest.approx((0.5, 0.4, 0.45))
    assert GilMeter._shares(None, after, mine=0.0) == (None, 0.0, 0.0, 0.0)


def test_the_step_figures_sum_the_readings_and_need_the_loops_own_time() -> None:
    meter = GilMeter()
    meter._readings = [
        (1.0, 0.0, 0.01, 0.002, 0.0, 0.0, 0.2),  # the loop mostly waited for data
        (2.0, 0.0, 0.5, 0.100, 0.080, 0.090, 0.2),
        (3.0, 0.0, 0.5, 0.100, 0.070, 0.080, 0.2),
    ]
    busy, cores, share = meter.step(3) or (None, None, None)
    assert busy == pytest.approx(0.150 / 0.202) and cores == pytest.approx(0.170 / 0.202)
    assert share == pytest.approx(0.202 / 0.6)
    assert meter.step(1) == pytest.approx((0.7, 0.8, 0.5))
    meter._readings = meter._readings[:1]  # 2 ms of the loop's own: too little to read
    assert meter.step(3) is None
    assert meter.step(0) is None


def test_time_the_caller_counts_as_its_own_is_left_out_of_the_step_figures() -> None:
    # Everything the loop does is "inside next()": the meter still reads the loop's CPU
    # share of the wall time, and no step figures.
    began = time.perf_counter()
    meter = GilMeter(PERIOD_S, WAKEUPS, own_wall=lambda: time.perf_counter() - began)
    meter.start()
    try:
        _spin(PHASE_S)
        loop, step = meter.loop_cpu(), meter.step(WAKEUPS)
    finally:
        meter.close()
    assert loop and step is None


@pytest.mark.measures  # a real GIL meter must finish readings in the window
def test_forget_leaves_out_the_readings_so_far_and_the_one_under_way() -> None:
    meter = GilMeter(PERIOD_S, WAKEUPS)
    meter.start()
    try:
        time.sleep(3 * PERIOD_S * WAKEUPS)
        assert meter.readings()
        meter.forget()
        assert meter.readings() == [] and meter.loop_cpu() == []
        time.sleep(4 * PERIOD_S * WAKEUPS)
        later = meter.readings()
    finally:
        meter.close()
    # The reading under way at forget() is re-based, not kept: at most the rest come in.
    assert 1 <= len(later) <= 3, later


def test_the_next_call_under_way_counts_as_it_goes() -> None:
    inside = InsideNext()
    assert inside.wall() == 0.0 and inside.cpu(123.0) == 0.0
    inside.enter()
    entered_cpu = time.thread_time()
    time.sleep(0.02)
    # Read from another thread mid-call: the wait so far is already stoker's, not the loop's.
    assert inside.wall() >= 0.02
    assert inside.cpu(entered_cpu + 0.005) == pytest.approx(0.005, abs=1e-3)
    inside.leave()
    done = inside.wall()
    assert done >= 0.02
    time.sleep(0.01)  # outside next(): the loop's own time, not counted
    assert inside.wall() == done and inside.cpu(1e9) == inside.cpu(0.0)
