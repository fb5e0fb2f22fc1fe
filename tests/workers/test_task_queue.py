"""The workers' task queue: whole records, and a drain that never blocks."""

from __future__ import annotations

import fcntl
import multiprocessing
import os
import threading

import pytest

from stoker.workers._queue import TaskQueue


def _queue(tmp_path) -> TaskQueue:
    reader, writer = multiprocessing.Pipe(duplex=False)
    return TaskQueue(reader, writer, str(tmp_path / "overflow-"))


def test_drain_takes_what_is_queued_and_returns_at_once_when_empty(tmp_path) -> None:
    q = _queue(tmp_path)
    assert q.drain() == []
    q.put(b"a")
    q.put(b"b" * 10_000)  # larger than a record: through a file
    assert q.drain() == [b"a", b"b" * 10_000]
    assert q.drain() == []
    # The read end is blocking again for the workers.
    assert not fcntl.fcntl(q.reader.fileno(), fcntl.F_GETFL) & os.O_NONBLOCK


def test_a_reader_that_finds_the_queue_non_blocking_waits_for_its_task(tmp_path) -> None:
    # While the main process drains, the shared read end is non-blocking: a worker reading
    # then must wait for a task, not fail.
    q = _queue(tmp_path)
    fd = q.reader.fileno()
    fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_NONBLOCK)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(q.get()))
    reader.start()
    q.put(b"task")
    reader.join(timeout=10)
    assert got == [b"task"]


def test_a_task_file_replaced_before_it_is_read_is_refused_not_unpickled(tmp_path) -> None:
    """A process with this uid (or root in another container sharing /dev/shm) could replace a
    queued task file, and the worker unpickled what it found: the record, which crosses the
    pipe, now carries the task's length and digest."""
    q = _queue(tmp_path)
    task = b"t" * 10_000
    for planted in (b"x" * 10_000, b"t" * 9_999, b"t" * 10_000 + b"more", b""):
        q.put(task)
        (path,) = tmp_path.glob("overflow-*")
        path.write_bytes(planted)  # same name, same owner: only the bytes differ
        with pytest.raises(ValueError, match="was changed after the main process wrote it"):
            q.get()
        assert not list(tmp_path.glob("overflow-*"))
    q.put(task)
    assert q.get() == task  # an untouched file still reads
