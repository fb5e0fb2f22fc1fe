"""What each worker is doing, in shared memory: read by the main process without messages.

One row per worker: the task index it works on (-1 when idle), when it started it
(``time.monotonic``, which is system-wide on Linux), the epoch, and its pid. A worker writes
its row when it takes and finishes a task; the main process reads rows to find the batches a
dead worker held, to name the worker a timeout waits on, and to show stalls in the stats.
A last row, the main process's, holds the epoch being loaded: workers read it between samples
and give up a batch of an earlier epoch, one the loop abandoned (an early ``break``).
"""

from __future__ import annotations

import ctypes
import os
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from stoker.transport._mapping import map_file
from stoker.transport._namespace import create_private_file

__all__ = ["GIVE_UP_ALL", "IDLE", "LocalStatus", "StatusTable"]

IDLE = -1
# An epoch later than any: set as the epoch being loaded, every task is given up.
GIVE_UP_ALL = 2**62
_ROW = 8  # int64/float64 fields per row (room to grow)
_TASK, _STARTED, _EPOCH, _PID = 0, 1, 2, 3


class StatusTable:
    """Rows of worker status in a shared file.

    Args:
        path: the file (created by the main process with :meth:`create`).
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self._buf: Any = None
        self._ints: np.ndarray | None = None
        self._floats: np.ndarray | None = None
        self._current: Any = None  # the epoch being loaded (a ctypes int64 in the last row)

    @classmethod
    def create(cls, path: str, rows: int) -> StatusTable:
        fd = create_private_file(path)
        try:
            os.ftruncate(fd, (max(1, rows) + 1) * _ROW * 8)  # + the main process's row
        finally:
            os.close(fd)
        table = cls(path)
        table._attach()
        assert table._ints is not None
        table._ints[:, _TASK] = IDLE
        return table

    def __getstate__(self) -> dict[str, Any]:
        return {"path": self.path}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["path"])  # type: ignore[misc]

    def _attach(self) -> None:
        if self._buf is None:
            self._buf = map_file(self.path)
            raw = np.frombuffer(self._buf, dtype=np.uint8)
            self._ints = raw.view(np.int64).reshape(-1, _ROW)
            self._floats = raw.view(np.float64).reshape(-1, _ROW)
            offset = (len(self._ints) - 1) * _ROW * 8
            self._current = ctypes.c_int64.from_buffer(self._buf, offset)

    # -- worker side ---------------------------------------------------------------------

    def begin(self, worker_id: int, epoch: int, task: int) -> None:
        self._attach()
        assert self._ints is not None and self._floats is not None
        self._floats[worker_id, _STARTED] = time.monotonic()
        self._ints[worker_id, _EPOCH] = epoch
        self._ints[worker_id, _TASK] = task

    def end(self, worker_id: int) -> None:
        assert self._ints is not None
        self._ints[worker_id, _TASK] = IDLE

    def abandoned(self, epoch: int) -> Callable[[], bool]:
        """A check, cheap enough to run between samples, that a later epoch than ``epoch`` is
        loaded (epochs only count up: a resumed earlier epoch gives nothing up)."""
        self._attach()
        current = self._current
        return lambda: current.value > epoch

    def hello(self, worker_id: int) -> None:
        self._attach()
        assert self._ints is not None
        self._ints[worker_id, _PID] = os.getpid()
        self._ints[worker_id, _TASK] = IDLE

    # -- main side -----------------------------------------------------------------------

    def task(self, worker_id: int) -> tuple[int, int, float]:
        """``(epoch, task index or IDLE, started)`` of one worker."""
        self._attach()
        assert self._ints is not None and self._floats is not None
        row_i = self._ints[worker_id]
        return int(row_i[_EPOCH]), int(row_i[_TASK]), float(self._floats[worker_id, _STARTED])

    def reset(self, worker_id: int) -> None:
        self._attach()
        assert self._ints is not None
        self._ints[worker_id, _TASK] = IDLE

    def set_epoch(self, epoch: int) -> None:
        """The epoch now loaded: tasks of earlier ones are given up at their next sample."""
        self._attach()
        self._current.value = epoch

    def give_up_all(self) -> None:
        """Every task is given up at its next sample (the pool is being replaced)."""
        self.set_epoch(GIVE_UP_ALL)


class LocalStatus:
    """A thread pool's status rows: the interface of :class:`StatusTable`, in plain memory."""

    def __init__(self, rows: int) -> None:
        self._rows = [[0, IDLE, 0.0] for _ in range(rows)]
        self._current = -1  # the epoch being loaded

    def abandoned(self, epoch: int) -> Callable[[], bool]:
        return lambda: self._current > epoch

    def set_epoch(self, epoch: int) -> None:
        self._current = epoch

    def give_up_all(self) -> None:
        self._current = GIVE_UP_ALL

    def begin(self, worker_id: int, epoch: int, task: int) -> None:
        self._rows[worker_id] = [epoch, task, time.monotonic()]

    def end(self, worker_id: int) -> None:
        self._rows[worker_id][1] = IDLE

    def task(self, worker_id: int) -> tuple[int, int, float]:
        epoch, task, started = self._rows[worker_id]
        return int(epoch), int(task), float(started)

    def reset(self, worker_id: int) -> None:
        self.end(worker_id)
