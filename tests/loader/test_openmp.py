"""The OpenMP spin throttle: held while workers compete with the step's team."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time

import pytest
import torch
from torch.utils.data import Dataset

import stoker
from stoker.loader import _openmp
from stoker.loader._openmp import ENGAGE_CORES, INTERVAL_S, SpinWatch, spin_watch, throttle_held

needs_libgomp = pytest.mark.skipif(
    _openmp.openmp_library() is None, reason="torch here does not run its ops on libgomp"
)
CHILD_LIMIT_S = 60
needs_step_team = pytest.mark.skipif(
    torch.get_num_threads() < 2, reason="a step team needs two threads"
)


class BusyDataset(Dataset[int]):
    """Each sample keeps a core busy for BUSY_S (a worker that competes for the cores)."""

    BUSY_S = 0.004

    def __len__(self) -> int:
        return 100_000

    def __getitem__(self, index: int) -> int:
        end = time.thread_time() + self.BUSY_S
        while time.thread_time() < end:
            pass
        return index


class Readings:
    """A clock and a workers' CPU counter the test moves by hand."""

    def __init__(self) -> None:
        self.now = 100.0
        self.cpu: float | None = 0.0

    def advance(self, seconds: float, cores: float) -> None:
        self.now += seconds
        if self.cpu is not None:
            self.cpu += seconds * cores


def _watch(readings: Readings, threads: int = 2, cores: int = 2) -> SpinWatch:
    return SpinWatch(
        lambda: readings.cpu, lambda: cores, lambda: threads, clock=lambda: readings.now
    )


@pytest.fixture(autouse=True)
def own_throttle(monkeypatch: pytest.MonkeyPatch) -> None:
    """A throttle of each test's own: one another test's live iterator holds (a failed test's
    traceback keeps its frames) lapses only after LEASE_S."""
    monkeypatch.setattr(_openmp, "_THROTTLE", _openmp._Throttle())


def _engaged(readings: Readings, cores: float) -> SpinWatch:
    """A watch that has just engaged the throttle: workers used ``cores`` over an interval."""
    watch = _watch(readings)
    watch.poll()
    readings.advance(INTERVAL_S, cores=cores)
    assert watch.poll() is not None and throttle_held()
    return watch


def _throttle_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "stoker-openmp-throttle"]


@needs_libgomp
def test_the_watch_engages_while_workers_share_the_cores_and_lets_go_when_they_stop() -> None:
    readings = Readings()
    watch = _watch(readings)
    try:
        assert watch.poll() is None  # the first reading only starts an interval
        readings.advance(INTERVAL_S / 2, cores=1.5)
        assert watch.poll() is None and not watch.engaged  # too soon for a second reading
        readings.advance(INTERVAL_S / 2, cores=1.5)
        note = watch.poll()
        assert note is not None and "1.5 cores" in note and "throttled" in note
        assert watch.engaged and throttle_held() and len(_throttle_threads()) == 1
        # Between the two figures it stays as it is (no thread started and stopped each time).
        readings.advance(INTERVAL_S, cores=0.3)
        assert watch.poll() is None and watch.engaged
        readings.advance(INTERVAL_S, cores=0.1)
        note = watch.poll()
        assert note is not None and "left as it was" in note
        assert not watch.engaged and not throttle_held()
    finally:
        watch.close()
    assert not _throttle_threads()


@needs_libgomp
def test_a_single_threaded_step_or_spare_cores_never_engage_it() -> None:
    readings = Readings()
    single = _watch(readings, threads=1)
    roomy = _watch(readings, threads=4, cores=16)  # 4 threads + 8 workers' cores < 16
    for watch in (single, roomy):
        watch.poll()
    readings.advance(INTERVAL_S, cores=8.0)
    assert single.poll() is None and roomy.poll() is None
    assert not single.engaged and not roomy.engaged and not throttle_held()


@needs_libgomp
def test_unmeasured_workers_let_it_go_and_two_watches_share_one_thread() -> None:
    first, second = Readings(), Readings()
    a, b = _watch(first), _watch(second)
    try:
        for watch, readings in ((a, first), (b, second)):
            watch.poll()
            readings.advance(INTERVAL_S, cores=ENGAGE_CORES + 1)
            assert watch.poll() is not None
        assert len(_throttle_threads()) == 1
        second.cpu = None  # b's pool closed: nothing to read
        second.advance(INTERVAL_S, cores=0)
        assert b.poll() is not None and not b.engaged
        assert throttle_held()  # a still holds it
    finally:
        a.close()
        b.close()
    assert not throttle_held() and not _throttle_threads()


@needs_libgomp
def test_a_consumer_that_stops_asking_loses_the_throttle_and_regains_it_by_asking(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_openmp, "LEASE_S", 0.2)
    readings = Readings()
    watch = _engaged(readings, cores=1.5)
    try:
        end = time.monotonic() + CHILD_LIMIT_S
        while throttle_held() and time.monotonic() < end:  # an evaluation mid-epoch
            time.sleep(0.01)
        assert not throttle_held() and not watch.engaged
        join_limit = time.monotonic() + CHILD_LIMIT_S
        while _throttle_threads() and time.monotonic() < join_limit:
            time.sleep(0.01)  # the thread lets go of its team and exits on its own
        assert not _throttle_threads()
        note = watch.poll()
        assert note is not None and "no batch asked for" in note and not throttle_held()
        # The gap is not an interval: the next one starts at the next poll.
        readings.advance(INTERVAL_S * 10, cores=0.0)
        assert watch.poll() is None
        readings.advance(INTERVAL_S, cores=1.5)
        assert watch.poll() is not None and watch.engaged and throttle_held()
    finally:
        watch.close()
    assert not throttle_held()


def test_a_users_wait_policy_or_the_switch_turns_it_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMP_WAIT_POLICY", "active")
    assert spin_watch(lambda: None) is None
    monkeypatch.delenv("OMP_WAIT_POLICY")
    monkeypatch.setenv("STOKER_OPENMP_THROTTLE", "0")
    assert spin_watch(lambda: None) is None


@needs_libgomp
@needs_step_team
@pytest.mark.parametrize("backend", ["process", "thread"])
@pytest.mark.measures  # the throttle engages on the workers' measured CPU
def test_busy_workers_throttle_the_loops_spinning_until_shut_down(
    backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_openmp, "INTERVAL_S", 0.05)
    loader = stoker.DataLoader(BusyDataset(), batch_size=4, num_workers=2, backend=backend)
    it = iter(loader)
    try:
        end = time.monotonic() + 0.8
        while time.monotonic() < end and not throttle_held():
            next(it)
        assert throttle_held(), it.stats().notes
        assert any("libgomp's spinning throttled" in n for n in it.stats().notes)
    finally:
        it._shutdown()
    assert not throttle_held() and not _throttle_threads()


@needs_libgomp
@needs_step_team
@pytest.mark.measures  # the throttle engages on the workers' measured CPU
def test_the_epochs_end_lets_go_of_the_throttle_while_persistent_workers_idle(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_openmp, "INTERVAL_S", 0.05)

    class Short(BusyDataset):
        def __len__(self) -> int:
            return 400  # 1.6 s of a core's work: several intervals

    loader = stoker.DataLoader(Short(), batch_size=4, num_workers=2, persistent_workers=True)
    for _ in range(2):
        it = iter(loader)
        engaged = False
        for _ in it:
            engaged = engaged or throttle_held()
        assert engaged, it.stats().notes
        assert not throttle_held() and any("the epoch ended" in n for n in it.stats().notes)
    it._shutdown()
    assert not _throttle_threads()


_SPIN_CHILD = textwrap.dedent(
    """
    import os, time, torch
    from stoker.loader import _openmp

    def others_cpu():  # nanoseconds on a CPU, of every thread but the main one
        total = 0
        for tid in os.listdir("/proc/self/task"):
            if int(tid) != os.getpid():
                with open(f"/proc/self/task/{tid}/schedstat") as f:
                    total += int(f.read().split()[0])
        return total

    def spun():  # CPU the step's other thread burns after an op, while the main one sleeps
        x = torch.ones(1 << 22)
        best = None
        for _ in range(5):
            x.sum()
            before = others_cpu()
            time.sleep(0.1)
            got = others_cpu() - before
            best = got if best is None else min(best, got)
        return best

    free = spun()
    before = len(os.listdir("/proc/self/task"))
    holder = _openmp.SpinWatch(lambda: 0.0, lambda: 2, lambda: 2)
    _openmp._THROTTLE.acquire(holder, _openmp.openmp_library(), 2)
    held = len(os.listdir("/proc/self/task"))
    throttled = spun()
    _openmp._THROTTLE.release(holder)
    end = time.monotonic() + 5  # the freed team's thread exits on its own, soon after
    while len(os.listdir("/proc/self/task")) > before and time.monotonic() < end:
        time.sleep(0.01)
    print(free, throttled, before, held, len(os.listdir("/proc/self/task")))
    """
)


@needs_libgomp
@pytest.mark.measures
@needs_step_team
def test_held_throttle_stops_the_teams_spinning_and_its_release_frees_its_team() -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    for var in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT"):
        env.pop(var, None)
    out = subprocess.run(
        [sys.executable, "-c", _SPIN_CHILD],
        env=env,
        capture_output=True,
        text=True,
        timeout=CHILD_LIMIT_S,
        check=True,
    ).stdout.split()
    free, throttled = int(out[0]), int(out[1])
    before, held, after = int(out[2]), int(out[3]), int(out[4])
    # Held: the throttling thread and its team's other thread run beside the step's; let go,
    # both are gone.
    assert held == before + 2 and after == before, (before, held, after)
    # Unthrottled, the team's other thread spins 300,000 times after the op (ms); throttled,
    # 1,000 times, then sleeps (the best of five sleeps each).
    assert throttled * 4 < free, (free, throttled)


@needs_libgomp
def test_a_forked_child_starts_unheld() -> None:
    readings = Readings()
    watch = _engaged(readings, cores=2.0)
    try:
        pid = os.fork()
        if pid == 0:  # the child: only the forking thread was copied, no throttling thread
            os._exit(0 if not throttle_held() and not _throttle_threads() else 1)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert throttle_held()  # the parent's is untouched
    finally:
        watch.close()
