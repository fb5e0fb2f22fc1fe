"""Carrying an exception from a worker to the main process, type and traceback intact."""

from __future__ import annotations

import traceback
from typing import Any

import cloudpickle

from stoker.errors import RemoteTraceback, WorkerError

__all__ = ["pack_exception", "unpack_exception"]

_MAX_INDICES_SHOWN = 32


def pack_exception(exc: BaseException, where: str, inline: bool = False) -> tuple[Any, ...]:
    """What a worker sends for ``exc`` raised while ``where`` (e.g. "fetching samples").

    ``inline=True`` (thread workers) keeps the exception object itself instead of pickling it.
    """
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    if inline:
        return (exc, type(exc).__qualname__, str(exc), text, where)
    try:
        blob: bytes | None = cloudpickle.dumps(exc)
    except Exception:
        blob = None
    return (blob, type(exc).__qualname__, str(exc), text, where)


def unpack_exception(
    packed: tuple[Any, ...], worker_id: int, pid: int | None, indices: Any
) -> BaseException:
    """Rebuild the worker's exception, with notes naming the worker, pid and indices."""
    blob, type_name, message, text, where = packed
    exc: BaseException | None = None
    inline = isinstance(blob, BaseException)
    if inline:  # from a thread worker: the object itself, its traceback attached
        exc = blob
    elif blob is not None:
        try:
            exc = cloudpickle.loads(blob)
        except Exception:
            exc = None
    if not isinstance(exc, BaseException):
        exc = WorkerError(f"{type_name}: {message}")
    who = f"pid {pid}" if pid is not None else "a thread of the main process"
    if indices is not None:
        try:
            shown = list(indices)
        except TypeError:
            shown = [indices]
        more = len(shown) - _MAX_INDICES_SHOWN
        idx_text = str(shown[:_MAX_INDICES_SHOWN])[:-1] + (
            f", ... {more} more]" if more > 0 else "]"
        )
        note = f"Raised in stoker worker {worker_id} ({who}) while {where} {idx_text}."
    else:
        note = f"Raised in stoker worker {worker_id} ({who}) while {where}."
    if hasattr(exc, "add_note"):
        exc.add_note(note)
    else:  # Python 3.10
        exc.__notes__ = [*getattr(exc, "__notes__", []), note]  # type: ignore[attr-defined]
    if not inline:
        exc.__cause__ = RemoteTraceback(text)
    return exc
