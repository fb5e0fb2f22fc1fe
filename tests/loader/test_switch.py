"""The handover object (stoker.loader._switch.Handover) alone, over real thread pools: it pins
the controller while it watches, decides from the GIL readings, takes queued tasks back, and
returns the pool that replaces the old one (the iterator rebinds nothing of its own here)."""

from __future__ import annotations

import time

import pytest
from _datasets import EventGatedDataset
from torch.utils.data._utils.collate import default_collate

from stoker.autotune._backend_rule import LOOP_TIME_SHARE
from stoker.autotune._gil import MIN_STEP_S, StepFigures
from stoker.autotune._scaling import AutoScaler
from stoker.loader import _switch
from stoker.loader._dispatch import batch_task
from stoker.loader._switch import Handover
from stoker.workers._loop import WorkerSpec
from stoker.workers._messages import EpochStart, GaveUp, ThreadBatch
from stoker.workers._threads import ThreadPool

# How long a test waits for the replacing threads' replies.
REPLY_WAIT_S = 10.0
REPLY_POLL_S = 0.1
POLL_S = 0.01


class _Loader:
    """What the handover keeps of a loader: its wish for threads and its chosen backend."""

    _threads_wanted = True
    _resolved_backend = "process"


def _specs(n: int) -> list[WorkerSpec]:
    return [
        WorkerSpec(i, n, i, "", "", 0, 1, iterable=False, auto_collation=True, drop_last=False)
        for i in range(n)
    ]


@pytest.fixture
def handover():
    loader = _Loader()
    scaler = AutoScaler.for_pool("process", 2, 2, False)
    made = Handover(scaler, 2, loader, started=0.0)
    yield made, scaler, loader
    made.stop()


def test_watching_pins_the_pool_and_a_held_gil_unpins_it(handover, monkeypatch) -> None:
    made, scaler, loader = handover
    controller = scaler.controller
    assert made.state == "watch" and controller.min_workers == controller.max_workers == 2
    dataset = EventGatedDataset()
    dataset.gate.set()
    pool = ThreadPool(_specs(1), (dataset, default_collate, None))
    try:
        monkeypatch.setattr(made.meter, "readings", lambda: [1.0] * (_switch.HANDOVER_READINGS - 1))
        assert made.watch(None, pool, scaler) is None  # not enough readings yet
        monkeypatch.setattr(made.meter, "readings", lambda: [1.0] * _switch.HANDOVER_READINGS)
        note = made.watch(None, pool, scaler)
    finally:
        pool.shutdown()
    assert note is not None and "processes stay" in note
    assert made.state is None and made.meter is None
    assert controller.max_workers > 2 and loader._threads_wanted is False
    assert loader._resolved_backend == "process"


def test_a_free_gil_with_a_busy_loop_thread_keeps_the_processes(handover, monkeypatch) -> None:
    # Small torch ops give the GIL up at every op (it reads free), yet the loop's thread runs.
    made, scaler, loader = handover
    pool = ThreadPool(_specs(1), (EventGatedDataset(), default_collate, None))
    try:
        monkeypatch.setattr(made.meter, "readings", lambda: [0.0] * _switch.HANDOVER_READINGS)
        monkeypatch.setattr(made.meter, "loop_cpu", lambda: [0.2] * _switch.HANDOVER_READINGS)
        monkeypatch.setattr(made.meter, "step", lambda last: StepFigures(0.2, 0.0, 1.0))
        note = made.watch(None, pool, scaler)
    finally:
        pool.shutdown()
    assert note is not None and "launches ops 20%" in note and "processes stay" in note
    assert made.state is None and loader._resolved_backend == "process"
    assert scaler.controller.max_workers > 2


@pytest.mark.parametrize("wall_s", [0.05, 1.0])
def test_a_loop_that_has_hardly_run_outside_next_is_decided_once_the_readings_cover_enough(
    handover, monkeypatch, wall_s: float
) -> None:
    # Readings spent waiting for data show nothing of the step: a short stretch of them does
    # not tell a starved loop from one that only counts its batches; a long one does.
    made, scaler, loader = handover
    pool = ThreadPool(_specs(1), (EventGatedDataset(), default_collate, None))
    readings = [0.0] * _switch.HANDOVER_READINGS
    try:
        monkeypatch.setattr(made.meter, "readings", lambda: readings)
        monkeypatch.setattr(made.meter, "loop_cpu", lambda: [0.0] * len(readings))
        monkeypatch.setattr(made.meter, "step", lambda last: None)
        monkeypatch.setattr(made.meter, "wall", lambda last: wall_s)
        note = made.watch(None, pool, scaler)
        if wall_s * LOOP_TIME_SHARE < MIN_STEP_S:
            assert note is None and made.state == "watch"
            readings = [0.0] * (_switch.STEP_PATIENCE * _switch.HANDOVER_READINGS)
            note = made.watch(None, pool, scaler)  # waited long enough: the wall time decides
    finally:
        pool.shutdown()
    assert note is not None and "handing over to threads" in note
    assert loader._resolved_backend == "thread"


def test_a_free_gil_takes_back_the_queue_and_returns_threads(handover, monkeypatch) -> None:
    made, scaler, loader = handover
    dataset = EventGatedDataset()
    old = ThreadPool(_specs(1), (dataset, default_collate, None))
    replacement = None
    try:
        old.status.set_epoch(0)
        for idx in range(4):  # the one thread blocks in the first; three stay queued
            old.put_task(batch_task(0, 1, idx, [idx]))
        for _ in range(int(REPLY_WAIT_S / POLL_S)):  # until the thread is inside task 0
            if old.status.task(0)[1] == 0:
                break
            time.sleep(POLL_S)
        monkeypatch.setattr(made.meter, "readings", lambda: [0.0] * _switch.HANDOVER_READINGS)
        note = made.watch(None, old, scaler)
        assert note is not None and "handing over to threads" in note
        assert made.draining and loader._resolved_backend == "thread"
        taken = set(made.handback)
        assert len(taken) >= 3 and not made.drained([0, 1, 2, 3])  # one still being loaded
        made.take_back(GaveUp(0, 0, 0), [0], epoch_seed=1)  # the thread gives it up
        assert made.drained([0, 1, 2, 3])
        dataset.gate.set()
        replacement = made.replace(
            old,
            scaler,
            2,
            _specs,
            (dataset, default_collate, None),
            EpochStart(0, None, None, None),
        )
        assert old.closed and not made.draining and made.handback == {}
        assert isinstance(replacement.pool, ThreadPool) and len(replacement.pool.active) >= 2
        assert "process workers ->" in replacement.note
        got: set[int] = set()
        for _ in range(int(REPLY_WAIT_S / REPLY_POLL_S)):
            replies = replacement.pool.receive(REPLY_POLL_S)
            got |= {m.idx for m in replies if isinstance(m, ThreadBatch)}
            if got >= {0, 1, 2, 3}:
                break
        assert got >= {0, 1, 2, 3}
    finally:
        dataset.gate.set()
        old.shutdown()
        if replacement is not None:
            replacement.pool.shutdown()
