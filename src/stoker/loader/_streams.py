"""Which worker's stream an iterable dataset's next task goes to (no processes, no I/O).

Each worker iterates its own copy of an iterable dataset, so a task is addressed to one
worker. torch's rule, kept so that the interleaving of the streams is torch's: the workers take
turns; with ``in_order=False`` a worker whose tasks are all still loading (more than its share
of ``prefetch_factor x num_workers``) is passed over, so a worker stuck on a slow item holds
back only its own stream while the others keep delivering theirs.
"""

from __future__ import annotations

import itertools
from collections.abc import Container, Sequence

__all__ = ["StreamRouter"]


class StreamRouter:
    """Turns of the workers' streams for one epoch.

    Args:
        workers: number of workers (streams).
        in_order: the loader's ``in_order``; False passes over a worker at its share.
    """

    def __init__(self, workers: int, in_order: bool = True) -> None:
        self.in_order = in_order
        self._workers = workers
        self._turns = itertools.cycle(range(workers))
        self._owner: dict[int, int] = {}  # task index -> worker, while the task may be loading

    def pick(self, active: Sequence[bool], loading: Container[int], limit: int) -> int | None:
        """The worker to send the next task to, or None if none may take one now.

        Args:
            active: per worker, whether its stream has not ended.
            loading: task indices sent and not answered yet.
            limit: tasks in flight allowed over all workers (``prefetch_factor x workers``).
        """
        streams = sum(bool(a) for a in active)
        if streams == 0:
            return None
        share = limit // streams
        if not self.in_order:
            self._owner = {i: w for i, w in self._owner.items() if i in loading}
        for _ in range(self._workers):
            worker = next(self._turns)
            if not active[worker]:
                continue
            if self.in_order or self._load(worker) < share:
                return worker
        return None

    def sent(self, idx: int, worker: int) -> None:
        """Task ``idx`` went to ``worker``."""
        if not self.in_order:
            self._owner[idx] = worker

    def _load(self, worker: int) -> int:
        return sum(1 for w in self._owner.values() if w == worker)
