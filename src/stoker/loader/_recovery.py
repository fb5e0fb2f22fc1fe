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
from collections.abc import Iterable
from typing import Any

from stoker._introspect.platform import shm_dir, shm_free_bytes
from stoker.errors import WorkerError, WorkerTimeoutError
from stoker.loader._dispatch import TaskBook, batch_task
from stoker.workers._backend import WorkerBackend
from stoker.workers._messages import EpochStart
from stoker.workers._process import describe_exit, torch_killed_sentence, worker_pid
from stoker.workers._spawn import explain_early_worker_death
from stoker.workers._status import IDLE

__all__ = ["Supervisor", "head_timeout_error"]


def _short(indices: Any, limit: int = 16) -> str:
    try:
        items = list(indices)
    except TypeError:
        return repr(indices)
    text = ", ".join(map(repr, items[:limit]))
    return f"[{text}{', ...' if len(items) > limit else ''}]"


def head_timeout_error(index: Any, timeout: float, pid: int) -> WorkerTimeoutError:
    """The error for a consumer that waited ``timeout`` seconds for the epoch's first batch
    from the head start's child (``pid``, see :mod:`stoker.loader._head`)."""
    return WorkerTimeoutError(
        f"DataLoader timed out after {timeout} seconds waiting for a batch. The epoch's first "
        f"batch (sample indices {_short(index)}) was loading in the child forked beside the "
        f"backend probe (pid {pid}), stopped now. Raise `timeout`, or find what blocks in "
        "`__getitem__`."
    )


class Supervisor:
    """Hang reports, deaths and restarts of one iterator's workers (see the module docstring).

    Args:
        restarts_left: how many dead workers may still be replaced (``max_worker_restarts``).
        iterable: the dataset is iterable: its streams cannot resume in a new worker.
    """

    def __init__(self, restarts_left: int, iterable: bool) -> None:
        self.restarts_left = restarts_left
        self.restarts = 0
        self._iterable = iterable

    @staticmethod
    def waited_on(
        pool: WorkerBackend, pending: Iterable[int], epoch: int
    ) -> tuple[int | None, int | None, float | None]:
        """``(worker id, task index, started)`` of the batch the consumer waits for: the
        earliest ``pending`` task, and the worker loading it (None if none is)."""
        waiting = sorted(pending)
        best: tuple[int | None, int | None, float | None] = (
            None,
            waiting[0] if waiting else None,
            None,
        )
        for i in pool.active:
            task_epoch, task, started = pool.status.task(i)
            if task != IDLE and task_epoch == epoch and task in waiting:
                if best[0] is None or task < (best[1] if best[1] is not None else task + 1):
                    best = (i, task, started)
        return best

    def timeout_error(
        self, pool: WorkerBackend, book: TaskBook[Any], epoch: int, timeout: float
    ) -> WorkerTimeoutError:
        """The error for a consumer that waited ``timeout`` seconds: the worker loading the
        awaited batch, its sample indices, and the worker's Python stacks."""
        worker, task, started = self.waited_on(pool, book.pending(), epoch)
        indices = book.request(task) if task is not None else None
        lines = [f"DataLoader timed out after {timeout} seconds waiting for a batch."]
        if worker is not None:
            busy = time.monotonic() - started if started else 0.0
            who = (
                f"pid {worker_pid(pool.processes[worker])}" if pool.kind == "process" else "thread"
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
        return WorkerTimeoutError("\n".join(lines))

    def death_error(
        self,
        pool: WorkerBackend,
        death: tuple[int, int | None, int | None],
        epoch: int,
        loaded_any: bool,
    ) -> WorkerError | None:
        """The error a worker's death raises, or None if it is to be restarted.

        Args:
            pool: the pool it died in.
            death: ``(worker id, pid, exit code)``.
            epoch: the epoch being loaded.
            loaded_any: the worker had delivered a batch (else a process that never reported
                gets the reasons a spawned child may die at once).
        """
        worker_id, pid, code = death
        if self.restarts_left > 0 and not self._iterable:
            return None
        why = (
            "an iterable dataset's stream cannot be resumed in a new worker"
            if self._iterable and self.restarts_left > 0
            else "raise `max_worker_restarts` to respawn dead workers"
        )
        hint = None
        if pool.kind == "process" and not loaded_any:
            hint = explain_early_worker_death(getattr(pool, "start_method", "fork"))
        how = _how(code)
        killed = torch_killed_sentence(pid, code)
        opening = (
            f"{killed} Worker {worker_id} died of {how} while"
            if killed
            else f"DataLoader worker (pid {pid}) exited unexpectedly with {how}. Worker "
            f"{worker_id} was"
        )
        return WorkerError(
            f"{opening} loading batches of epoch {epoch}; {why}." + (f" {hint}" if hint else "")
        )

    def restart(
        self,
        pool: WorkerBackend,
        book: TaskBook[Any],
        death: tuple[int, int | None, int | None],
        epoch_seed: tuple[int, int],
        catch_up: EpochStart,
    ) -> None:
        """Replace a dead worker, and dispatch again the batches lost with it.

        Batches still queued or being loaded by live workers are safe; the rest go back on the
        queue (a duplicate reply is ignored).

        Args:
            pool: the pool it died in.
            book: the epoch's task book.
            death: ``(worker id, pid, exit code)``.
            epoch_seed: ``(epoch, epoch seed)`` of the epoch being loaded.
            catch_up: the epoch message the new worker gets first.
        """
        worker_id, pid, code = death
        epoch, seed = epoch_seed
        self.restarts_left -= 1
        self.restarts += 1
        warnings.warn(
            f"stoker: worker {worker_id} (pid {pid}) died with {_how(code)}; restarting it and "
            f"loading its batches again ({self.restarts_left} restarts left).",
            RuntimeWarning,
            stacklevel=5,
        )
        queued = pool.drain_tasks()
        busy = set()
        for i in pool.active:
            if i != worker_id:
                task_epoch, task, _ = pool.status.task(i)
                if task != IDLE and task_epoch == epoch:
                    busy.add(task)
        redo = [m for m in queued if m.epoch == epoch]
        queued_ids = {m.idx for m in redo}
        lost = [i for i in book.pending() if i not in busy and i not in queued_ids]
        pool.restart(worker_id)
        pool.send_ctrl(worker_id, catch_up)
        for idx in lost:
            redo.append(batch_task(epoch, seed, idx, book.request(idx)))
        for m in sorted(redo, key=lambda m: m.idx):
            pool.put_task(m)


def _how(code: int | None) -> str:
    how = describe_exit(code)
    if code == -signal.SIGBUS:
        how += f"; {shm_dir()} has {shm_free_bytes()} bytes free now"
    return how
