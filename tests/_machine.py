"""A mark for tests whose verdict measures this machine.

The backend probe and the GIL meter decide from what they measure: whether two threads load
nearly twice as fast as one, how long a thread waits for the GIL. That is their job, and on a
machine where another job takes a core for a moment (a shared CI runner, a parallel build)
they rightly measure something else. Such a test runs again, up to :data:`MEASURED_RERUNS`
times, before it fails: a decision that is wrong every time still fails.
"""

from __future__ import annotations

import pytest

MEASURED_RERUNS = 2

measures_the_machine = pytest.mark.flaky(reruns=MEASURED_RERUNS)
