"""Capping a worker's intra-op thread pools (torch's, OpenMP's, BLAS's, OpenCV's).

Every worker process runs its samples' ops on a few threads at most: ``workers x threads``
stays within the cores. threadpoolctl reaches the native pools torch's own setting does not
(numpy's OpenBLAS, a second OpenMP runtime), but finding them means walking every shared
library the process has loaded: 15-29 ms of a forked worker's start on the 2-core VM, before
its first batch, and again in each worker. The main process walks them once, just before it
forks a pool (:func:`inspect_pools`, 7-10 ms; again only after an import), and a forked
worker only sets the limits on what it inherited (1-6 ms).
"""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Any

import torch

__all__ = ["cap_threads", "inspect_pools"]

_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")

# The main process's threadpoolctl controller, made by inspect_pools() before a fork (None:
# threadpoolctl is absent or could not inspect this process; a worker then inspects its own),
# and how many modules were imported when it was made: a native pool comes with an import.
_pools: Any = None
_modules_seen = -1


def inspect_pools() -> None:
    """Find this process's native thread pools, for the workers about to be forked from it
    (threadpoolctl, where installed); again only once a module was imported since."""
    global _pools, _modules_seen
    if len(sys.modules) == _modules_seen:
        return
    try:
        from threadpoolctl import ThreadpoolController

        _pools = ThreadpoolController()
    except Exception:  # optional dependency; absent or a library it cannot inspect
        _pools = None
    _modules_seen = len(sys.modules)


def cap_threads(n: int) -> None:
    """Give this (worker) process's thread pools ``n`` threads each."""
    torch.set_num_threads(n)
    for var in _ENV:
        os.environ.setdefault(var, str(n))
    try:
        if _pools is not None:
            _pools.limit(limits=n)
        else:
            from threadpoolctl import threadpool_limits

            threadpool_limits(n)
    except Exception:  # optional dependency; absent or a library it cannot drive
        pass
    cv2 = sys.modules.get("cv2")
    if cv2 is not None:
        with contextlib.suppress(Exception):
            cv2.setNumThreads(n)
