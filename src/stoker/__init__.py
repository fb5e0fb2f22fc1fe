"""stoker keeps PyTorch training fed with data.

Public API::

    from stoker import DataLoader          # drop-in for torch.utils.data.DataLoader
    stoker.watch(loader)                    # data-starvation monitor for any loader
    stoker.diagnose(loader_or_dataset)      # what slows or breaks it, and how to fix it
    stoker.compact(paths)                   # lists that forked workers do not copy
    stoker.ShardDataset("shards/")          # random access into packed tar shards
    stoker.tune(dataset, batch_size=64)     # search a fast configuration, write stoker.toml

The tools (``watch``, ``diagnose``, the shard datasets) are imported on first use, so
``import stoker`` stays as light as the loader itself.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from stoker.errors import (
    ConfigError,
    FailureLimitError,
    MainGuardError,
    SharedMemoryError,
    StokerError,
    UnpicklableError,
    WorkerError,
    WorkerTimeoutError,
)
from stoker.faults import Failure
from stoker.loader import DataLoader
from stoker.loader._stats import LoaderStats, WorkerStats
from stoker.workers._compact import compact

if TYPE_CHECKING:
    from stoker.doctor import diagnose
    from stoker.monitor import watch
    from stoker.sampling import RankSampler, World
    from stoker.shards import HDF5Dataset, LMDBDataset, ShardDataset
    from stoker.tuner import tune

__version__ = "0.1.0"

# name -> module that defines it, imported on first access.
_LAZY = {
    "HDF5Dataset": "stoker.shards",
    "LMDBDataset": "stoker.shards",
    "RankSampler": "stoker.sampling",
    "ShardDataset": "stoker.shards",
    "World": "stoker.sampling",
    "diagnose": "stoker.doctor",
    "tune": "stoker.tuner",
    "watch": "stoker.monitor",
}

__all__ = [
    "ConfigError",
    "DataLoader",
    "Failure",
    "FailureLimitError",
    "HDF5Dataset",
    "LMDBDataset",
    "LoaderStats",
    "MainGuardError",
    "RankSampler",
    "ShardDataset",
    "SharedMemoryError",
    "StokerError",
    "UnpicklableError",
    "WorkerError",
    "WorkerStats",
    "WorkerTimeoutError",
    "World",
    "__version__",
    "compact",
    "diagnose",
    "tune",
    "watch",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'stoker' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
