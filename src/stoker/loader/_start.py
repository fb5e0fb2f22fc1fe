"""Starting a multi-worker iterator's pool: where its slots live, what each worker is told, how
many workers start, and the pool itself (no iteration)."""

from __future__ import annotations

import errno
import itertools
import os
import stat
import tempfile
from typing import Any, NamedTuple

from stoker._introspect.platform import shm_dir, shm_free_bytes, usable_cores
from stoker.autotune._scaling import AutoScaler
from stoker.device import HostRegistry
from stoker.errors import SharedMemoryError
from stoker.loader._settings import WorkerSettings
from stoker.loader._switch import Handover, watch_workers
from stoker.transport import SlotMap, reclaim_stale_pools, slot_prefix
from stoker.workers import WorkerPool
from stoker.workers._threads import ThreadPool

__all__ = [
    "MIN_SLOT_BUDGET",
    "SHM_BUDGET_FRACTION",
    "PoolSize",
    "shared_memory_directory",
    "size_pool",
    "slot_map",
    "spec_fields",
    "start_pool",
]

# Share of the free shared-memory space all workers' slots together may take.
SHM_BUDGET_FRACTION = 0.5
# Every worker may hold at least this many bytes of slots, whatever the free space says.
MIN_SLOT_BUDGET = 64 << 20
_POOL_IDS = itertools.count()


def shared_memory_directory(spill: bool) -> str:
    """The shared-memory directory, checked, with the pools dead processes left there (and in
    the temp directory's spill directories when ``spill``) reclaimed.

    Raises:
        SharedMemoryError: if the directory does not exist or is not writable.
    """
    directory = shm_dir()
    if not (os.path.isdir(directory) and os.access(directory, os.W_OK)):
        raise SharedMemoryError(
            errno.ENOENT,
            f"The shared-memory directory {directory!r} does not exist or is not writable: "
            "point STOKER_SHM_DIR at a writable tmpfs directory (or unset it for /dev/shm), "
            'or use `backend="thread"`, which needs no shared memory.',
        )
    mode = os.stat(directory).st_mode
    if mode & (stat.S_IWGRP | stat.S_IWOTH) and not mode & stat.S_ISVTX:
        raise SharedMemoryError(
            errno.EPERM,
            f"The shared-memory directory {directory!r} may be written by other users and is "
            f"not sticky (mode 0o{stat.S_IMODE(mode):o}): any of them could rename or remove "
            "a running loader's pool folder. Make it sticky like /dev/shm (`chmod +t "
            f"{directory}`), or point STOKER_SHM_DIR at a folder only you can write.",
        )
    reclaim_stale_pools(directory)
    if spill:
        reclaim_stale_pools(tempfile.gettempdir())  # spill directories (WorkerPool)
    return directory


def spec_fields(directory: str, workers: int, start_method: str, **settings: Any) -> dict[str, Any]:
    """The :class:`~stoker.workers._loop.WorkerSpec` fields every worker of a pool shares:
    its slot files, their budget, intra-op threads, and ``settings`` as given."""
    budget = max(MIN_SLOT_BUDGET, int(shm_free_bytes(directory) * SHM_BUDGET_FRACTION / workers))
    # Intra-op threads per worker: a share of the cores, but one under fork. libgomp is not
    # fork-safe: a forked child whose parent ran an OpenMP team hangs in its first parallel
    # region with more than one thread (torch's workers run one thread too).
    threads = 1 if start_method == "fork" else max(1, usable_cores() // workers)
    return {
        "shm_dir": directory,
        "slot_prefix": slot_prefix(os.getpid(), next(_POOL_IDS)),
        "slot_budget": budget,
        "threads": threads,
        **settings,
    }


class PoolSize(NamedTuple):
    """How a pool starts: ``workers`` now, room for ``capacity``, and the scaler that sizes it
    (``num_workers="auto"``; None: fixed)."""

    workers: int
    capacity: int
    scaler: AutoScaler | None


def size_pool(
    settings: WorkerSettings,
    backend: str,
    workers: int,
    prefetch: int,
    iterable: bool,
    notes: list[str],
) -> PoolSize:
    """The pool's start with ``settings``: ``workers`` for a fixed pool; with
    ``num_workers="auto"``, a slow start (one batch in flight per core) or, while a handover
    to threads is watched, the watch's size. A slow start is noted in ``notes``."""
    if not settings.auto_workers or iterable:
        return PoolSize(workers, workers, None)
    scaler = AutoScaler.for_pool(backend, workers, prefetch, settings.auto_prefetch)
    if settings.probed_wait_share is not None:  # until the workers' spans tell
        scaler.controller.assume_blocked(settings.probed_wait_share)
    if Handover.wanted(settings, scaler, backend):
        # The loading waits (the probe saw it), and the pool stays at the watch's size until
        # it is decided: no slow start, that many now.
        workers = now = watch_workers(workers)
    else:
        now = scaler.slow_start(workers)
    if now < workers:
        notes.append(
            f"slow start: {now} of {workers} workers started (one batch in flight per core); "
            "the rest start as idle cores show the loading waits"
        )
    return PoolSize(now, scaler.controller.max_workers, scaler)


def start_pool(
    backend: str, mp_context: Any, specs: list[Any], payload: tuple[Any, ...], capacity: int
) -> WorkerPool | ThreadPool:
    """Thread workers for ``backend="thread"``, else processes of ``mp_context``."""
    if backend == "thread":
        return ThreadPool(specs, payload, capacity=capacity)
    return WorkerPool(mp_context, specs, payload, capacity=capacity)


def slot_map(pool: WorkerPool | ThreadPool, pinned: bool) -> SlotMap:
    """The main process's view of ``pool``'s slots; ``pinned``: page-locked once each (for a
    device or ``pin_memory``)."""
    registry = HostRegistry() if pinned else None
    if isinstance(pool, WorkerPool):
        return SlotMap(pool.shm_dir, registry, spill=pool.spill_dir)
    return SlotMap(registry=registry)
