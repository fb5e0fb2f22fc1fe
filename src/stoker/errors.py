"""Exceptions raised by stoker.

Every error stoker raises on its own account derives from :class:`StokerError`::

    StokerError
    ├── ConfigError (also ValueError)   a bad argument or configuration value
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
    "FailureLimitError",
    "RemoteTraceback",
    "SharedMemoryError",
    "StokerError",
    "WorkerError",
    "WorkerTimeoutError",
]


class StokerError(Exception):
    """Base class of every error stoker raises on its own account."""


class ConfigError(StokerError, ValueError):
    """A configuration value is invalid; the message names the value and the fix."""


class WorkerError(StokerError, RuntimeError):
    """A worker died, hung or could not be started."""


class WorkerTimeoutError(WorkerError):
    """No batch arrived within the loader's ``timeout``."""


class FailureLimitError(StokerError, RuntimeError):
    """More samples failed than ``max_failures`` allows; the message lists them.

    Attributes:
        failures: every :class:`stoker.Failure` recorded so far.
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
