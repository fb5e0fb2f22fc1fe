"""The supervisor (stoker.loader._recovery) alone, over a real thread pool: the hang report
names the worker and batch the consumer waits for, with its stack; a death raises torch's
sentence or, with restarts left, is left to a restart."""

from __future__ import annotations

import time

import pytest
from _datasets import EventGatedDataset, thread_pool

from stoker.errors import WorkerError
from stoker.loader._dispatch import TaskBook, batch_task
from stoker.loader._recovery import Supervisor

# How long a test waits for a worker thread to take its task.
TAKE_WAIT_S = 10.0
POLL_S = 0.01


def test_a_hang_report_names_the_worker_the_batch_and_its_stack() -> None:
    dataset = EventGatedDataset(4, gated=[0])
    pool = thread_pool(dataset)
    try:
        pool.status.set_epoch(0)
        book: TaskBook[object] = TaskBook()
        idx = book.issue([0, 1])
        pool.put_task(batch_task(0, 5, idx, [0, 1]))
        for _ in range(int(TAKE_WAIT_S / POLL_S)):
            if Supervisor.waited_on(pool, book.pending(), 0)[0] is not None:
                break
            time.sleep(POLL_S)
        worker, task, started = Supervisor.waited_on(pool, book.pending(), 0)
        assert (worker, task) == (0, idx) and started is not None
        error = Supervisor(0, iterable=False).timeout_error(pool, book, 0, 1.5)
        text = str(error)
        assert "timed out after 1.5 seconds" in text
        assert "Worker 0 (thread) has been loading batch 0 (sample indices [0, 1])" in text
        assert "__getitem__" in text  # its stack
    finally:
        dataset.gate.set()
        pool.shutdown()


def test_nobody_loading_the_awaited_batch_is_said_so() -> None:
    dataset = EventGatedDataset(4, gated=[0])
    dataset.gate.set()
    pool = thread_pool(dataset)
    try:
        book: TaskBook[object] = TaskBook()
        book.issue([2, 3])
        text = str(Supervisor(0, iterable=False).timeout_error(pool, book, 0, 2.0))
        assert "No worker has started batch 0 (indices [2, 3]) yet." in text
    finally:
        pool.shutdown()


@pytest.mark.parametrize(
    ("restarts", "iterable", "why"),
    [
        (0, False, "raise `max_worker_restarts`"),
        (2, True, "an iterable dataset's stream cannot be resumed"),
    ],
)
def test_a_death_without_a_restart_raises_torchs_sentence(restarts, iterable, why) -> None:
    dataset = EventGatedDataset(4, gated=[0])
    dataset.gate.set()
    pool = thread_pool(dataset)
    try:
        error = Supervisor(restarts, iterable).death_error(pool, (0, 4321, -9), 7, True)
    finally:
        pool.shutdown()
    assert isinstance(error, WorkerError)
    text = str(error)
    assert text.startswith("DataLoader worker (pid 4321) is killed by signal: Killed.")
    assert "epoch 7" in text and why in text


def test_a_death_with_restarts_left_is_restarted_not_raised() -> None:
    dataset = EventGatedDataset(4, gated=[0])
    dataset.gate.set()
    pool = thread_pool(dataset)
    try:
        supervisor = Supervisor(1, iterable=False)
        assert supervisor.death_error(pool, (0, None, 1), 0, True) is None
        assert supervisor.restarts_left == 1 and supervisor.restarts == 0
    finally:
        pool.shutdown()
