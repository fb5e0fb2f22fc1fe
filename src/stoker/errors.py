"""Exceptions raised by stoker.

Every error stoker raises on its own account derives from :class:`StokerError`::

    StokerError
    ├── ConfigError (also ValueError)   a bad argument or configuration value
    │   ├── ConfigTypeError (also TypeError) an argument of the wrong type
    │   └── UnpicklableError            part of the dataset cannot be sent to spawn workers
    ├── MainGuardError (also RuntimeError) workers started while a spawn child imports the script
    ├── WorkerError (also RuntimeError) a worker died, hung or could not start
    │   └── WorkerTimeoutError          no batch within ``timeout`` seconds
    ├── FailureLimitError (also RuntimeError) more bad samples than ``max_failures`` allows
    └── SharedMemoryError (also OSError) the shared-memory directory is too small or unusable

Exceptions raised by user code inside a worker (``__getitem__``, ``collate_fn``,
``worker_init_fn``) are *not* wrapped: they are re-raised in the main process with their
original type, with notes naming the worker, its pid and the sample indices, and the worker's
traceback attached as ``__cause__``.
"""

from __future__ import annotations

__all__ = [
    "ConfigError",
    "ConfigTypeError",
    "FailureLimitError",
    "MainGuardError",
    "RemoteTraceback",
    "SharedMemoryError",
    "StokerError",
    "UnpicklableError",
    "WorkerError",
    "WorkerTimeoutError",
]


class StokerError(Exception):
    """Base class of every error stoker raises on its own account."""


class ConfigError(StokerError, ValueError):
    """A configuration value is invalid; the message names the value and the fix."""


class ConfigTypeError(ConfigError, TypeError):
    """An argument has the wrong type (``num_workers="x"``); the message names it and the fix.

    A ``TypeError`` as well, so that code catching what torch's DataLoader raises for the same
    argument (``'<' not supported between instances of 'str' and 'int'``) still catches it.
    """


class WorkerError(StokerError, RuntimeError):
    """A worker died, hung or could not be started."""


class WorkerTimeoutError(WorkerError):
    """No batch arrived within the loader's ``timeout``."""


class FailureLimitError(StokerError, RuntimeError):
    """More samples failed in one epoch than ``max_failures`` allows, or every sample of an
    epoch failed; the message lists them.

    Attributes:
        failures: the epoch's :class:`stoker.Failure` records (all epochs':
            ``loader.failures``).
    """

    def __init__(self, message: str, failures: list[object]) -> None:
        super().__init__(message)
        self.failures = failures


class SharedMemoryError(StokerError, OSError):
    """The shared-memory directory cannot hold what the loader needs."""


class RemoteTraceback(Exception):
    """Carries the formatted traceback of an exception raised in a worker.

    It is attached as ``__cause__`` of the re-raised exception so that the worker's frames
    are printed above the main process's.
    """

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text

    def __str__(self) -> str:
        return "\n\n" + self.text


class UnpicklableError(ConfigError):
    """Part of the dataset, ``collate_fn`` or ``worker_init_fn`` cannot be sent to workers.

    Raised at ``iter(loader)`` in the main process, before any spawn/forkserver worker starts.
    The original pickling error is the ``__cause__``.

    Attributes:
        path: attribute path of the part that fails, e.g. ``"dataset.transform.handle"``
            (``None`` when no single part could be blamed).
        start_method: ``"spawn"`` or ``"forkserver"``.
    """

    def __init__(self, message: str, path: str | None, start_method: str) -> None:
        super().__init__(message)
        self.path = path
        self.start_method = start_method


class MainGuardError(StokerError, RuntimeError):
    """A spawn/forkserver worker, importing the main script, was asked to start workers.

    The script starts its DataLoader workers outside ``if __name__ == "__main__":``. It is a
    ``RuntimeError`` as multiprocessing's own bootstrap error is.

    Attributes:
        script: the main script's path (``None`` if unknown).
        line: the script's line that started the workers (``None`` if unknown).
    """

    def __init__(self, message: str, script: str | None, line: int | None) -> None:
        super().__init__(message)
        self.script = script
        self.line = line
