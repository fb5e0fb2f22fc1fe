"""What the iterator asks of a pool of workers, whether processes or threads."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Literal, Protocol

from stoker.workers._messages import BatchTask, EpochStart, Reply

__all__ = ["Death", "StatusRows", "WorkerBackend"]

#: ``(worker id, pid or None, exit code, replies it sent before dying)``.
Death = tuple[int, int | None, int | None, list[Reply]]


class StatusRows(Protocol):
    """Each worker's current task, shared with the main process without messages."""

    def abandoned(self, epoch: int) -> Callable[[], bool]: ...

    def set_epoch(self, epoch: int) -> None: ...

    def give_up_all(self) -> None: ...

    def task(self, worker_id: int) -> tuple[int, int, float]: ...


class WorkerBackend(Protocol):
    """A pool of workers (:class:`~stoker.workers.WorkerPool` or
    :class:`~stoker.workers._threads.ThreadPool`): tasks in, replies out, deaths reported.

    Attributes:
        kind: ``"process"`` or ``"thread"``.
        closed: true once :meth:`shutdown` ran.
        processes: the worker handles by id (``Process`` or ``Thread``), retired ones too.
        status: the shared status rows.
        capacity: most workers the pool may hold.
        retired: ids of the workers that left on request.
    """

    @property
    def kind(self) -> Literal["process", "thread"]: ...

    @property
    def closed(self) -> bool: ...

    @property
    def processes(self) -> Sequence[Any]: ...

    @property
    def status(self) -> StatusRows: ...

    @property
    def capacity(self) -> int: ...

    @property
    def retired(self) -> set[int]: ...

    @property
    def active(self) -> list[int]:
        """Ids of the workers not retired."""
        ...

    def put_task(self, msg: BatchTask) -> None:
        """Queue a task for whichever worker is idle first."""

    def send_ctrl(self, worker_id: int, msg: BatchTask | EpochStart) -> None:
        """Send one worker an epoch start or (iterable datasets) a task."""

    def drain_tasks(self) -> list[BatchTask]:
        """Take back the tasks no worker has taken yet."""
        ...

    def receive(self, timeout: float) -> list[Reply]:
        """The replies that arrive within ``timeout`` seconds (empty if none)."""
        ...

    def dead(self) -> list[Death]:
        """Workers that ended without being asked, each reported once."""
        ...

    def restart(self, worker_id: int) -> None:
        """Replace a dead worker by a new one with the same id."""

    def room(self) -> int:
        """Workers :meth:`add` can start now."""
        ...

    def add(self) -> int:
        """Start one more worker; returns its id."""
        ...

    def retire(self, count: int = 1) -> None:
        """Ask the ``count`` workers that come free first to leave."""

    def retired_worker(self, worker_id: int) -> None:
        """Record that ``worker_id`` left on request."""

    def dump_stack(self, worker_id: int) -> str:
        """The Python stacks of a worker (for a hang report); "" if unavailable."""
        ...

    def shutdown(self) -> None:
        """Stop every worker and release the pool's resources."""
