"""Carrying an exception from a worker to the main process, type and traceback intact."""

from __future__ import annotations

import pickle
import traceback
from typing import Any

import cloudpickle

from stoker.errors import RemoteTraceback, WorkerError

__all__ = ["pack_exception", "unpack_exception"]

_MAX_INDICES_SHOWN = 32


def pack_exception(exc: BaseException, where: str, inline: bool = False) -> tuple[Any, ...]:
    """What a worker sends for ``exc`` raised while ``where`` (e.g. "fetching samples").

    ``inline=True`` (thread workers) keeps the exception object itself instead of pickling it.
    An exception that is not an ``Exception`` (``sys.exit()`` in a dataset, a
    ``KeyboardInterrupt`` raised by hand) is sent as a :class:`WorkerError` saying so:
    raised again in the main process it would end the program without a word.
    """
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    if not isinstance(exc, Exception):
        exc = _exit_error(exc)
    message = _safe_str(exc)
    if inline:
        return (exc, type(exc).__qualname__, message, text, where)
    return (_pickled(exc), type(exc).__qualname__, message, text, where)


def _pickled(exc: BaseException) -> tuple[bytes | None, bytes | None]:
    """``exc`` pickled so that the main process gets its type back: by reference (the main
    process's own class, so ``except MyError`` in the script catches it, also for a class
    defined in ``__main__`` under fork) and, for a class the main process cannot import by
    name (a spawn child's ``__mp_main__``), by value with cloudpickle.

    Pickle rebuilds an exception by calling its class with ``exc.args``, which fails for an
    ``__init__`` that takes other arguments (``MyError(path, code)`` calling
    ``super().__init__(message)``), and pickling fails on an attribute such as a lock. Such
    an exception goes as its class, args and attributes (those that pickle; the rest as their
    repr), and is rebuilt without calling ``__init__`` (see :func:`_rebuild`).
    """
    payload: Any = exc
    try:
        cloudpickle.loads(cloudpickle.dumps(exc))
    except Exception:
        state = {
            key: value if _pickles(value) else _safe_repr(value)
            for key, value in getattr(exc, "__dict__", {}).items()
        }
        args = exc.args if _pickles(exc.args) else tuple(_safe_repr(a) for a in exc.args)
        payload = (_REBUILD, type(exc), args, state)
    return _dumps(pickle.dumps, payload), _dumps(cloudpickle.dumps, payload)


_REBUILD = "stoker: rebuild exception"


def _dumps(dumps: Any, value: object) -> bytes | None:
    try:
        return bytes(dumps(value))
    except Exception:
        return None


def _pickles(value: object) -> bool:
    return _dumps(cloudpickle.dumps, value) is not None


def _unpickled(blobs: tuple[bytes | None, bytes | None]) -> BaseException | None:
    for blob in blobs:
        if blob is None:
            continue
        try:
            exc = _rebuild(pickle.loads(blob))
        except Exception:  # e.g. the class's module cannot be imported here
            continue
        if exc is not None:
            return exc
    return None


def _rebuild(loaded: Any) -> BaseException | None:
    if not (isinstance(loaded, tuple) and len(loaded) == 4 and loaded[0] == _REBUILD):
        return loaded if isinstance(loaded, BaseException) else None
    _, cls, args, state = loaded
    try:
        exc = cls.__new__(cls, *args)
        exc.args = args
        exc.__dict__.update(state)
    except Exception:
        return None
    return exc if isinstance(exc, BaseException) else None


def _exit_error(exc: BaseException) -> WorkerError:
    what = f"{type(exc).__name__}({', '.join(_safe_repr(a) for a in exc.args)})"
    name = type(exc).__name__
    how = "sys.exit() was called" if isinstance(exc, SystemExit) else f"{name} was raised"
    error = WorkerError(
        f"{how} in a worker ({what}): a worker cannot end the program, so "
        "the loop stops here instead (the traceback below shows where). To drop a bad "
        'sample, raise an ordinary exception and pass `on_error="skip"`.'
    )
    error.__cause__ = exc  # thread workers keep it; a process sends its traceback's text
    return error


def _safe_str(exc: BaseException) -> str:
    try:
        return str(exc)
    except Exception as err:  # a broken __str__ must not lose the exception
        return f"<str() of the {type(exc).__qualname__} failed: {_safe_repr(err)}>"


def _safe_repr(value: object) -> str:
    try:
        return repr(value)
    except Exception:
        return f"<{type(value).__qualname__}>"


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
        exc = _unpickled(blob)
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
