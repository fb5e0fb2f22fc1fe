"""The iterator behind ``stoker.DataLoader`` when ``num_workers > 0``.

One object per loader when workers persist (reset each epoch), else one per epoch. It owns the
worker pool, dispatches batches (map-style: to a shared queue any idle worker reads; iterable:
round-robin like torch, so the interleaving of worker streams is torch's), reorders replies,
rebuilds batches as zero-copy views of shared-memory slots, and shuts everything down when it
is deleted, garbage-collected, or the interpreter exits.
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import multiprocessing as mp
import os
import pickle
import time
import weakref
from typing import Any

import cloudpickle
import torch
from torch.utils.data import dataloader as _torch_dl
from torch.utils.data._utils.pin_memory import pin_memory as _pin_memory

from stoker._dispatch import TaskBook
from stoker._epoch_sync import AttributeTracker
from stoker._platform import shm_free_bytes, usable_cores
from stoker._seeding import batch_seed
from stoker._stats import LoaderStats, WorkerStats
from stoker.errors import ConfigError, WorkerError, WorkerTimeoutError
from stoker.transport import SlotMap, decode, reclaim_stale_segments, slot_prefix
from stoker.workers import WorkerPool
from stoker.workers._errors import unpack_exception
from stoker.workers._loop import WorkerSpec
from stoker.workers._process import describe_exit

__all__ = ["MultiWorkerIterator"]

# Longest single wait for worker replies; between waits dead workers and timeouts are checked.
WAIT_SLICE_S = 0.5
# Share of the free shared-memory space all workers' slots together may take.
SHM_BUDGET_FRACTION = 0.5
# Every worker may hold at least this many bytes of slots, whatever the free space says.
MIN_SLOT_BUDGET = 64 << 20
_PROTOCOL = 5
_POOL_IDS = itertools.count()
_LIVE: weakref.WeakSet[MultiWorkerIterator] = weakref.WeakSet()


@atexit.register
def _shutdown_all() -> None:  # pragma: no cover - exercised by a subprocess test
    for it in list(_LIVE):
        with contextlib.suppress(Exception):
            it._shutdown()


class MultiWorkerIterator(_torch_dl._BaseDataLoaderIter):
    """Iterates a loader's batches with worker processes (see the module docstring)."""

    def __init__(self, loader: Any) -> None:
        super().__init__(loader)
        self._pool: WorkerPool | None = None
        self._book: TaskBook[tuple[tuple[Any, ...], Any]] = TaskBook(loader.in_order)
        self._in_order: bool = loader.in_order
        self._prefetch = max(1, int(loader.prefetch_factor or 2))
        self._iterable = self._dataset_kind == _torch_dl._DatasetKind.Iterable
        self._epoch = -1
        self._epoch_seed: int = int(self._base_seed)
        self._sampler_done = False
        self._active = [True] * self._num_workers
        self._rr = itertools.cycle(range(self._num_workers))
        self._slots = SlotMap()
        self._tracker = AttributeTracker(self._dataset)
        self._started = time.monotonic()
        self._worker_batches = [0] * self._num_workers
        self._worker_busy = [0.0] * self._num_workers
        self._wait_s = 0.0
        self._samples = 0
        self._fallbacks = 0

        ctx = loader.multiprocessing_context or mp.get_context()
        reclaim_stale_segments()
        n = self._num_workers
        budget = max(MIN_SLOT_BUDGET, int(shm_free_bytes() * SHM_BUDGET_FRACTION / n))
        prefix = slot_prefix(os.getpid(), next(_POOL_IDS))
        threads = max(1, usable_cores() // n)
        specs = [
            WorkerSpec(
                worker_id=i,
                num_workers=n,
                seed=int(self._base_seed) + i,
                slot_prefix=prefix,
                slot_budget=budget,
                threads=threads,
                iterable=self._iterable,
                auto_collation=self._auto_collation,
                drop_last=self._drop_last,
            )
            for i in range(n)
        ]
        self._pool = WorkerPool(
            ctx, specs, (self._dataset, self._collate_fn, loader.worker_init_fn)
        )
        self._workers = self._pool.processes
        _LIVE.add(self)
        self._reset(loader, first_iter=True)

    # -- epochs --------------------------------------------------------------------------

    def _reset(self, loader: Any, first_iter: bool = False) -> None:
        if not first_iter:
            super()._reset(loader)
            self._epoch_seed = int(
                torch.empty((), dtype=torch.int64).random_(generator=loader.generator).item()
            )
        pool = self._pool
        if pool is None or pool.closed:
            return
        if self._book.outstanding:
            # The last epoch was abandoned (early `break`): forget what it left behind.
            if not self._iterable:
                pool.drain_tasks()
            for msg, _ in self._book.replies():
                self._discard(msg)
        self._epoch += 1
        self._book = TaskBook(self._in_order)
        self._sampler_done = False
        self._active = [True] * self._num_workers
        self._rr = itertools.cycle(range(self._num_workers))
        self._wait_s = 0.0
        self._samples = 0
        set_epoch = loader._epoch_request
        loader._epoch_request = None
        start = pickle.dumps(
            ("E", self._epoch, self._pickled_changes(), set_epoch), protocol=_PROTOCOL
        )
        for i in range(self._num_workers):
            pool.send_ctrl(i, start)
        self._fill()

    def _pickled_changes(self) -> bytes | None:
        changes = self._tracker.changes()
        if not changes:
            return None
        try:
            return cloudpickle.dumps(changes)
        except Exception as exc:
            names = ", ".join("dataset." + ".".join(path) for path, _ in changes)
            raise ConfigError(
                f"The dataset attributes {names} changed in the main process since the last "
                f"epoch, but stoker cannot send them to the persistent workers: {exc}. Keep "
                "unpicklable objects (open files, locks, sockets) out of attributes that change "
                "between epochs, or pass `persistent_workers=False`."
            ) from exc

    def _fill(self) -> None:
        """Dispatch tasks until ``prefetch_factor x num_workers`` are in flight."""
        pool = self._pool
        if pool is None or pool.closed:
            return
        book = self._book
        limit = self._prefetch * self._num_workers
        while not self._sampler_done and book.outstanding < limit:
            worker = None
            if self._iterable:
                for _ in range(self._num_workers):
                    w = next(self._rr)
                    if self._active[w]:
                        worker = w
                        break
                else:
                    self._sampler_done = True
                    return
            try:
                index = self._next_index()
            except StopIteration:
                self._sampler_done = True
                return
            idx = book.issue(index)
            msg = pickle.dumps(
                ("B", self._epoch, idx, batch_seed(self._epoch_seed, idx), index),
                protocol=_PROTOCOL,
            )
            if worker is None:
                pool.put_task(msg)
            else:
                pool.send_ctrl(worker, msg)

    # -- receiving -----------------------------------------------------------------------

    def _next_data(self) -> Any:
        t0 = time.perf_counter()
        book = self._book
        while True:
            got = book.pop()
            if got is not None:
                self._fill()
                self._wait_s += time.perf_counter() - t0
                return self._deliver(*got)
            if book.outstanding == 0 and self._sampler_done:
                self._wait_s += time.perf_counter() - t0
                if not self._persistent_workers:
                    self._shutdown()
                raise StopIteration
            self._receive(t0)

    def _receive(self, t0: float) -> None:
        """Block until at least one worker reply has been handled."""
        pool = self._pool
        if pool is None or pool.closed:
            raise WorkerError("the DataLoader's workers were shut down while batches were due")
        timeout = self._timeout
        while True:
            wait = WAIT_SLICE_S
            if timeout > 0:
                left = t0 + timeout - time.perf_counter()
                if left <= 0:
                    raise WorkerTimeoutError(
                        f"DataLoader timed out after {timeout} seconds waiting for a batch "
                        f"from {self._num_workers} workers: raise `timeout` or make samples "
                        "cheaper to load."
                    )
                wait = min(wait, left)
            ready = pool.wait(wait)
            handled = False
            for conn in ready:
                if conn in pool.results:
                    try:
                        raw = conn.recv_bytes()
                    except (EOFError, OSError):
                        continue
                    self._handle(raw)
                    handled = True
            if handled:
                return
            if ready:
                self._check_workers()

    def _check_workers(self) -> None:
        pool = self._pool
        assert pool is not None
        for i, proc in enumerate(pool.processes):
            if proc.exitcode is not None and not pool.results[i].poll():
                pid, code = proc.pid, proc.exitcode
                self._shutdown()
                raise WorkerError(
                    f"DataLoader worker (pid {pid}) exited unexpectedly with "
                    f"{describe_exit(code)}. Worker {i} was loading a batch of epoch "
                    f"{self._epoch}."
                )

    def _handle(self, raw: bytes) -> None:
        msg = pickle.loads(raw)
        kind = msg[0]
        if kind == "F":
            worker_id, packed = msg[1], msg[2]
            pid = self._workers[worker_id].pid
            self._shutdown()
            raise unpack_exception(packed, worker_id, pid, None)
        epoch, idx = msg[1], msg[2]
        if kind == "D":
            self._slots.forget(msg[6])
            self._worker_batches[msg[3]] += 1
            self._worker_busy[msg[3]] += msg[4]
        if epoch != self._epoch:
            self._discard(msg)  # a batch of an abandoned epoch
            return
        if kind == "Z":
            self._active[msg[3]] = False
            self._book.skip(idx)
            self._fill()
        else:
            self._book.complete(idx, (msg, self._book.request(idx)))

    def _discard(self, msg: tuple[Any, ...]) -> None:
        if msg[0] == "D" and msg[5] is not None:
            with contextlib.suppress(OSError):
                self._slots.release(msg[5])

    def _deliver(self, idx: int, reply: tuple[tuple[Any, ...], Any]) -> Any:
        msg, index = reply
        if msg[0] == "X":
            worker_id = msg[3]
            raise unpack_exception(msg[4], worker_id, self._workers[worker_id].pid, index)
        slot, payload, fallback = msg[5], msg[7], msg[8]
        self._fallbacks += fallback
        self._samples += len(index) if self._auto_collation and index is not None else 1
        batch = decode(payload, slot, self._slots)
        if self._pin_memory:
            batch = _pin_memory(batch, self._pin_memory_device)
        return batch

    # -- stats and shutdown --------------------------------------------------------------

    def stats(self) -> LoaderStats:
        pool = self._pool
        now = time.monotonic()
        elapsed = max(1e-9, now - self._started)
        workers = tuple(
            WorkerStats(
                worker_id=i,
                pid=p.pid,
                alive=pool is not None and not pool.closed and p.exitcode is None,
                batches=self._worker_batches[i],
                busy_s=self._worker_busy[i],
                busy_fraction=min(1.0, self._worker_busy[i] / elapsed),
            )
            for i, p in enumerate(self._workers)
        )
        return LoaderStats(
            backend="process",
            num_workers=self._num_workers,
            epoch=max(0, self._epoch),
            batches=self._book.delivered,
            samples=self._samples,
            wait_s=self._wait_s,
            outstanding=self._book.outstanding,
            reorder_depth=self._book.waiting,
            slots=len(self._slots),
            slots_in_use=self._slots.busy(),
            slot_bytes=self._slots.nbytes,
            fallback_batches=self._fallbacks,
            workers=workers,
        )

    def _shutdown(self) -> None:
        pool = self._pool
        if pool is not None and not pool.closed:
            pool.shutdown()
            self._slots.clear()
        _LIVE.discard(self)

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self._shutdown()
