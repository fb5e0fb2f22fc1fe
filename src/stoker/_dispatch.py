"""Bookkeeping of dispatched batches and their delivery order (no processes, no I/O).

Every batch a worker is asked for gets the next *task index*; it is also the batch index that
seeds the batch's randomness. Each task gets exactly one reply: data, an error, or "skip" (an
iterable worker that ran out). With ``in_order=True`` replies are delivered by task index
(a reorder buffer holds those that arrive early); otherwise in order of arrival.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any, Generic, TypeVar

from stoker._seeding import batch_seed

__all__ = ["SKIPPED", "TaskBook", "batch_task"]

R = TypeVar("R")


class _Skipped:
    __slots__ = ()

    def __repr__(self) -> str:
        return "SKIPPED"


SKIPPED: Any = _Skipped()


def batch_task(epoch: int, epoch_seed: int, idx: int, index: Any) -> tuple[Any, ...]:
    """The message asking a worker for task ``idx`` of ``epoch``: the samples at ``index``,
    seeded from the task index (whichever worker takes it, whenever)."""
    return ("B", epoch, idx, batch_seed(epoch_seed, idx), index)


class TaskBook(Generic[R]):
    """Issued tasks, replies waiting to be delivered, and the delivery cursor.

    Args:
        in_order: deliver by task index (True) or by arrival (False).
    """

    def __init__(self, in_order: bool = True) -> None:
        self.in_order = in_order
        self.issued = 0  # task indices handed out: 0 .. issued-1
        self.delivered = 0  # replies delivered (skips excluded)
        self._cursor = 0  # next task index to deliver (in-order mode)
        self._pending: dict[int, Hashable | Any] = {}  # task index -> what was asked
        self._ready: dict[int, Any] = {}  # task index -> reply
        self._skipped = 0  # SKIPPED markers in _ready

    @property
    def outstanding(self) -> int:
        """Tasks issued whose reply has not been delivered or skipped yet."""
        return len(self._pending) + len(self._ready) - self._skipped

    @property
    def waiting(self) -> int:
        """Replies that arrived and wait for an earlier task (reorder buffer depth)."""
        return len(self._ready) - self._skipped

    def replies(self) -> list[R]:
        """Replies received and not delivered (to release what they hold when abandoned)."""
        return [r for r in self._ready.values() if r is not SKIPPED]

    def issue(self, request: Any = None) -> int:
        """Record a new task; returns its index."""
        idx = self.issued
        self.issued += 1
        self._pending[idx] = request
        return idx

    def pending(self) -> dict[int, Any]:
        """Tasks issued and not answered yet: task index -> request (do not modify)."""
        return self._pending

    def request(self, idx: int) -> Any:
        """What task ``idx`` asked for (while it is pending)."""
        return self._pending.get(idx)

    def complete(self, idx: int, reply: R) -> Any:
        """Store the reply of task ``idx``; returns the task's request.

        Raises:
            KeyError: if ``idx`` is not pending (never issued, or already answered).
        """
        request = self._pending.pop(idx)
        self._ready[idx] = reply
        return request

    def skip(self, idx: int) -> Any:
        """Task ``idx`` produced nothing (an exhausted iterable worker)."""
        request = self.complete(idx, SKIPPED)
        self._skipped += 1
        return request

    def pop(self) -> tuple[int, R] | None:
        """The next reply to deliver as ``(task index, reply)``, or None if it has not come."""
        ready = self._ready
        while ready:
            if self.in_order:
                reply = ready.pop(self._cursor, None)
                if reply is None:
                    if self._cursor in self._pending:
                        return None
                    # Only possible if a reply was never stored for this index.
                    raise RuntimeError(f"task {self._cursor} is neither pending nor ready")
                idx = self._cursor
                self._cursor += 1
            else:
                idx = next(iter(ready))
                reply = ready.pop(idx)
            if reply is SKIPPED:
                self._skipped -= 1
                continue
            self.delivered += 1
            return idx, reply
        return None
