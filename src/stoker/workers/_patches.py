"""Process-wide patches thread workers need, held only while a thread pool lives.

Thread workers share the training process, so two of torch's globals must answer per thread:
``get_worker_info()`` (a dataset asks which worker it runs in) and ``default_collate``'s tensor
entry (torch's stacks into a new shared-memory segment whenever ``get_worker_info()`` names a
worker; a thread's batch never leaves the process). Both are installed when the first thread
pool starts and restored when the last one shuts down, so nothing outlives the loaders.
"""

from __future__ import annotations

import threading
from typing import Any

import torch
from torch.utils.data._utils import collate as _torch_collate
from torch.utils.data._utils import worker as _torch_worker

from stoker.workers import _collate

__all__ = ["acquire", "local_info", "release"]

local_info = threading.local()  # .info: the WorkerInfo of the calling worker thread, if any
_lock = threading.Lock()
_holders = 0
_saved_code: Any = None
_saved_collate: Any = None


def _thread_aware_get_worker_info() -> Any:  # pragma: no cover - body runs as torch's
    info = getattr(_stoker_thread_info, "info", None)  # type: ignore[name-defined]  # noqa: F821
    return info if info is not None else _worker_info  # type: ignore[name-defined]  # noqa: F821


def acquire() -> None:
    """A thread pool starts: make torch's ``get_worker_info`` answer per thread and route
    tensor collation around shared memory (first holder only).

    The function's code object is swapped, not the module attribute, because user code holds
    references to it (``from torch.utils.data import get_worker_info``); its globals stay
    torch's module, where the thread-local is published.
    """
    global _holders, _saved_code, _saved_collate
    with _lock:
        _holders += 1
        if _holders > 1:
            return
        func = _torch_worker.get_worker_info
        _saved_code = func.__code__
        _torch_worker._stoker_thread_info = local_info  # type: ignore[attr-defined]
        func.__code__ = _thread_aware_get_worker_info.__code__
        _saved_collate = _torch_collate.default_collate_fn_map.get(torch.Tensor)
        _collate.install(None)


def release() -> None:
    """A thread pool shut down: the last holder restores what :func:`acquire` changed (a
    collate entry the user replaced meanwhile is left as the user set it)."""
    global _holders, _saved_code, _saved_collate
    with _lock:
        if _holders == 0:
            return
        _holders -= 1
        if _holders:
            return
        _torch_worker.get_worker_info.__code__ = _saved_code
        with_attr = _torch_worker.__dict__
        with_attr.pop("_stoker_thread_info", None)
        table = _torch_collate.default_collate_fn_map
        if table.get(torch.Tensor) is _collate.collate_tensor_into_slot:
            table[torch.Tensor] = _saved_collate
        _saved_code = _saved_collate = None


def holders() -> int:
    """Thread pools holding the patches now (tests)."""
    return _holders
