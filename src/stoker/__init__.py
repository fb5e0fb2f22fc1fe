"""stoker keeps PyTorch training fed with data.

Public API::

    from stoker import DataLoader      # drop-in for torch.utils.data.DataLoader
"""

from __future__ import annotations

from stoker._stats import LoaderStats, WorkerStats
from stoker.errors import (
    ConfigError,
    SharedMemoryError,
    StokerError,
    WorkerError,
    WorkerTimeoutError,
)
from stoker.loader import DataLoader

__version__ = "0.1.0"

__all__ = [
    "ConfigError",
    "DataLoader",
    "LoaderStats",
    "SharedMemoryError",
    "StokerError",
    "WorkerError",
    "WorkerStats",
    "WorkerTimeoutError",
    "__version__",
]
