"""The GIL meter's second reading: the share of wall time the loop's thread (the one that
started the meter) spends on a CPU."""

from __future__ import annotations

import time

import pytest

from stoker.autotune._gil import GilMeter

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
    assert len(shares) == len(meter.readings())
