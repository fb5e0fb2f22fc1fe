"""What the multi-worker iterator does when a worker hangs or dies.

A hang: the consumer waited ``timeout`` seconds; the error names the worker loading the awaited
batch (from the shared status table), the batch's sample indices, and that worker's Python
stacks (faulthandler, on SIGUSR1). A death: with restarts left, the worker is replaced and the
batches it held are dispatched again (a batch still queued or being loaded by a live worker is
left alone; a duplicate reply is ignored); otherwise the error names the signal, its likely
cause, and for a worker that never reported, why a spawned child may have died at once.
"""

from __future__ import annotations

import signal
import time
import warnings
from typing import Any

from stoker._introspect.platform import shm_dir, shm_free_bytes
from stoker.errors import WorkerError, WorkerTimeoutError
from stoker.loader._dispatch import batch_task
from stoker.workers._process import describe_exit, torch_killed_sentence, worker_pid
from stoker.workers._spawn import explain_early_worker_death
from stoker.workers._status import IDLE

__all__ = ["RecoveryMixin"]


def _short(indices: Any, limit: int = 16) -> str:
    try:
        items = list(indices)
    except TypeError:
        return repr(indices)
    text = ", ".join(map(repr, items[:limit]))
    return f"[{text}{', ...' if len(items) > limit else ''}]"


class RecoveryMixin:
    """Hang reports and worker restarts for :class:`stoker.loader._iterator.MultiWorkerIterator`."""

    # Provided by the iterator.
    _pool: Any
    _book: Any
    _backend: str
    _epoch: int
    _epoch_seed: int
    _restarts_left: int
    _restarts: int
    _worker_batches: Any
    _workers: Any
    _ready: set[int]
    _iterable: bool

    def _shutdown(self) -> None:  # pragma: no cover - the iterator's
        raise NotImplementedError

    def _catch_up_message(self) -> tuple[Any, ...]:  # pragma: no cover - the iterator's
        raise NotImplementedError

    def _waited_on(self) -> tuple[int | None, int | None, float | None]:
        """``(worker id, task index, started)`` of the batch the consumer waits for."""
        pool = self._pool
        assert pool is not None
        pending = sorted(self._book.pending())
        best: tuple[int | None, int | None, float | None] = (
            None,
            pending[0] if pending else None,
            None,
        )
        for i in pool.active:
            epoch, task, started = pool.status.task(i)
            if task != IDLE and epoch == self._epoch and task in pending:
                if best[0] is None or task < (best[1] if best[1] is not None else task + 1):
                    best = (i, task, started)
        return best

    def _raise_timeout(self, timeout: float) -> None:
        pool = self._pool
        assert pool is not None
        worker, task, started = self._waited_on()
        indices = self._book.request(task) if task is not None else None
        lines = [f"DataLoader timed out after {timeout} seconds waiting for a batch."]
        if worker is not None:
            busy = time.monotonic() - started if started else 0.0
            who = (
                f"pid {worker_pid(pool.processes[worker])}"
                if self._backend == "process"
                else "thread"
            )
            lines.append(
                f"Worker {worker} ({who}) has been loading batch {task} "
                f"(sample indices {_short(indices)}) for {busy:.1f} s."
            )
            stack = pool.dump_stack(worker)
            if stack:
                lines.append(f"Its Python stack:\n{stack.rstrip()}")
        elif task is not None:
            lines.append(f"No worker has started batch {task} (indices {_short(indices)}) yet.")
        lines.append("Raise `timeout`, or find what blocks in `__getitem__` (stack above).")
        raise WorkerTimeoutError("\n".join(lines))

    def _worker_died(self, worker_id: int, pid: int | None, code: int | None) -> None:
        pool = self._pool
        assert pool is not None
        how = describe_exit(code)
        if code == -signal.SIGBUS:
            how += f"; {shm_dir()} has {shm_free_bytes()} bytes free now"
        if self._restarts_left <= 0 or self._iterable:
            self._shutdown()
            why = (
                "an iterable dataset's stream cannot be resumed in a new worker"
                if self._iterable and self._restarts_left > 0
                else "raise `max_worker_restarts` to respawn dead workers"
            )
            hint = None
            if self._backend == "process" and not self._worker_batches[worker_id]:
                hint = explain_early_worker_death(pool.start_method)
            killed = torch_killed_sentence(pid, code)
            opening = (
                f"{killed} Worker {worker_id} died of {how} while"
                if killed
                else f"DataLoader worker (pid {pid}) exited unexpectedly with {how}. Worker "
                f"{worker_id} was"
            )
            raise WorkerError(
                f"{opening} loading batches of epoch {self._epoch}; {why}."
                + (f" {hint}" if hint else "")
            )
        self._restarts_left -= 1
        self._restarts += 1
        warnings.warn(
            f"stoker: worker {worker_id} (pid {pid}) died with {how}; restarting it and "
            f"loading its batches again ({self._restarts_left} restarts left).",
            RuntimeWarning,
            stacklevel=4,
        )
        # Batches still queued or being loaded by live workers are safe; the rest were lost
        # with the dead worker and go back on the queue (a duplicate reply is ignored).
        queued = pool.drain_tasks()
        busy = set()
        for i in pool.active:
            if i != worker_id:
                epoch, task, _ = pool.status.task(i)
                if task != IDLE and epoch == self._epoch:
                    busy.add(task)
        queued_ids = {m[2] for m in queued if m[0] == "B" and m[1] == self._epoch}
        lost = [i for i in self._book.pending() if i not in busy and i not in queued_ids]
        self._ready.discard(worker_id)
        pool.restart(worker_id)
        self._workers = pool.processes
        pool.send_ctrl(worker_id, self._catch_up_message())
        redo = [m for m in queued if m[0] == "B" and m[1] == self._epoch]
        for idx in lost:
            index = self._book.request(idx)
            redo.append(batch_task(self._epoch, self._epoch_seed, idx, index))
        for m in sorted(redo, key=lambda m: m[2]):
            pool.put_task(m)
