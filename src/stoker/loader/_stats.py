"""Snapshots of a loader's internals, read by the monitor, the tuner and the doctor.

``DataLoader.stats()`` returns a :class:`LoaderStats`; taking one costs a few microseconds
and never blocks the loader.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

__all__ = ["LoaderStats", "WorkerStats"]


@dataclass(frozen=True)
class WorkerStats:
    """One worker's view.

    Attributes:
        worker_id: 0-based worker index.
        pid: process id (``None`` for thread workers).
        alive: whether the worker is running.
        batches: batches it has delivered since it started.
        busy_s: seconds it spent fetching and collating since it started.
        busy_fraction: ``busy_s`` over the worker's wall time since it started (0..1).
        current_indices: sample indices of the batch it works on now, if known.
        busy_since: monotonic time at which it started its current batch, if known.
    """

    worker_id: int
    pid: int | None
    alive: bool
    batches: int = 0
    busy_s: float = 0.0
    busy_fraction: float = 0.0
    current_indices: tuple[object, ...] | None = None
    busy_since: float | None = None


@dataclass(frozen=True)
class LoaderStats:
    """A loader's state at one moment.

    Attributes:
        backend: ``"inline"`` (``num_workers=0``), ``"process"`` or ``"thread"``.
        num_workers: workers running now.
        epoch: epochs started so far, counting from 0 for the first.
        batches: batches delivered in the current epoch.
        samples: samples delivered in the current epoch.
        wait_s: seconds the consumer spent blocked in ``next()`` in the current epoch.
        outstanding: batches dispatched to workers and not yet delivered.
        reorder_depth: batches that arrived but wait for an earlier one (in-order delivery).
        slots: shared-memory slots mapped in the main process.
        slots_in_use: slots holding a batch that is queued or still referenced by the user.
        slot_bytes: bytes of all mapped slots.
        fallback_batches: batches that did not fit a slot and crossed by the ordinary path.
        spilled_batches: batches the shared-memory directory had no room for, carried in a
            slot under the temp directory instead.
        failures: samples or batches that failed (see ``loader.failures``).
        worker_restarts: workers respawned after dying.
        workers: one :class:`WorkerStats` per worker.
        notes: what the loader decided and why (backend choice, worker-count changes), latest
            last.
    """

    backend: Literal["inline", "process", "thread"]
    num_workers: int
    epoch: int = 0
    batches: int = 0
    samples: int = 0
    wait_s: float = 0.0
    outstanding: int = 0
    reorder_depth: int = 0
    slots: int = 0
    slots_in_use: int = 0
    slot_bytes: int = 0
    fallback_batches: int = 0
    spilled_batches: int = 0
    failures: int = 0
    worker_restarts: int = 0
    workers: tuple[WorkerStats, ...] = field(default_factory=tuple)
    notes: tuple[str, ...] = ()
