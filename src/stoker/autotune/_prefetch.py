"""The prefetch depth for ``prefetch_factor="auto"``: deep enough to absorb the spread of
batch latencies (pure logic)."""

from __future__ import annotations

import math

__all__ = ["MAX_PREFETCH", "MIN_PREFETCH", "PREFETCH_CALM_INTERVALS", "PrefetchSizer"]

MIN_PREFETCH = 2
MAX_PREFETCH = 8
# The prefetch depth rises at once but falls only after this many intervals in a row wanted
# it lower (a latency spread hovering at a boundary would flip it every interval).
PREFETCH_CALM_INTERVALS = 5


class PrefetchSizer:
    """Sizes the prefetch depth from each interval's batch latencies, with hysteresis on
    the way down."""

    def __init__(self) -> None:
        self._lower_wants: list[int] = []  # depths wanted below the current one, in a row

    def size(self, current: int, p50_s: float | None, p95_s: float | None) -> tuple[int, str]:
        """The depth for the next interval, given the ``current`` one and this interval's
        median and 95th percentile batch latencies (None: no batch completed), and why
        (empty when unchanged)."""
        if not (p50_s and p95_s):
            return current, ""
        spread = p95_s / max(p50_s, 1e-6)
        want = min(MAX_PREFETCH, max(MIN_PREFETCH, math.ceil(spread)))
        if want >= current:
            self._lower_wants = []
            if want == current:
                return current, ""
        else:
            self._lower_wants.append(want)
            if len(self._lower_wants) < PREFETCH_CALM_INTERVALS:
                return current, ""
            want = max(self._lower_wants)  # the deepest still wanted lately
            self._lower_wants = []
        return want, f"batch latency p95/p50 = {spread:.1f}: prefetch {current} -> {want}"
