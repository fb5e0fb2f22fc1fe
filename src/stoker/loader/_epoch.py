"""What the multi-worker iterator knows about the epoch it loads, and what it tells the workers
when one starts (no processes, no I/O)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

import cloudpickle

from stoker.errors import ConfigError
from stoker.loader._dispatch import TaskBook
from stoker.loader._streams import StreamRouter
from stoker.sampling._resume import EpochState, stateful, warn_fast_forward
from stoker.workers._epoch_sync import AttributeTracker
from stoker.workers._messages import BatchError, BatchTask, EpochStart, SlotBatch, ThreadBatch

__all__ = ["Arrived", "DatasetChanges", "EpochContext"]


class Arrived(NamedTuple):
    """A reply waiting in the task book for its turn: what was asked, and its slot's mapping
    (mapped on arrival; None if it has no slot)."""

    reply: SlotBatch | ThreadBatch | BatchError
    request: Any
    mapping: Any


@dataclass
class EpochContext:
    """One epoch being loaded: its number and seed, its task book, and its resume state.

    Args:
        epoch: the epoch number (-1: none started yet).
        seed: the epoch's seed, from which each batch's seed derives.
        book: the epoch's dispatched tasks and the replies waiting for delivery.
        state: what ``state_dict`` saves of this epoch (None before the first).
        workers: the number of workers an iterable dataset's streams are read by.
    """

    epoch: int = -1
    seed: int = 0
    book: TaskBook[Arrived] = field(default_factory=TaskBook)
    state: EpochState | None = None
    workers: int = 0
    #: Batches delivered before the checkpoint that a stream must pass again (loaded, dropped).
    fast_forward: set[int] = field(default_factory=set)
    #: An iterable dataset resumes from each worker's saved position instead.
    jump: bool = False
    #: The sampler ran out: no more tasks this epoch.
    sampler_done: bool = False
    #: Tasks taken back when the loop let go of the epoch (see ``MultiWorkerIterator.let_go``).
    let_go: list[BatchTask] = field(default_factory=list)
    #: Seconds the consumer waited for batches.
    wait_s: float = 0.0
    #: Iterable datasets: which workers' streams have not ended, and whose turn is next.
    active: list[bool] = field(init=False)
    streams: StreamRouter = field(init=False)

    def __post_init__(self) -> None:
        self.active = [True] * self.workers
        self.streams = StreamRouter(self.workers, self.book.in_order)

    def resume_streams(
        self, resume: EpochState, dataset: Any, backend: str
    ) -> dict[int, Any] | None:
        """An iterable dataset resumes from each worker's saved position when it can save one
        (process workers: threads share one dataset object); else its streams replay (the
        batches delivered before the checkpoint are loaded and dropped). Returns the
        positions to send the workers (None: replay)."""
        if not resume.delivered:
            return None
        if not stateful(dataset):
            warn_fast_forward(len(resume.delivered), "it has no `state_dict`/`load_state_dict`")
            return None
        if backend != "process" or resume.workers != self.workers:
            warn_fast_forward(
                len(resume.delivered),
                f"its per-worker positions were saved by {resume.workers} workers, not "
                f"{self.workers} {backend} workers",
            )
            return None
        self.jump = True
        states = dict(resume.worker_states)
        if self.state is not None:
            self.state.worker_states.update(states)
        return states

    def delivered_before(self) -> set[int] | tuple[()]:
        """Batches delivered before a checkpoint this epoch resumed from (none: empty)."""
        return self.state.delivered if self.state is not None else ()


class DatasetChanges:
    """The dataset attributes the main process changed, as epoch messages for the workers.

    Args:
        dataset: the loader's dataset (tracked from now on).
    """

    def __init__(self, dataset: Any) -> None:
        self._tracker = AttributeTracker(dataset)
        self._all: dict[tuple[str, ...], Any] = {}  # every change since the pool started
        self._set_epoch: int | None = None  # the last ``set_epoch`` value

    def start(
        self,
        epoch: int,
        set_epoch: int | None,
        worker_states: dict[int, Any] | None,
        *,
        pickled: bool,
    ) -> EpochStart:
        """The message starting ``epoch``: what changed since the last one."""
        changes = self._tracker.changes()
        for path, value in changes:
            self._all = {k: v for k, v in self._all.items() if k[: len(path)] != path}
            self._all[path] = value
        if set_epoch is not None:
            self._set_epoch = set_epoch
        return _message(epoch, changes, set_epoch, worker_states, pickled)

    def catch_up(self, epoch: int, *, pickled: bool) -> EpochStart:
        """An epoch message carrying every change since the pool started (for a new worker)."""
        return _message(epoch, list(self._all.items()), self._set_epoch, None, pickled)


def _message(
    epoch: int,
    changes: list[tuple[tuple[str, ...], Any]],
    set_epoch: int | None,
    worker_states: dict[int, Any] | None,
    pickled: bool,
) -> EpochStart:
    """``changes`` pickled for process workers; threads take the objects as they are."""
    blob: Any = None
    if changes and not pickled:
        blob = changes
    elif changes:
        try:
            blob = cloudpickle.dumps(changes)
        except Exception as exc:
            names = ", ".join("dataset." + ".".join(path) for path, _ in changes)
            raise ConfigError(
                f"The dataset attributes {names} changed in the main process since the last "
                f"epoch, but stoker cannot send them to the persistent workers: {exc}. Keep "
                "unpicklable objects (open files, locks, sockets) out of attributes that "
                "change between epochs, or pass `persistent_workers=False`."
            ) from exc
    return EpochStart(epoch, blob, set_epoch, worker_states)
