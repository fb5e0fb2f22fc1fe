"""The iterator behind ``stoker.DataLoader`` when ``num_workers > 0``.

One object per loader when workers persist (reset each epoch), else one per epoch. It owns the
worker pool, dispatches batches (map-style: to a shared queue any idle worker reads; iterable:
round-robin like torch, so the interleaving of worker streams is torch's), reorders replies,
rebuilds batches as zero-copy views of shared-memory slots, restarts dead workers (their
batches are dispatched again, so nothing is lost or repeated), and shuts everything down when
it is deleted, garbage-collected, or the interpreter exits.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import errno
import itertools
import multiprocessing as mp
import os
import tempfile
import time
import weakref
from typing import Any

import cloudpickle
from torch.utils.data import dataloader as _torch_dl

from stoker._introspect.platform import shm_dir, shm_free_bytes, usable_cores
from stoker.autotune._scaling import AutoScaler
from stoker.errors import ConfigError, SharedMemoryError, WorkerError
from stoker.faults import FailureTally
from stoker.loader._datapipes import next_epoch_seed, seeded_per_epoch, sharding_worker_init
from stoker.loader._dispatch import TaskBook, batch_task
from stoker.loader._recovery import RecoveryMixin
from stoker.loader._replies import ReplyMixin
from stoker.loader._stats import LoaderStats, WorkerStats
from stoker.loader._streams import StreamRouter
from stoker.loader._switch import HandoverMixin, watch_workers
from stoker.sampling._resume import EpochState, stateful, warn_fast_forward
from stoker.sampling._seeding import epoch_seed
from stoker.transport import SlotMap, reclaim_stale_pools, slot_prefix
from stoker.workers import WorkerPool
from stoker.workers._epoch_sync import AttributeTracker
from stoker.workers._loop import WorkerSpec
from stoker.workers._process import worker_pid
from stoker.workers._spawn import check_main_guard, fallback_backend
from stoker.workers._status import IDLE
from stoker.workers._threads import ThreadPool

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


class MultiWorkerIterator(ReplyMixin, RecoveryMixin, HandoverMixin, _torch_dl._BaseDataLoaderIter):
    """Iterates a loader's batches with worker processes (see the module docstring)."""

    def __init__(self, loader: Any) -> None:
        check_main_guard()  # a spawn child re-importing a script without a __main__ guard
        rng_at_start = EpochState.capture_rng(loader.generator)
        super().__init__(loader)
        self._dataset = seeded_per_epoch(self._dataset, self._shared_seed)  # datapipes: torch's
        self._pool: WorkerPool | ThreadPool | None = None
        self._book: TaskBook[tuple[tuple[Any, ...], Any]] = TaskBook(loader.in_order)
        self._in_order: bool = loader.in_order
        self._prefetch = max(1, int(loader.prefetch_factor or 2))
        self._iterable = self._dataset_kind == _torch_dl._DatasetKind.Iterable
        self._policy = loader.failure_policy
        self._tally = FailureTally(self._policy, loader.failures)
        self._ended: dict[str, LoaderStats] = loader._ended
        self._restarts_left: int = loader.max_worker_restarts
        self._restarts = 0
        self._epoch = -1
        self._generation = 0  # epochs begun (see stoker.loader._epoch_handle)
        self._let_go_tasks: list[tuple[Any, ...]] = []  # taken back by let_go()
        self._epoch_seed: int = int(self._base_seed)
        self._iter_epoch = 0  # epochs this iterator started before the current one
        self._state: EpochState | None = None
        self._sampler_done = False
        self._active = [True] * self._num_workers
        self._streams = StreamRouter(self._num_workers, self._in_order)
        self._device = loader.device
        self._device_stage: Any = None
        self._tracker = AttributeTracker(self._dataset)
        self._all_changes: dict[tuple[str, ...], Any] = {}
        self._last_set_epoch: int | None = None
        self._started = time.monotonic()
        self._worker_batches: collections.Counter[int] = collections.Counter()
        self._worker_busy: collections.Counter[int] = collections.Counter()
        self._wait_s = 0.0
        self._fallbacks = 0
        self._warned_no_room = False
        self._spilled = 0

        ctx = loader.multiprocessing_context or mp.get_context()
        directory = shm_dir()
        if not (os.path.isdir(directory) and os.access(directory, os.W_OK)):
            raise SharedMemoryError(
                errno.ENOENT,
                f"The shared-memory directory {directory!r} does not exist or is not writable: "
                "point STOKER_SHM_DIR at a writable tmpfs directory (or unset it for /dev/shm), "
                'or use `backend="thread"`, which needs no shared memory.',
            )
        reclaim_stale_pools(directory)
        if loader.shm != "require":
            reclaim_stale_pools(tempfile.gettempdir())  # spill directories (WorkerPool)
        n = self._num_workers
        budget = max(MIN_SLOT_BUDGET, int(shm_free_bytes(directory) * SHM_BUDGET_FRACTION / n))
        prefix = slot_prefix(os.getpid(), next(_POOL_IDS))
        # Intra-op threads per worker: a share of the cores, but one under fork. libgomp is
        # not fork-safe: a forked child whose parent ran an OpenMP team hangs in its first
        # parallel region with more than one thread (torch's workers run one thread too).
        forked = ctx.get_start_method() == "fork"
        threads = 1 if forked else max(1, usable_cores() // n)
        self._spec_base: dict[str, Any] = {
            "shm_dir": directory,
            "slot_prefix": prefix,
            "slot_budget": budget,
            "threads": threads,
            "iterable": self._iterable,
            "auto_collation": self._auto_collation,
            "drop_last": self._drop_last,
            "on_error": self._policy.on_error,
            "shm_require": loader.shm == "require",
        }
        init = sharding_worker_init(self._dataset, loader.worker_init_fn, self._world_size, self._rank)
        payload = self._payload = (self._dataset, self._collate_fn, init)
        # Where processes cannot start (a daemonic Pool worker), threads, with one warning.
        self._backend = fallback_backend(loader._resolved_backend, ctx.get_start_method())
        self._notes: list[str] = list(loader._backend_notes)
        self._scaler: AutoScaler | None = None
        capacity = n
        if loader._auto_workers and not self._iterable:
            self._scaler = AutoScaler.for_pool(
                self._backend, n, self._prefetch, loader._auto_prefetch
            )
            capacity = self._scaler.controller.max_workers
            if loader._probed_wait_share is not None:  # until the workers' spans tell
                self._scaler.controller.assume_blocked(loader._probed_wait_share)
            if self._watching(loader):
                # The loading waits (the probe saw it), and the pool stays at the watch's
                # size until it is decided: no slow start, that many now.
                n = now = watch_workers(n)
            else:
                now = self._scaler.slow_start(n)
            if now < n:
                self._notes.append(
                    f"slow start: {now} of {n} workers started (one batch in flight per core); "
                    "the rest start as idle cores show the loading waits"
                )
                n = now
        specs = self._specs(n)
        if self._backend == "thread":
            self._pool = ThreadPool(specs, payload, capacity=capacity)
        else:
            self._pool = WorkerPool(ctx, specs, payload, capacity=capacity)
        registry = None
        if self._device is not None or self._pin_memory:
            from stoker.device import HostRegistry

            registry = HostRegistry()
        if isinstance(self._pool, WorkerPool):
            self._slots = SlotMap(self._pool.shm_dir, registry, spill=self._pool.spill_dir)
        else:
            self._slots = SlotMap(registry=registry)
        self._workers = self._pool.processes
        self._watch_for_handover(loader)
        self._ready: set[int] = set()
        self._fast_forward: set[int] = set()
        self._jump = False
        _LIVE.add(self)
        self._reset(loader, first_iter=True, rng_at_start=rng_at_start)

    def _specs(self, n: int) -> list[WorkerSpec]:
        """One :class:`WorkerSpec` per worker of a pool of ``n``."""
        return [
            WorkerSpec(worker_id=i, num_workers=n, seed=int(self._base_seed) + i, **self._spec_base)
            for i in range(n)
        ]

    # -- epochs --------------------------------------------------------------------------

    def _reset(self, loader: Any, first_iter: bool = False, rng_at_start: Any = None) -> None:
        resume: EpochState | None = loader._resume_state
        loader._resume_state = None
        if not first_iter:
            rng_at_start = EpochState.capture_rng(loader.generator)
            super()._reset(loader)
            next_epoch_seed(self._dataset, self._shared_seed)
            self._iter_epoch += 1
        if resume is not None:
            self._base_seed, self._iter_epoch = resume.restore(
                loader.generator, self._index_sampler
            )
            self._sampler_iter = iter(self._index_sampler)
        self._epoch_seed = epoch_seed(int(self._base_seed), self._iter_epoch)
        pool = self._pool
        if pool is None or pool.closed:
            return
        self._handback = {}  # tasks of the last epoch taken back for a handover
        self._generation += 1
        self._let_go_tasks = []  # the last epoch's, taken back when the loop let go of it
        if self._book.outstanding:
            # The last epoch was abandoned (early `break`): forget what it left behind.
            if not self._iterable:
                pool.drain_tasks()
            for msg, _ in self._book.replies():
                self._discard(msg)
        self._epoch = resume.epoch if resume is not None else loader._epochs_started
        loader._epochs_started = self._epoch + 1
        pool.status.set_epoch(self._epoch)  # workers give up the last epoch's batches
        self._state = EpochState(
            epoch=self._epoch,
            rng=rng_at_start if resume is None or resume.rng is None else resume.rng,
            sampler=EpochState.capture_sampler(self._index_sampler),
            delivered=set(resume.delivered) if resume is not None else set(),
            base_seed=int(self._base_seed),
            iter_epoch=self._iter_epoch,
            workers=self._num_workers,
        )
        loader._epoch_state = self._state
        if self._device is not None:
            from stoker.device import make_stage

            self._device_stage = stage = make_stage(self._next_host, self._device)
            self._state.in_flight = lambda: stage.in_flight
        self._book = TaskBook(self._in_order)
        self._fast_forward = set()
        # An iterable dataset resumes from each worker's saved position when it can save one
        # (process workers: threads share one dataset object); else its streams replay.
        jump_states = None
        self._jump = False
        if resume is not None and resume.delivered and self._iterable:
            if not stateful(self._dataset):
                warn_fast_forward(len(resume.delivered), "it has no `state_dict`/`load_state_dict`")
            elif self._backend != "process" or resume.workers != self._num_workers:
                warn_fast_forward(
                    len(resume.delivered),
                    f"its per-worker positions were saved by {resume.workers} workers, not "
                    f"{self._num_workers} {self._backend} workers",
                )
            else:
                self._jump = True
                jump_states = dict(resume.worker_states)
                self._state.worker_states.update(jump_states)
        if self._scaler is not None:
            self._scaler.retiring = 0  # a retire request drained with the old tasks is void
            if not first_iter:
                self._scaler.new_epoch()
        self._sampler_done = False
        self._active = [True] * self._num_workers
        self._streams = StreamRouter(self._num_workers, self._in_order)
        self._wait_s = 0.0
        self._tally.new_epoch()
        changes = self._tracker.changes()
        for path, value in changes:
            self._all_changes = {
                k: v for k, v in self._all_changes.items() if k[: len(path)] != path
            }
            self._all_changes[path] = value
        if loader._epoch_request is not None:
            self._last_set_epoch = loader._epoch_request
        start = self._epoch_message(changes, loader._epoch_request, jump_states)
        loader._epoch_request = None
        for i in pool.active:
            pool.send_ctrl(i, start)
        self._fill()

    def _epoch_message(
        self,
        changes: list[tuple[tuple[str, ...], Any]],
        set_epoch: Any,
        worker_states: dict[int, Any] | None = None,
    ) -> tuple[Any, ...]:
        blob: Any = None
        if changes and self._backend != "process":
            blob = changes  # threads copy only iterable datasets, and take the objects as-is
        elif changes:
            try:
                blob = cloudpickle.dumps(changes)
            except Exception as exc:
                names = ", ".join("dataset." + ".".join(path) for path, _ in changes)
                raise ConfigError(
                    f"The dataset attributes {names} changed in the main process since the last "
                    f"epoch, but stoker cannot send them to the persistent workers: {exc}. Keep "
                    "unpicklable objects (open files, locks, sockets) out of attributes that "
                    "change between epochs, or pass `persistent_workers=False`."
                ) from exc
        return ("E", self._epoch, blob, set_epoch, worker_states)

    def _fill(self) -> None:
        """Dispatch tasks until ``prefetch_factor x num_workers`` are in flight."""
        pool = self._pool
        if pool is None or pool.closed or self._handover == "drain":
            return
        book = self._book
        delivered = self._state.delivered if self._state is not None else ()
        limit = self._prefetch * len(pool.active)
        scaler = self._scaler
        if scaler is not None and scaler.window is not None:
            if scaler.window >= limit:
                scaler.end_slow_start()  # the slow start is over
            else:
                limit = scaler.window
        while not self._sampler_done and book.outstanding < limit:
            worker = None
            if self._iterable:
                worker = self._streams.pick(self._active, book.pending(), limit)
                if worker is None:  # every stream ended, or (in_order=False) all at their share
                    self._sampler_done = not any(self._active)
                    return
            try:
                index = self._next_index()
            except StopIteration:
                self._sampler_done = True
                return
            idx = book.issue(index)
            if idx in delivered:  # resumed epoch: delivered before the checkpoint
                if not self._iterable or self._jump:
                    book.skip(idx)
                    continue
                self._fast_forward.add(idx)  # a stream must pass it: load it, then drop it
            msg = batch_task(self._epoch, self._epoch_seed, idx, index)
            if worker is None:
                pool.put_task(msg)
            else:
                self._streams.sent(idx, worker)
                pool.send_ctrl(worker, msg)

    def let_go(self, generation: int) -> None:
        """The loop dropped its handle on epoch ``generation`` (see stoker.loader._epoch_handle):
        if that epoch is still being loaded, take back the tasks no worker has started, so
        that the workers go idle instead of loading batches nobody will ask for.

        Only map-style tasks on the shared queue are taken back (an iterable dataset's tasks
        go to one worker each, and its streams must not skip), and not during a handover to
        threads (it is taking tasks back itself). The next ``iter()`` forgets them; if the
        epoch is iterated on instead (through a handle still held), they are dispatched
        again first.
        """
        pool = self._pool
        if (
            generation != self._generation
            or pool is None
            or pool.closed
            or self._iterable
            or self._handover == "drain"
            or self._book.outstanding == 0
        ):
            return
        self._let_go_tasks.extend(pool.drain_tasks())
        if self._scaler is not None:
            self._scaler.retiring = 0  # a retire request drained with the tasks is void

    def _redispatch_let_go(self) -> None:
        pool = self._pool
        tasks, self._let_go_tasks = self._let_go_tasks, []
        if pool is None or pool.closed:
            return
        for msg in sorted(tasks, key=lambda m: m[2]):  # by batch index, as first dispatched
            pool.put_task(msg)

    # -- receiving -----------------------------------------------------------------------

    def _next_data(self) -> Any:
        if self._device_stage is not None:
            return self._device_stage.next()
        return self._next_host()[1]

    def _next_host(self) -> tuple[int, Any]:
        t0 = time.perf_counter()
        book = self._book
        if self._let_go_tasks:  # the epoch goes on after all: the workers get them back
            self._redispatch_let_go()
        while True:
            if self._handover == "drain" and self._drained():
                self._hand_over()  # the processes hold no batch: threads take over
                self._fill()
            got = book.pop()
            self._count_failures(got)
            if got is not None:
                self._fill()
                self._wait_s += time.perf_counter() - t0
                if self._scaler is not None:
                    self._control()
                return got[0], self._deliver(*got)
            if book.outstanding == 0 and self._sampler_done:
                # Every worker must have reported its setup: a worker_init_fn that fails in
                # a worker nobody waited on must still surface (torch raises it too).
                self._await_ready(t0)
                self._wait_s += time.perf_counter() - t0
                if self._state is not None:
                    self._state.finished = True
                if not self._persistent_workers:
                    self._shutdown()
                self._ended["stats"] = self.stats()
                self._tally.end_epoch()
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
                    self._raise_timeout(timeout)
                wait = min(wait, left)
            msgs = pool.receive(wait)
            for msg in msgs:
                self._handle(msg)
            if msgs:
                return
            for worker_id, pid, code, leftovers in pool.dead():
                for msg in leftovers:
                    self._handle(msg)
                self._worker_died(worker_id, pid, code)

    def _await_ready(self, t0: float) -> None:
        pool = self._pool
        while pool is not None and not pool.closed:
            if all(i in self._ready for i in pool.active):
                return
            self._receive(t0)

    def _control(self) -> None:
        """One step of the ``num_workers="auto"`` controller (at most once per interval)."""
        pool, scaler = self._pool, self._scaler
        assert pool is not None and scaler is not None
        if self._handover == "drain":
            return  # the pool is about to be replaced: no workers started or retired now
        t, before = time.perf_counter(), len(pool.active)
        decision = scaler.step(
            pool,
            wait_s=self._wait_s,
            busy_s=float(sum(self._worker_busy.values())),
            delivered=self._book.delivered,
            on_added=lambda worker_id: pool.send_ctrl(worker_id, self._catch_up_message()),
        )
        changed = len(pool.active) != before or scaler.retiring > 0
        self._watch_gil(changed_since=t if changed else None)
        if decision is None:
            return
        self._notes.append(f"{time.monotonic() - self._started:.1f}s: {decision.reason}")
        self._prefetch = decision.prefetch
        self._workers = pool.processes
        self._fill()

    def _catch_up_message(self) -> tuple[Any, ...]:
        """An epoch message carrying every change since the pool started (for a new worker)."""
        changes = list(self._all_changes.items())
        return self._epoch_message(changes, self._last_set_epoch)

    # -- state, stats and shutdown -------------------------------------------------------

    def stats(self) -> LoaderStats:
        pool = self._pool
        now = time.monotonic()
        elapsed = max(1e-9, now - self._started)
        workers = []
        ids = pool.active if pool is not None else range(len(self._workers))
        for i in ids:
            p = self._workers[i]
            alive = pool is not None and not pool.closed and _alive(p)
            current: tuple[object, ...] | None = None
            since = None
            if alive and pool is not None:
                epoch, task, started = pool.status.task(i)
                if task != IDLE and epoch == self._epoch:
                    request = self._book.request(task)
                    current = tuple(request) if isinstance(request, list) else (request,)
                    since = started
            workers.append(
                WorkerStats(
                    worker_id=i,
                    pid=worker_pid(p),
                    alive=alive,
                    batches=self._worker_batches[i],
                    busy_s=self._worker_busy[i],
                    busy_fraction=min(1.0, self._worker_busy[i] / elapsed),
                    current_indices=current,
                    busy_since=since,
                )
            )
        return LoaderStats(
            backend="thread" if self._backend == "thread" else "process",
            num_workers=len(ids),
            epoch=max(0, self._epoch),
            batches=self._book.delivered,
            samples=self._tally.samples,
            wait_s=self._wait_s,
            outstanding=self._book.outstanding,
            reorder_depth=self._book.waiting,
            slots=len(self._slots),
            slots_in_use=self._slots.busy(),
            slot_bytes=self._slots.nbytes,
            fallback_batches=self._fallbacks,
            spilled_batches=self._spilled,
            failures=len(self._tally.log),
            notes=tuple(self._notes[-20:]),
            worker_restarts=self._restarts,
            workers=tuple(workers),
        )

    @property
    def shut_down(self) -> bool:
        """Its workers were stopped (after a worker's death or a failed start): it cannot
        load another batch."""
        return self._pool is not None and self._pool.closed

    def _shutdown(self) -> None:
        self._stop_gil_meter()
        pool = self._pool
        if pool is not None and not pool.closed:
            pool.shutdown()
            self._slots.clear()
        _LIVE.discard(self)

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self._shutdown()


def _alive(proc: Any) -> bool:
    try:
        return bool(proc.is_alive())
    except (ValueError, AttributeError):
        return False
