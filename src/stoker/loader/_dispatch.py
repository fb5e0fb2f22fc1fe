"""Bookkeeping of dispatched batches and their delivery order (no processes, no I/O).

Every batch a worker is asked for gets the next *task index*; it is also the batch index that
seeds the batch's randomness. Each task gets exactly one reply: data, an error, or "skip" (an
iterable worker that ran out). With ``in_order=True`` replies are delivered by task index
(a reorder buffer holds those that arrive early); otherwise in order of arrival.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any, Generic, TypeVar

from stoker.sampling._seeding import batch_seed
from stoker.workers._messages import BatchTask

__all__ = ["SKIPPED", "TaskBook", "batch_task"]

R = TypeVar("R")


class _Skipped:
    """A task that produced nothing to deliver, with what the caller noted about it."""

    __slots__ = ("note",)

    def __init__(self, note: Any = None) -> None:
        self.note = note

    def __repr__(self) -> str:
        return "SKIPPED" if self.note is None else f"SKIPPED({self.note!r})"


SKIPPED: Any = _Skipped()


def batch_task(epoch: int, epoch_seed: int, idx: int, index: Any) -> BatchTask:
    """The message asking a worker for task ``idx`` of ``epoch``: the samples at ``index``,
    seeded from the task index (whichever worker takes it, whenever)."""
    return BatchTask(epoch, idx, batch_seed(epoch_seed, idx), index)


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
        self._notes: list[Any] = []  # notes of skipped tasks the delivery order has passed

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
        return [r for r in self._ready.values() if not isinstance(r, _Skipped)]

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

    def skip(self, idx: int, note: Any = None) -> Any:
        """Task ``idx`` produced nothing to deliver (an exhausted iterable worker, a batch whose
        samples all failed). A ``note`` (not None) comes back from :meth:`passed_notes` once
        the delivery order passes the task, so that what happened to a skipped task is seen
        in task order, like the replies around it."""
        marker: Any = SKIPPED if note is None else _Skipped(note)
        request = self.complete(idx, marker)
        self._skipped += 1
        return request

    def passed_notes(self) -> list[Any]:
        """The notes of skipped tasks that :meth:`pop` passed since the last call, in the
        order passed."""
        notes, self._notes = self._notes, []
        return notes

    def due(self) -> bool:
        """Whether :meth:`pop` would return a reply now (a skipped task is passed over)."""
        if not self.in_order:
            return self.waiting > 0
        idx = self._cursor
        while idx in self._ready:
            if not isinstance(self._ready[idx], _Skipped):
                return True
            idx += 1
        return False

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
            if isinstance(reply, _Skipped):
                self._skipped -= 1
                if reply.note is not None:
                    self._notes.append(reply.note)
                continue
            self.delivered += 1
            return idx, reply
        return None
