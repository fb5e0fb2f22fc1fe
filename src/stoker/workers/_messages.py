"""The records that travel between the main process and its workers, one named tuple per kind.

Tasks and control messages go to workers (:class:`BatchTask`, :class:`EpochStart`); replies
come back (:class:`SlotBatch` and :class:`ThreadBatch` carry a loaded batch, the others an
error, a skip, a stream's end, a batch given up, or a worker's state). Between processes a
record crosses as a plain tuple, its :class:`Kind` code first (:func:`to_wire`,
:func:`from_wire`), so that the pickle holds no class reference and costs what the positional
tuples did (``benchmarks/reply_wire.py``); thread workers pass the records themselves.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import Enum
from typing import Any, NamedTuple, TypeVar

__all__ = [
    "BatchError",
    "BatchSkipped",
    "BatchTask",
    "EpochStart",
    "GaveUp",
    "Kind",
    "Loaded",
    "Message",
    "Ready",
    "Reply",
    "Retired",
    "SlotBatch",
    "StartFailed",
    "StreamEnd",
    "TaskReply",
    "ThreadBatch",
    "from_wire",
    "to_wire",
]


class Kind(str, Enum):
    """The one-letter code a record crosses a pipe with."""

    BATCH = "B"  # a task: load one batch
    EPOCH = "E"  # an epoch starts
    SLOT_BATCH = "D"  # a batch loaded into a shared-memory slot (or the pipe)
    THREAD_BATCH = "T"  # a batch loaded by a thread: the object itself
    ERROR = "X"  # a batch raised
    SKIPPED = "K"  # nothing of a batch could be loaded (tolerant on_error)
    STREAM_END = "Z"  # an iterable worker's stream ended
    GAVE_UP = "Q"  # a batch given up (a later epoch, or the handover to threads)
    READY = "A"  # a worker finished its setup
    RETIRED = "R"  # a worker left on request
    START_FAILED = "F"  # a worker failed to start (its worker_init_fn raised)


_M = TypeVar("_M", bound=tuple[Any, ...])
_CODE: dict[type[Any], str] = {}
_TYPE: dict[str, type[Any]] = {}
_NEW: Any = tuple.__new__


def _kind(kind: Kind) -> Callable[[type[_M]], type[_M]]:
    def register(cls: type[_M]) -> type[_M]:
        _CODE[cls] = kind.value
        _TYPE[kind.value] = cls
        return cls

    return register


# -- main process -> worker --------------------------------------------------------------------


@_kind(Kind.BATCH)
class BatchTask(NamedTuple):
    """Load the samples at ``index`` as task ``idx`` of ``epoch``, seeded with ``seed``."""

    epoch: int
    idx: int
    seed: int
    index: Any


@_kind(Kind.EPOCH)
class EpochStart(NamedTuple):
    """Epoch ``epoch`` starts: the dataset attributes the main process changed (pickled for a
    process, objects for threads), the ``set_epoch`` value, and iterable streams' positions."""

    epoch: int
    changes: Any
    set_epoch: int | None
    worker_states: dict[int, Any] | None


# -- worker -> main process --------------------------------------------------------------------


@_kind(Kind.SLOT_BATCH)
class SlotBatch(NamedTuple):
    """A process worker's batch: the header of its encoded tensors in ``slot``.

    ``work`` is ``((worker id, seconds), ...)`` spent on it, ``spans`` the ``(running,
    blocked)`` spans its worker closed meanwhile, ``retired`` the slots its worker dropped,
    ``fallback`` how the bytes travelled (see :data:`stoker.workers._loop.NO_ROOM`),
    ``position`` an iterable dataset's state after it (for resume).
    """

    epoch: int
    idx: int
    worker_id: int
    work: tuple[tuple[int, float], ...]
    spans: tuple[tuple[float, float], ...]
    slot: str | None
    retired: list[str]
    payload: Any
    fallback: int
    failures: list[Any]
    position: Any


@_kind(Kind.THREAD_BATCH)
class ThreadBatch(NamedTuple):
    """A thread worker's batch: the collated object itself (threads share the dataset, so no
    position)."""

    epoch: int
    idx: int
    worker_id: int
    work: tuple[tuple[int, float], ...]
    spans: tuple[tuple[float, float], ...]
    batch: Any
    failures: list[Any]


@_kind(Kind.ERROR)
class BatchError(NamedTuple):
    """A batch raised: ``error`` is the packed exception (:mod:`stoker.workers._errors`)."""

    epoch: int
    idx: int
    worker_id: int
    error: Any


@_kind(Kind.SKIPPED)
class BatchSkipped(NamedTuple):
    """Every sample of a batch failed under a tolerant ``on_error``: its ``failures``."""

    epoch: int
    idx: int
    worker_id: int
    failures: list[Any]


@_kind(Kind.STREAM_END)
class StreamEnd(NamedTuple):
    """An iterable worker's stream ended at task ``idx``; ``position`` is its state there."""

    epoch: int
    idx: int
    worker_id: int
    position: Any = None


@_kind(Kind.GAVE_UP)
class GaveUp(NamedTuple):
    """A worker gave up task ``idx`` (its epoch abandoned, or the handover to threads)."""

    epoch: int
    idx: int
    worker_id: int


@_kind(Kind.READY)
class Ready(NamedTuple):
    """A worker finished its setup (``worker_init_fn``) and loads."""

    worker_id: int


@_kind(Kind.RETIRED)
class Retired(NamedTuple):
    """A worker left on request (``num_workers="auto"``)."""

    epoch: int
    worker_id: int


@_kind(Kind.START_FAILED)
class StartFailed(NamedTuple):
    """A worker could not start: ``error`` is the packed exception."""

    worker_id: int
    error: Any


Loaded = SlotBatch | ThreadBatch
#: A reply about one task of an epoch.
TaskReply = SlotBatch | ThreadBatch | BatchError | BatchSkipped | StreamEnd | GaveUp
Reply = TaskReply | Ready | Retired | StartFailed
Message = BatchTask | EpochStart | Reply


def to_wire(msg: Message) -> tuple[Any, ...]:
    """``msg`` as the plain tuple that is pickled: its kind's code, then its fields."""
    return (_CODE[type(msg)],) + msg  # noqa: RUF005 - one C-level concatenation, no unpacking


def from_wire(raw: tuple[Any, ...]) -> Message:
    """The record :func:`to_wire` made ``raw`` from.

    Raises:
        KeyError: if ``raw`` starts with no known kind.
    """
    made: Message = _NEW(_TYPE[raw[0]], raw[1:])  # tuple.__new__: no per-field call
    return made
