"""The iterator behind ``stoker.DataLoader`` when ``num_workers > 0``.

One object per loader when workers persist (reset each epoch), else one per epoch. It owns the
worker pool (a :class:`~stoker.workers._backend.WorkerBackend`: processes or threads, started
by :mod:`stoker.loader._start`), dispatches batches (map-style: to a shared queue any idle
worker reads; iterable: to each worker's stream in turn, as torch does), and shuts everything
down when it is deleted, garbage-collected, or the interpreter exits. Its parts:

* :class:`~stoker.loader._epoch.EpochContext`: the epoch being loaded (number, seed, task
  book, resume state), replaced at each epoch;
* :class:`~stoker.loader._replies.ReplyHandler`: books worker replies and turns them into
  batches (zero-copy views of shared-memory slots), in order;
* :class:`~stoker.loader._recovery.Supervisor`: hang reports, deaths and restarts (a dead
  worker's batches are dispatched again, so nothing is lost or repeated);
* :class:`~stoker.loader._switch.Handover`: the process-to-thread handover, which returns the
  new pool.
"""

# Over 400 lines: the loop itself (dispatch, receive, deliver, epochs); its parts are elsewhere.
from __future__ import annotations

import atexit
import contextlib
import multiprocessing as mp
import time
import weakref
from typing import TYPE_CHECKING, Any

from torch.utils.data import dataloader as _torch_dl
from torch.utils.data._utils.pin_memory import pin_memory as _pin_memory

from stoker.device import DeviceStage, make_stage
from stoker.errors import WorkerError
from stoker.faults import FailureTally
from stoker.loader._base import StokerIterBase
from stoker.loader._datapipes import next_epoch_seed, seeded_per_epoch, sharding_worker_init
from stoker.loader._dispatch import TaskBook, batch_task
from stoker.loader._epoch import Arrived, DatasetChanges, EpochContext
from stoker.loader._head import HeadStart
from stoker.loader._main_first import MainFirst
from stoker.loader._recovery import Supervisor, head_timeout_error
from stoker.loader._stats import LoaderStats
from stoker.sampling._resume import EpochState
from stoker.sampling._seeding import epoch_seed
from stoker.workers import WorkerPool
from stoker.workers._errors import unpack_exception
from stoker.workers._loop import WorkerSpec
from stoker.workers._messages import (
    BatchTask,
    EpochStart,
    Ready,
    Reply,
    Retired,
    StartFailed,
    ThreadBatch,
)
from stoker.workers._process import worker_pid
from stoker.workers._spawn import check_main_guard, fallback_backend
from stoker.workers._threads import ThreadPool

if TYPE_CHECKING:
    from stoker.autotune._scaling import AutoScaler
    from stoker.loader._inline import InlineIterator
    from stoker.loader._switch import Handover

# The pool's parts (the controller, the handover, the reply handler, the OpenMP watch: with
# statistics and psutil) are imported when workers start: a first batch the main process loads
# (stoker.loader._main_first) came 22 ms later for importing them first (tiny, 2-core VM).

__all__ = ["MultiWorkerIterator"]

# Longest single wait for worker replies; between waits dead workers and timeouts are checked.
WAIT_SLICE_S = 0.5
# Seconds between checks for dead workers while batches keep coming: a worker killed between
# batches holds none, and the others could finish the epoch without its death being seen.
DEATH_CHECK_S = 0.2
_PROTOCOL = 5
_LIVE: weakref.WeakSet[MultiWorkerIterator] = weakref.WeakSet()


@atexit.register
def _shutdown_all() -> None:  # pragma: no cover - exercised by a subprocess test
    for it in list(_LIVE):
        with contextlib.suppress(Exception):
            it._shutdown()


class MultiWorkerIterator(StokerIterBase):
    """Iterates a loader's batches with worker processes (see the module docstring)."""

    def __init__(self, loader: Any) -> None:
        check_main_guard()  # a spawn child re-importing a script without a __main__ guard
        rng_at_start = EpochState.capture_rng(loader.generator)
        super().__init__(loader)
        settings = self._settings = loader._worker_settings()
        self._dataset = seeded_per_epoch(self._dataset, self._shared_seed)  # datapipes: torch's
        self._pool: WorkerPool | ThreadPool | None = None
        self._handover: Handover | None = None  # processes watched for a handover to threads
        self._in_order: bool = settings.in_order
        self._prefetch = settings.prefetch
        self._iterable = self._dataset_kind == _torch_dl._DatasetKind.Iterable
        self._policy = settings.policy
        self._tally = FailureTally(self._policy, loader.failures)
        self._ended: dict[str, LoaderStats] = loader._ended
        self._supervisor = Supervisor(settings.max_worker_restarts, self._iterable)
        self._ctx = EpochContext(
            seed=int(self._base_seed), book=TaskBook(self._in_order), workers=self._num_workers
        )
        self._generation = 0  # epochs begun (see stoker.loader._epoch_handle)
        self._iter_epoch = 0  # epochs this iterator started before the current one
        self._device = settings.device
        self._device_stage: DeviceStage | None = None
        self._changes = DatasetChanges(self._dataset)
        self._started = time.monotonic()
        self._notes: list[str] = list(settings.notes)
        self._backend = settings.backend
        self._scaler: AutoScaler | None = None
        self._workers: list[Any] = []
        self._ready: set[int] = set()
        self._next_death_check = 0.0
        self._spin: Any = None
        # Where the backend probe found batches slow, a child loads the first batch beside it
        # and the workers start once it is delivered, with the probe's answer (stoker.loader.
        # _head): till then the loader is kept here, and the first task if a worker loads it.
        self._head: HeadStart | None = None
        self._head_spent: HeadStart | None = None  # its batch delivered, the child exiting
        self._slot_bytes = 0  # what the head start's batch took (HeadStart.slot_bytes)
        self._probe: Any = None
        self._deferred: Any = None
        self._epoch_request: int | None = None
        self._first_task: BatchTask | None = None
        # num_workers="auto": the first batch loaded in the main process (stoker.loader.
        # _main_first); where the loader then stays there, the epoch goes on inline.
        self._main_first: MainFirst | None = None
        self._inline: InlineIterator | None = None
        if loader._head is not None:
            (head, self._probe), loader._head = loader._head, None
            if isinstance(head, MainFirst):
                self._main_first = head
            else:
                self._head = head
            self._deferred = loader
        _LIVE.add(self)
        if self._deferred is None:
            self._start_workers(loader)
        self._reset(loader, first_iter=True, rng_at_start=rng_at_start)

    def _start_workers(self, loader: Any) -> None:
        """Start the pool with the loader's settings (taken in ``__init__``)."""
        from stoker.loader._openmp import spin_watch
        from stoker.loader._replies import ReplyHandler
        from stoker.loader._start import (
            shared_memory_directory,
            size_pool,
            slot_map,
            spec_fields,
            start_pool,
        )
        from stoker.loader._switch import Handover

        settings = self._settings
        ctx = settings.mp_context or mp.get_context()
        directory = shared_memory_directory(spill=not settings.shm_require)
        self._spec_base: dict[str, Any] = spec_fields(
            directory,
            self._num_workers,
            ctx.get_start_method(),
            iterable=self._iterable,
            auto_collation=self._auto_collation,
            drop_last=self._drop_last,
            on_error=self._policy.on_error,
            shm_require=settings.shm_require,
            nice=settings.nice,
            slot_bytes=self._slot_bytes,
        )
        init = sharding_worker_init(
            self._dataset, settings.worker_init_fn, self._world_size, self._rank
        )
        payload = self._payload = (self._dataset, self._collate_fn, init)
        # Where processes cannot start (a daemonic Pool worker), threads, with one warning.
        self._backend = fallback_backend(settings.backend, ctx.get_start_method())
        size = size_pool(
            settings, self._backend, self._num_workers, self._prefetch, self._iterable, self._notes
        )
        self._scaler = size.scaler
        specs = self._specs(size.workers)
        self._pool = start_pool(self._backend, ctx, specs, payload, size.capacity)
        self._slots = slot_map(self._pool, self._device is not None or self._pin_memory)
        pin_device = self._pin_memory_device if self._pin_memory else None
        self._replies = ReplyHandler(
            self._slots, self._tally, auto_collation=self._auto_collation, pin_device=pin_device
        )
        self._workers = self._pool.processes
        if Handover.wanted(settings, self._scaler, self._backend):
            assert self._scaler is not None
            running = len(self._pool.active)
            self._handover = Handover(self._scaler, running, loader, self._started)
        me = weakref.ref(self)  # no cycle: the iterator's collection shuts its workers down
        self._spin = spin_watch(lambda: getattr(me(), "_pool", None))  # see loader._openmp

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
        if not first_iter and self._deferred is not None:  # left before its workers started
            self._finish_start()
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
        seed = self._ctx.seed = epoch_seed(int(self._base_seed), self._iter_epoch)
        pool = self._pool
        deferred = first_iter and self._deferred is not None
        if not deferred and (pool is None or pool.closed):
            return
        if self._handover is not None:
            self._handover.handback = {}  # tasks of the last epoch taken back for threads
        self._generation += 1
        last = self._ctx
        if last.book.outstanding and pool is not None:
            # The last epoch was abandoned (early `break`): forget what it left behind.
            if not self._iterable:
                pool.drain_tasks()
            for arrived in last.book.replies():
                self._replies.discard(arrived.reply)
        epoch = resume.epoch if resume is not None else loader._epochs_started
        loader._epochs_started = epoch + 1
        state = EpochState(
            epoch=epoch,
            rng=rng_at_start if resume is None or resume.rng is None else resume.rng,
            sampler=EpochState.capture_sampler(self._index_sampler),
            delivered=set(resume.delivered) if resume is not None else set(),
            base_seed=int(self._base_seed),
            iter_epoch=self._iter_epoch,
            workers=self._num_workers,
        )
        self._ctx = EpochContext(
            epoch, seed, TaskBook(self._in_order), state, workers=self._num_workers
        )
        loader._epoch_state = state
        if self._device is not None:
            stage = make_stage(
                self._next_host, self._device, previous=self._device_stage, ready=self._host_ready
            )
            self._device_stage = stage
            state.in_flight = lambda: stage.in_flight
        jump_states = None
        if resume is not None and self._iterable:
            jump_states = self._ctx.resume_streams(resume, self._dataset, self._backend)
        if self._scaler is not None:
            self._scaler.retiring = 0  # a retire request drained with the old tasks is void
            if not first_iter:
                self._scaler.new_epoch()
        self._tally.new_epoch()
        request, loader._epoch_request = loader._epoch_request, None
        if deferred or pool is None:
            self._epoch_request = request  # for the workers, once they start
            return
        self._start_epoch(pool, request, jump_states)

    def _start_epoch(self, pool: Any, request: int | None, jump_states: Any = None) -> None:
        """Tell the workers the epoch has begun, and dispatch its first tasks."""
        pool.status.set_epoch(self._ctx.epoch)  # workers give up the last epoch's batches
        start = self._changes.start(
            self._ctx.epoch, request, jump_states, pickled=self._backend == "process"
        )
        for i in pool.active:
            pool.send_ctrl(i, start)
        if self._first_task is not None:  # (the head start gave no first batch)
            pool.put_task(self._first_task)
            self._first_task = None
        self._fill()

    # -- the head start ------------------------------------------------------------------

    def _head_batch(self) -> tuple[int, Any] | None:
        """The first batch, if the child that loaded it beside the probe gives it (the
        workers start at the next call); else the workers start now and load it."""
        if self._main_first is not None:
            return self._main_first_batch(self._main_first)
        head, self._head = self._head, None
        if head is not None:
            t0 = time.perf_counter()
            try:
                task = self._issue_first()
                if task is not None and not head.claims(task.index, task.seed):
                    self._first_task = task  # (another first batch: the sampler's own entropy)
                elif task is not None:
                    timeout = self._timeout
                    left = max(1e-6, timeout - (time.perf_counter() - t0)) if timeout > 0 else 0
                    batch = head.take(left)
                    if batch is None:
                        self._first_task = task  # (a worker loads it, at a next() after too)
                        if timeout > 0 and time.perf_counter() - t0 >= timeout:
                            raise head_timeout_error(task.index, timeout, head.pid)
                        self._notes.append("the head start gave no first batch: a worker loads it")
                    else:
                        self._head_spent = head  # (closed at the next batch: see take)
                        waited = time.perf_counter() - t0
                        return self._deliver_head(task.idx, task.index, batch, waited, head.parts)
            finally:
                if self._head_spent is not head:
                    head.close()
        self._finish_start()
        return None

    def _main_first_batch(self, first: MainFirst) -> tuple[int, Any] | None:
        """The first batch loaded here (stoker.loader._main_first); the workers, or the
        main process, take over at the next call. None: a worker loads it, started now."""
        t0 = time.perf_counter()
        task = self._issue_first()
        if task is not None:
            self._first_task = task  # (until delivered: an interrupted load leaves it to them)
            batch = first.load(self._deferred, task.index, task.seed, self._auto_collation)
            if batch is not None:
                self._first_task = None
                waited = time.perf_counter() - t0
                return self._deliver_head(task.idx, task.index, batch, waited, first.parts, True)
            self._notes.append("the main process gave no first batch: a worker loads it")
        self._finish_start()
        if self._inline is not None:
            return self._inline._next_host()
        return None

    def _issue_first(self) -> BatchTask | None:
        """The epoch's first task, issued; None once one was, or if the epoch is empty."""
        book, ctx = self._ctx.book, self._ctx
        if book.issued or ctx.sampler_done:
            return None
        try:
            index = self._next_index()
        except StopIteration:
            ctx.sampler_done = True
            return None
        return batch_task(ctx.epoch, ctx.seed, book.issue(index), index)

    def _deliver_head(
        self, idx: int, index: Any, batch: Any, waited: float, parts: int, main: bool = False
    ) -> tuple[int, Any]:
        """Deliver the head start's batch as task ``idx`` (what ReplyHandler.deliver does)."""
        book, ctx = self._ctx.book, self._ctx
        book.complete(idx, Arrived(ThreadBatch(ctx.epoch, idx, -1, (), (), batch, []), index, None))
        book.pop()
        if ctx.state is not None:
            ctx.state.delivered.add(idx)
        self._tally.delivered(len(index) if self._auto_collation else 1, ())
        if self._pin_memory:
            batch = _pin_memory(batch, self._pin_memory_device)
        ctx.wait_s += waited
        side_by_side = f" in {parts} parts side by side" if parts > 1 else ""
        after = f"{time.monotonic() - self._started:.2f}s after iter()"
        if main:
            self._notes.append(f"first batch loaded in the main process{side_by_side}, {after}")
        else:
            self._notes.append(
                f"first batch loaded beside the backend probe{side_by_side}, {after}; the "
                "workers start at the next batch"
            )
        return idx, batch

    def _close_head_starts(self) -> None:
        """Stop and reap the head start's child, waiting or spent (absent if __init__ failed
        before they were set)."""
        for name in ("_head", "_head_spent"):
            head = getattr(self, name, None)
            if head is not None:
                head.close()
            setattr(self, name, None)

    def _finish_start(self) -> None:
        """Take the probe's answer and start the workers (the head start is over)."""
        loader, self._deferred = self._deferred, None
        probe, self._probe = self._probe, None
        spent = self._head_spent
        self._slot_bytes = spent.slot_bytes if spent is not None else 0
        self._close_head_starts()
        first, self._main_first = self._main_first, None
        if first is None:
            loader._finish_probe(probe)
        elif self._decide_after_main_first(loader, first):
            return
        settings = self._settings = loader._worker_settings()
        self._num_workers = loader.num_workers
        self._ctx.workers = self._num_workers
        if self._ctx.state is not None:
            self._ctx.state.workers = self._num_workers
        self._notes = list(settings.notes) + self._notes
        self._start_workers(loader)
        assert self._pool is not None
        request, self._epoch_request = self._epoch_request, None
        self._start_epoch(self._pool, request)

    def _decide_after_main_first(self, loader: Any, first: MainFirst) -> bool:
        """Take the probe's answer after the main process loaded the first batch (or could
        not): True where the epoch goes on in the main process (``self._inline``)."""
        first.close()
        left = first.still_left()
        if left and self._workers_fork():
            loader._keep_inline(left)
        elif left:  # (workers that do not fork inherit nothing; the probe would: none)
            why = f"the first batch left {left} open: no probe was forked beside it"
            loader._apply_probe("process", why, {})
        else:
            try:
                probe = loader._start_probe()
            except OSError as exc:  # (no fork: the workers' start raises what it raises)
                loader._apply_probe("process", f"the backend probe could not start: {exc}", {})
            else:
                loader._finish_probe(probe, workers_started=False)
        if loader._resolved_backend != "inline":
            return False
        from stoker.loader._inline import InlineIterator

        pending = None
        if self._first_task is not None:  # (the main process gave no first batch)
            pending = (self._first_task.idx, self._first_task.index)
            self._first_task = None
        self._inline = InlineIterator.adopt(loader, self, pending)
        if loader._iterator is self:  # (persistent: the next epochs get torch's num_workers=0
            loader._iterator = None  # iterator; this one lives while its epoch is held)
        return True

    def _workers_fork(self) -> bool:
        """Whether the workers start by ``fork`` (and so inherit what this process holds)."""
        return (self._settings.mp_context or mp.get_context()).get_start_method() == "fork"

    def _fill(self) -> None:
        """Dispatch tasks until ``prefetch_factor x num_workers`` are in flight."""
        pool = self._pool
        if pool is None or pool.closed or self._draining():
            return
        book = self._ctx.book
        delivered = self._ctx.delivered_before()
        limit = self._prefetch * len(pool.active)
        scaler = self._scaler
        if scaler is not None and scaler.window is not None:
            if scaler.window >= limit:
                scaler.end_slow_start()  # the slow start is over
            else:
                limit = scaler.window
        while not self._ctx.sampler_done and book.outstanding < limit:
            worker = None
            if self._iterable:
                worker = self._ctx.streams.pick(self._ctx.active, book.pending(), limit)
                if worker is None:  # every stream ended, or (in_order=False) all at their share
                    self._ctx.sampler_done = not any(self._ctx.active)
                    return
            try:
                index = self._next_index()
            except StopIteration:
                self._ctx.sampler_done = True
                return
            idx = book.issue(index)
            if idx in delivered:  # resumed epoch: delivered before the checkpoint
                if not self._iterable or self._ctx.jump:
                    book.skip(idx)
                    continue
                self._ctx.fast_forward.add(idx)  # a stream must pass it: load it, then drop it
            msg = batch_task(self._ctx.epoch, self._ctx.seed, idx, index)
            if worker is None:
                pool.put_task(msg)
            else:
                self._ctx.streams.sent(idx, worker)
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
            or self._draining()
            or self._ctx.book.outstanding == 0
        ):
            return
        self._ctx.let_go.extend(pool.drain_tasks())
        if self._scaler is not None:
            self._scaler.retiring = 0  # a retire request drained with the tasks is void

    def _redispatch_let_go(self) -> None:
        pool = self._pool
        tasks, self._ctx.let_go = self._ctx.let_go, []
        if pool is None or pool.closed:
            return
        for msg in sorted(tasks, key=lambda m: m.idx):  # by batch index, as first dispatched
            pool.put_task(msg)

    # -- receiving -----------------------------------------------------------------------

    def _next_data(self) -> Any:
        handover = self._handover
        if handover is not None and handover.state == "watch":
            # The handover reads the loop's own CPU share: this call's is stoker's.
            handover.inside.enter()
            try:
                return self._next_batch()
            finally:
                handover.inside.leave()
                handover.loop_started()
        return self._next_batch()

    def _next_batch(self) -> Any:
        if self._device_stage is not None:
            return self._device_stage.next()
        return self._next_host()[1]

    def _next_host(self) -> tuple[int, Any]:
        if self._inline is not None:
            return self._inline._next_host()
        if self._deferred is not None:
            first = self._head_batch()
            if first is not None:
                return first
        t0 = time.perf_counter()
        book = self._ctx.book
        if self._ctx.let_go:  # the epoch goes on after all: the workers get them back
            self._redispatch_let_go()
        self._check_deaths()
        while True:
            if self._handover is not None and self._handover.draining:
                if self._handover.drained(book.pending()):
                    self._hand_over()  # the processes hold no batch: threads take over
                    self._fill()
            got = book.pop()
            self._replies.count_failures(self._ctx, got)
            if got is not None:
                self._fill()
                self._ctx.wait_s += time.perf_counter() - t0
                if self._scaler is not None:
                    self._control()
                if self._spin is not None:
                    self._poll_spin()
                return got[0], self._replies.deliver(self._ctx, got[0], got[1], self._pool)
            if book.outstanding == 0 and self._ctx.sampler_done:
                # A death in the epoch raises (or restarts the worker) before it ends, as
                # torch's SIGCHLD handler would, even if the others loaded its share.
                self._check_deaths(now=True)
                # Every worker must have reported its setup: a worker_init_fn that fails in
                # a worker nobody waited on must still surface (torch raises it too).
                self._await_ready(t0)
                self._ctx.wait_s += time.perf_counter() - t0
                if self._ctx.state is not None:
                    self._ctx.state.finished = True
                if self._spin is not None:  # the workers idle until the next epoch
                    self._spin_note(self._spin.close("the epoch ended"))
                if not self._persistent_workers:
                    self._shutdown()
                self._ended["stats"] = self.stats()
                self._tally.end_epoch()
                raise StopIteration
            self._receive(t0)

    def _host_ready(self) -> bool:
        """Whether :meth:`_next_host` would return (a batch, the epoch's end, an error)
        without waiting for loading; replies that came are taken in."""
        if self._inline is not None:
            return self._inline._host_ready()
        pool = self._pool
        if self._deferred is not None or pool is None or pool.closed:
            return self._deferred is None  # (deferred: the workers have not started)
        for msg in pool.receive(0):
            self._handle(msg)
        book = self._ctx.book
        return book.due() or (book.outstanding == 0 and self._ctx.sampler_done)

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
                    raise self._supervisor.timeout_error(
                        pool, self._ctx.book, self._ctx.epoch, timeout
                    )
                wait = min(wait, left)
            msgs = pool.receive(wait)
            for msg in msgs:
                self._handle(msg)
            if msgs:
                return  # (while batches come, _next_host checks for deaths)
            self._check_deaths(now=True)

    def _check_deaths(self, now: bool = False) -> None:
        """Act on the workers that died (at most every :data:`DEATH_CHECK_S` unless
        ``now``): restart each, or raise its :class:`WorkerError`."""
        t = time.monotonic()
        if not now and t < self._next_death_check:
            return
        self._next_death_check = t + DEATH_CHECK_S
        pool = self._pool
        if pool is None or pool.closed:
            return
        for worker_id, pid, code, leftovers in pool.dead():
            for msg in leftovers:
                self._handle(msg)
            if worker_id not in pool.retired:  # its last words may say it retired
                self._worker_died(worker_id, pid, code)

    def _handle(self, msg: Reply) -> None:
        """Act on one worker reply (see :class:`ReplyHandler` for replies to tasks)."""
        if isinstance(msg, StartFailed):
            pid = worker_pid(self._workers[msg.worker_id])
            self._shutdown()
            raise unpack_exception(msg.error, msg.worker_id, pid, None)
        if isinstance(msg, Ready):  # a worker finished its setup (worker_init_fn)
            self._ready.add(msg.worker_id)
        elif isinstance(msg, Retired):  # a worker retired on request (num_workers="auto")
            pool = self._pool
            if pool is not None:
                if isinstance(pool, WorkerPool):
                    self._replies.drop_slots_of(pool, msg.worker_id)
                pool.retired_worker(msg.worker_id)
            if self._scaler is not None:
                self._scaler.retired()
        elif self._replies.take(msg, self._ctx, self._scaler, self._handover):
            self._fill()  # a skip freed a place

    def _worker_died(self, worker_id: int, pid: int | None, code: int | None) -> None:
        pool = self._pool
        assert pool is not None
        death = (worker_id, pid, code)
        error = self._supervisor.death_error(
            pool, death, self._ctx.epoch, loaded_any=bool(self._replies.worker_batches[worker_id])
        )
        if error is not None:
            self._shutdown()
            raise error
        self._ready.discard(worker_id)
        epoch_seed = (self._ctx.epoch, self._ctx.seed)
        self._supervisor.restart(pool, self._ctx.book, death, epoch_seed, self._catch_up_message())
        self._workers = pool.processes

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
        if self._draining():
            return  # the pool is about to be replaced: no workers started or retired now
        if scaler.due():
            # Replies are taken in only when the consumer finds no batch ready: a pool ahead
            # of it (threads on a waiting workload) would report its busy time in bursts,
            # reading 0% busy in one interval and over 100% in the next.
            for msg in pool.receive(0):
                self._handle(msg)
        t, before = time.perf_counter(), len(pool.active)
        decision = scaler.step(
            pool,
            wait_s=self._ctx.wait_s,
            busy_s=float(sum(self._replies.worker_busy.values())),
            delivered=self._ctx.book.delivered,
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

    def _poll_spin(self) -> None:
        assert self._spin is not None
        self._spin_note(self._spin.poll())

    def _spin_note(self, note: str | None) -> None:
        if note is not None:
            self._notes.append(f"{time.monotonic() - self._started:.1f}s: {note}")

    def _draining(self) -> bool:
        """Decided for threads: dispatch waits until the processes hold no batch."""
        return self._handover is not None and self._handover.draining

    def _watch_gil(self, changed_since: float | None) -> None:
        """Let the handover decide (see :meth:`Handover.watch`)."""
        if self._handover is None or self._pool is None or self._scaler is None:
            return
        note = self._handover.watch(changed_since, self._pool, self._scaler)
        if note is not None:
            self._notes.append(note)

    def _hand_over(self) -> None:
        """Replace the drained process pool with threads, mid-epoch."""
        handover, old, scaler = self._handover, self._pool, self._scaler
        assert handover is not None
        if old is None or old.closed or scaler is None:
            handover.state = None
            return
        self._backend = "thread"  # (the catch-up message carries objects, not pickles)
        catch_up = self._catch_up_message()
        new = handover.replace(old, scaler, self._prefetch, self._specs, self._payload, catch_up)
        self._pool, self._scaler, self._workers = new.pool, new.scaler, new.pool.processes
        self._ready = set()
        self._notes.append(new.note)

    def _catch_up_message(self) -> EpochStart:
        """An epoch message carrying every change since the pool started (for a new worker)."""
        return self._changes.catch_up(self._ctx.epoch, pickled=self._backend == "process")

    # -- state, stats and shutdown -------------------------------------------------------

    def stats(self) -> LoaderStats:
        if self._inline is not None:
            return self._inline.stats()
        if self._deferred is not None:  # the head start's batch delivered, no worker yet
            return LoaderStats(
                backend="process",
                num_workers=0,
                epoch=max(0, self._ctx.epoch),
                batches=self._ctx.book.delivered,
                samples=self._tally.samples,
                wait_s=self._ctx.wait_s,
                failures=len(self._tally.log),
                notes=tuple(self._notes[-20:]),
            )
        from stoker.loader._replies import worker_stats

        pool = self._pool
        ids = pool.active if pool is not None else list(range(len(self._workers)))
        elapsed = max(1e-9, time.monotonic() - self._started)
        return LoaderStats(
            backend="thread" if self._backend == "thread" else "process",
            num_workers=len(ids),
            notes=tuple(self._notes[-20:]),
            worker_restarts=self._supervisor.restarts,
            workers=tuple(
                worker_stats(i, self._workers[i], pool, self._ctx, self._replies, elapsed)
                for i in ids
            ),
            **self._replies.delivery_stats(self._ctx),
        )

    @property
    def shut_down(self) -> bool:
        """Its workers were stopped (after a worker's death or a failed start): it cannot
        load another batch."""
        return self._pool is not None and self._pool.closed

    def _shutdown(self) -> None:
        if self._device_stage is not None:
            self._device_stage.close()  # no slot is unmapped or refilled under a copy
        if self._handover is not None:
            self._handover.stop()
        probe = getattr(self, "_probe", None)
        self._close_head_starts()
        loader = getattr(self, "_deferred", None)
        first = getattr(self, "_main_first", None)
        if first is not None:
            first.close()
        if loader is not None and first is not None:  # left before the answer was taken
            self._main_first = None
            left = first.still_left()
            if left and self._workers_fork():
                loader._keep_inline(left)
            else:
                loader._resolved_backend = "auto"  # (the next iter() starts afresh)
        if loader is not None and probe is not None:
            loader._pending_probe = probe  # its answer is the loader's (taken at the next iter)
        elif probe is not None:
            probe.close()
        self._probe = self._deferred = None
        spin = getattr(self, "_spin", None)  # (absent if __init__ failed before it)
        if spin is not None:
            spin.close()
        pool = self._pool
        if pool is not None and not pool.closed:
            pool.shutdown()
            self._slots.clear()
        _LIVE.discard(self)

    def _shutdown_workers(self) -> None:
        """torch's iterator's name for :meth:`_shutdown` (torch's tests and tools call it)."""
        self._shutdown()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self._shutdown()
