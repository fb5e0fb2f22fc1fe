"""What must hold before worker processes start, and clear errors when it does not.

Four checks, each one call from the engine:

* :func:`serialise_payload` / :func:`check_picklable` (main process, before spawn/forkserver
  workers start): the dataset, ``collate_fn`` and ``worker_init_fn`` are pickled once with
  cloudpickle; when something cannot be (an open file, a lock, a socket, an HDF5 handle), an
  :class:`UnpicklableError` names its attribute path, e.g. ``dataset.transform.steps[2].handle``,
  and the fix.
* :func:`check_main_guard` (before starting workers): inside a spawn/forkserver worker that is
  still importing the main script, starting workers means the script has no
  ``if __name__ == "__main__":`` guard; :class:`MainGuardError` names the file, the line and the
  fix, instead of multiprocessing's bootstrap ``RuntimeError``.
* :func:`explain_early_worker_death` (main process, when a worker died before it ever
  reported): the static SK001 check on the main script, as a sentence for the error.
* :func:`processes_allowed`: why this process cannot start worker processes (a daemonic
  ``multiprocessing.Pool`` worker, a platform without processes); :func:`fallback_backend` turns
  that into the thread backend with a one-time warning.
"""

from __future__ import annotations

import linecache
import multiprocessing
import os
import sys
import threading
import warnings
from types import FrameType
from typing import Any

import cloudpickle

from stoker._introspect.handles import handle_kind
from stoker._introspect.main_guard import workers_started_on_import
from stoker._introspect.pickling import cloud_dumps, describe_object, locate_unpicklable
from stoker._introspect.script import parse_script
from stoker.errors import MainGuardError, UnpicklableError

__all__ = [
    "PICKLING_START_METHODS",
    "MainGuardError",
    "UnpicklableError",
    "check_main_guard",
    "check_picklable",
    "explain_early_worker_death",
    "fallback_backend",
    "processes_allowed",
    "serialise_payload",
]

# Start methods whose workers receive the payload by pickle (fork inherits it).
PICKLING_START_METHODS = frozenset({"spawn", "forkserver"})
# Names of the payload's parts, as the engine builds it: (dataset, collate_fn, worker_init_fn).
PAYLOAD_NAMES = ("dataset", "collate_fn", "worker_init_fn")
# Platforms where Python cannot start processes at all.
_NO_PROCESS_PLATFORMS = frozenset({"emscripten", "wasi", "ios", "tvos", "watchos"})
_fallback_warned = False
_fallback_lock = threading.Lock()
_GUARD_FIX = (
    "def main():\n"
    "    ...  # build the dataset and the DataLoader, run the training loop\n"
    "\n\n"
    'if __name__ == "__main__":\n'
    "    main()"
)


# -- pickling ----------------------------------------------------------------------------


def serialise_payload(payload: tuple[Any, ...], start_method: str) -> Any:
    """What the workers receive: the payload itself under fork, else its cloudpickle bytes.

    The payload is pickled once here and the bytes reused for every worker and restart.

    Args:
        payload: ``(dataset, collate_fn, worker_init_fn)``.
        start_method: ``"fork"``, ``"spawn"`` or ``"forkserver"``.

    Returns:
        ``payload`` unchanged under fork (workers inherit it); ``cloudpickle.dumps(payload)``
        under spawn and forkserver.

    Raises:
        UnpicklableError: if cloudpickle cannot pickle the payload; the message names the
            attribute path of the culprit and how to fix it.
    """
    if start_method not in PICKLING_START_METHODS:
        return payload
    try:
        return cloudpickle.dumps(payload)
    except Exception as exc:  # TypeError, PicklingError, AttributeError, RecursionError, ...
        raise _unpicklable_error(payload, start_method, exc) from exc


def check_picklable(payload: tuple[Any, ...], start_method: str) -> None:
    """Check that spawn/forkserver workers can receive ``payload``; nothing to do under fork.

    Prefer :func:`serialise_payload` where the bytes are needed: it pickles only once.

    Args:
        payload: ``(dataset, collate_fn, worker_init_fn)``.
        start_method: ``"fork"``, ``"spawn"`` or ``"forkserver"``.

    Raises:
        UnpicklableError: as :func:`serialise_payload`.
    """
    serialise_payload(payload, start_method)


def _unpicklable_error(
    payload: tuple[Any, ...], start_method: str, error: BaseException
) -> UnpicklableError:
    names = PAYLOAD_NAMES if len(payload) == len(PAYLOAD_NAMES) else ()
    found = None
    for i, part in enumerate(payload):
        name = names[i] if names else f"payload[{i}]"
        found = locate_unpicklable(part, name, cloud_dumps, into_functions=True)
        if found is not None:
            break
    if found is None:  # each part pickles alone: blame the whole
        path, culprit, culprit_error = None, payload, error
        what = "the dataset, `collate_fn` and `worker_init_fn` together"
    else:
        path, culprit, culprit_error = found
        kind = handle_kind(culprit)
        what = f"`{path}`, {kind.description if kind else describe_object(culprit)},"
    detail = f"{type(culprit_error).__name__}: {str(culprit_error)[:200]}"
    message = (
        f"{what} cannot be sent to the DataLoader's {start_method!r} workers: cloudpickle "
        f"fails with {detail}. Workers started by {start_method} receive the dataset, "
        "`collate_fn` and `worker_init_fn` by pickle; lambdas, closures and classes defined "
        "in `__main__` or a notebook travel fine, but open files, locks, sockets, database and "
        "HDF5/LMDB handles cannot. Fix: keep only what opens it (a path) in `__init__` and open "
        "it lazily in the worker, on first use in `__getitem__` (store it on `self`), or in "
        "`worker_init_fn`; "
        "`stoker doctor` on the loader reports every such attribute."
    )
    return UnpicklableError(message, path, start_method)


# -- missing __main__ guard --------------------------------------------------------------


def _bootstrapping() -> bool:
    """True while this process is a spawn/forkserver child still importing the main module."""
    return bool(getattr(multiprocessing.current_process(), "_inheriting", False))


def _bootstrap_method(frame: FrameType | None) -> str:
    while frame is not None:
        name = os.path.basename(frame.f_code.co_filename)
        if name == "forkserver.py":
            return "forkserver"
        frame = frame.f_back
    return "spawn"


def _main_script_site(frame: FrameType | None) -> tuple[str | None, int | None]:
    """``(file, line)`` of the main script's top-level statement running now, if any."""
    site: tuple[str | None, int | None] = (None, None)
    while frame is not None:
        if frame.f_globals.get("__name__") == "__mp_main__":
            site = (frame.f_code.co_filename, frame.f_lineno)  # keep the outermost
        frame = frame.f_back
    if site[0] is None:
        module = sys.modules.get("__mp_main__")
        site = (getattr(module, "__file__", None), None)
    return site


def check_main_guard() -> None:
    """Refuse to start workers while a spawn/forkserver worker is importing the main script.

    Under spawn and forkserver every worker imports the main script again (as
    ``__mp_main__``); a script that builds and iterates its loader outside
    ``if __name__ == "__main__":`` would make each worker start workers of its own.
    Call it before starting worker processes; it costs an attribute lookup.

    Raises:
        MainGuardError: inside such a worker; the message names the script, the line and the
            fix.
    """
    if not _bootstrapping():
        return
    frame = sys._getframe(1)
    method = _bootstrap_method(frame)
    script, line = _main_script_site(frame)
    where = script or "the main script"
    if line is not None:
        source = linecache.getline(script or "", line).strip()
        where = f"{script}, line {line}" + (f" (`{source}`)" if source else "")
    message = (
        f"This {method} worker process was importing the main script {where} and that line "
        "started DataLoader workers: the script builds and iterates its DataLoader at import "
        'time, outside `if __name__ == "__main__":`. Workers started by spawn or forkserver '
        "import the main script again, so everything outside the guard runs in every worker "
        "(spawn is the default on macOS and Windows, and forkserver on Linux from Python "
        "3.14). Fix: put the entry point under the guard:\n\n" + _GUARD_FIX
    )
    raise MainGuardError(message, script, line)


def explain_early_worker_death(start_method: str) -> str | None:
    """Why a spawn/forkserver worker may have died before it ever reported, if the script says.

    Looks for workers started outside the ``__main__`` guard in the main script (what
    ``stoker doctor`` reports as SK001). Never raises.

    Args:
        start_method: the pool's start method.

    Returns:
        A sentence to append to the worker-death error, or ``None`` (fork, no main script,
        or nothing found).
    """
    if start_method not in PICKLING_START_METHODS:
        return None
    script = getattr(sys.modules.get("__main__"), "__file__", None)
    if not isinstance(script, str) or not os.path.isfile(script):
        return None
    try:
        parsed = parse_script(script)
        first = next(workers_started_on_import(parsed), None)
    except Exception:  # unreadable, not Python, or a script the model trips on
        return None
    if first is None:
        return None
    where = parsed.where(first[0])
    source = linecache.getline(script, first[0].lineno).strip()
    return (
        "The main script starts DataLoader workers on import ("
        + (f"{where}: `{source}`" if source else where)
        + "), outside "
        f'`if __name__ == "__main__":`; every {start_method} worker imports the main '
        "script again and dies there. Put the entry point under the guard "
        f"(`stoker doctor {script}` shows the fix)."
    )


# -- where processes cannot be started ---------------------------------------------------


def processes_allowed(start_method: str | None = None) -> str | None:
    """Why worker processes cannot be started here, or ``None`` if they can.

    Args:
        start_method: the start method the loader would use (``None``: the default one).
            Spawn and forkserver also need Python's own executable.

    Returns:
        A reason, phrased to follow "cannot start worker processes: ", e.g. "this process is
        a daemonic multiprocessing worker ... and daemonic processes are not allowed to have
        children"; ``None`` when processes can be started.
    """
    if sys.platform in _NO_PROCESS_PLATFORMS:
        return f"Python on this platform ({sys.platform}) cannot start processes"
    current = multiprocessing.current_process()
    if current.daemon:
        return (
            f"this process ({current.name!r}, pid {os.getpid()}) is a daemonic "
            "multiprocessing process, e.g. a `multiprocessing.Pool` worker or a "
            "`Process(daemon=True)`, and daemonic processes are not allowed to have children"
        )
    # the first of the platform's methods is its default (this does not fix the default)
    method = (
        start_method
        or multiprocessing.get_start_method(allow_none=True)
        or multiprocessing.get_all_start_methods()[0]
    )
    if method in PICKLING_START_METHODS:
        from multiprocessing import spawn

        exe = spawn.get_executable()
        if not exe or not os.path.exists(os.fsdecode(exe)):
            return (
                f"{method} needs Python's executable to start workers, and "
                f"`sys.executable` is {sys.executable!r} here (an embedded interpreter?)"
            )
    return None


def fallback_backend(backend: str, start_method: str | None = None) -> str:
    """The backend to run: ``backend``, or ``"thread"`` where processes cannot be started.

    The first fallback in a process warns (``RuntimeWarning``) naming why; later ones are
    silent.

    Args:
        backend: the loader's ``backend`` (only ``"process"`` can fall back).
        start_method: the loader's start method (``None``: the default one).

    Returns:
        ``backend``, or ``"thread"`` when :func:`processes_allowed` gives a reason.
    """
    global _fallback_warned
    if backend != "process":
        return backend
    why = processes_allowed(start_method)
    if why is None:
        return backend
    with _fallback_lock:
        first, _fallback_warned = not _fallback_warned, True
    if first:
        warnings.warn(
            f"stoker: cannot start DataLoader worker processes here: {why}. Loading with "
            'threads instead (`backend="thread"`); pass `num_workers=0` or '
            '`backend="thread"` to silence this warning.',
            RuntimeWarning,
            stacklevel=3,
        )
    return "thread"
