"""Thread workers: the same dispatch as process workers, without pickling, IPC or copies.

Decoding, resizing and most tensor operations release the GIL, so threads in the main process
can do that work in parallel; batches then need no shared memory and the dataset is never
copied into other processes (no copy-on-read growth). Each thread sees its own
``torch.utils.data.get_worker_info()``. The threads of a pool share the batches of a map-style
dataset: each loads runs of samples from the oldest batch that has samples left (see
:mod:`stoker.workers._board`). Limits: global random generators (``torch``, ``random``,
``numpy``) are shared by all threads, so per-batch reseeding, which makes process workers'
augmentations reproducible, is not done; pure-Python work does not run in parallel.
"""

# Over 400 lines: the thread pool mirrors the process pool's whole interface (WorkerBackend).

from __future__ import annotations

import contextlib
import copy
import queue
import sys
import threading
import time
import traceback
from typing import Any, Final

from torch.utils.data._utils import worker as _torch_worker

from stoker.workers import _patches
from stoker.workers._blocked import BlockedSampler
from stoker.workers._board import RUN_LIMIT_S, Board, OpenBatch, run_length
from stoker.workers._epoch_sync import apply_changes
from stoker.workers._errors import pack_exception
from stoker.workers._fetch import Abandoned, BatchFetcher, SkipBatch, fetch_stream
from stoker.workers._loop import RETIRE, STOP, WorkerSpec
from stoker.workers._messages import (
    BatchError,
    BatchSkipped,
    BatchTask,
    EpochStart,
    GaveUp,
    Ready,
    Reply,
    Retired,
    StartFailed,
    StreamEnd,
    ThreadBatch,
)
from stoker.workers._status import LocalStatus

__all__ = ["ThreadPool"]

# Put on the task queue to wake a waiting thread: a batch was opened that it can help load.
HELP = b"H"
# Where a failure happened, as a worker's error says.
_LOADING = "loading the samples at indices"


class _ThreadWorker:
    def __init__(self, pool: ThreadPool, spec: WorkerSpec) -> None:
        self.pool = pool
        self.spec = spec
        self.fetcher: BatchFetcher | None = None
        self.fetcher_error: BaseException | None = None
        self.epoch = -1
        # Time asleep inside loading (waiting for the GIL included), for num_workers="auto".
        self.blocked = BlockedSampler(pool.span_gate)
        # An iterable dataset is read as one stream per worker: each thread reads its own
        # shallow copy, as each process does, so that `worker_init_fn` configures this
        # worker's stream (torch's documented sharding pattern) and `__iter__` state is not
        # shared. A map-style dataset is shared: any thread loads any sample.
        self.dataset = pool.dataset
        if spec.iterable:
            with contextlib.suppress(Exception):  # uncopyable: shared, as before
                self.dataset = copy.copy(pool.dataset)

    def _new_fetcher(self) -> BatchFetcher:
        spec = self.spec
        return BatchFetcher(
            self.dataset,
            iterable=spec.iterable,
            auto_collation=spec.auto_collation,
            collate_fn=self.pool.collate_fn,
            drop_last=spec.drop_last,
            on_error=spec.on_error,
        )

    def run(self) -> None:
        spec, pool = self.spec, self.pool
        _patches.local_info.info = _torch_worker.WorkerInfo(
            id=spec.worker_id, num_workers=spec.num_workers, seed=spec.seed, dataset=self.dataset
        )
        if pool.worker_init_fn is not None:
            try:
                pool.worker_init_fn(spec.worker_id)
            except BaseException as exc:
                where = "running `worker_init_fn`"
                pool.results.put(
                    StartFailed(spec.worker_id, pack_exception(exc, where, inline=True))
                )
                return
        if not spec.iterable:
            self.fetcher = self._new_fetcher()
        pool.results.put(Ready(spec.worker_id))
        tasks = pool.ctrl[spec.worker_id] if spec.iterable else pool.tasks
        share = self.fetcher is not None and self.fetcher.shareable()
        board = pool.board
        while not pool.closed:
            if share and self.help():
                continue
            t0 = time.perf_counter()
            board.waiting(1)
            try:
                msg = tasks.get()
            finally:
                board.waiting(-1)
            self.blocked.waited(time.perf_counter() - t0)
            if msg == STOP:
                return
            if msg == RETIRE:
                pool.results.put(Retired(self.epoch, spec.worker_id))
                return
            if msg == HELP:
                continue
            if isinstance(msg, EpochStart):
                self.start_epoch(msg)
                continue
            if share:
                self.open(msg)
            else:
                self.run_task(msg)

    def start_epoch(self, msg: EpochStart) -> None:
        """An epoch starts: a copied dataset takes the main process's changes to the dataset
        (objects, not pickles) and its `set_epoch`; an iterable stream starts again."""
        self.epoch, changes, set_epoch, _ = msg
        if not self.spec.iterable:
            return
        self.fetcher, self.fetcher_error = None, None
        try:
            if self.dataset is not self.pool.dataset:
                if changes:
                    apply_changes(self.dataset, changes)
                fn = getattr(self.dataset, "set_epoch", None)
                if set_epoch is not None and callable(fn):
                    fn(set_epoch)
            self.fetcher = self._new_fetcher()
        except Exception as exc:
            self.fetcher_error = exc

    # -- batches shared by the pool's threads (map-style datasets) ----------------------------

    def open(self, msg: BatchTask) -> None:
        """Put a task on the board, and wake as many waiting threads as it has runs for."""
        pool = self.pool
        batch = pool.board.open(msg, pool.status.abandoned(msg.epoch))
        self.wake(-(-len(batch.index) // run_length(pool.board.pace)) - 1)

    def wake(self, runs: int) -> None:
        """Wake as many threads waiting for a task as there are ``runs`` for them to help
        with."""
        pool = self.pool
        for _ in range(min(pool.board.idle, runs)):
            pool.tasks.put(HELP)

    def help(self) -> bool:
        """Load runs of the oldest open batches until none has samples left; False if there
        was nothing to do."""
        pool = self.pool
        claimed = pool.board.claim()
        if claimed is None:
            return False
        while claimed is not None and not pool.closed:
            self.load_run(*claimed)
            claimed = pool.board.claim()
        return True

    def load_run(self, batch: OpenBatch, start: int, stop: int) -> None:
        """Load positions ``start:stop`` of ``batch``; the thread that loads its last samples
        collates and replies."""
        pool, board, fetcher = self.pool, self.pool.board, self.fetcher
        assert fetcher is not None  # shared batches are map-style: the fetcher is made once
        epoch, idx, seed, _ = batch.task
        wid = self.spec.worker_id
        if batch.closed:
            return
        if batch.stop():  # its epoch was abandoned
            if board.close(batch):
                pool.results.put(GaveUp(epoch, idx, wid))
            return
        pool.status.begin(wid, epoch, idx)
        self.blocked.begin()
        t0 = time.perf_counter()
        try:
            parts = fetcher.load_run(batch.index[start:stop], seed, RUN_LIMIT_S)
        except BaseException as exc:  # sys.exit() in a dataset too: see pack_exception
            self.blocked.end()
            pool.status.end(wid)
            if board.close(batch):
                self.failed(exc, epoch, idx)
            return
        seconds = time.perf_counter() - t0
        span = self.blocked.end()
        if span is not None:
            board.add_span(batch, span)
        pool.status.end(wid)
        done = board.finish(batch, start, parts, seconds, wid)  # (the pace now counts it)
        if start + len(parts) < stop:  # the run ended short: the rest goes back, for anyone
            board.give_back(batch, start + len(parts), stop)
            self.wake(-(-(stop - start - len(parts)) // run_length(board.pace)))
        if done:
            self.reply(batch)

    def reply(self, batch: OpenBatch) -> None:
        """Collate a batch whose samples are all loaded, and send it."""
        fetcher = self.fetcher
        assert fetcher is not None
        epoch, idx, _, _ = batch.task
        wid = self.spec.worker_id
        parts, batch.parts = batch.parts, []
        t0 = time.perf_counter()
        try:
            out, failures = fetcher.collate_runs(parts, batch.index)
        except BaseException as exc:
            self.failed(exc, epoch, idx)
            return
        del parts
        work = dict(batch.work)
        work[wid] = work.get(wid, 0.0) + time.perf_counter() - t0
        self.done(epoch, idx, tuple(work.items()), tuple(batch.spans), out, failures)

    def failed(self, exc: BaseException, epoch: int, idx: int) -> None:
        """Report a batch that could not be loaded: skipped (``K``) or an error (``X``)."""
        wid = self.spec.worker_id
        if isinstance(exc, SkipBatch):
            self.pool.results.put(BatchSkipped(epoch, idx, wid, exc.failures))
        else:
            packed = pack_exception(exc, _LOADING, inline=True)
            self.pool.results.put(BatchError(epoch, idx, wid, packed))

    def done(
        self,
        epoch: int,
        idx: int,
        work: tuple[tuple[int, float], ...],
        spans: tuple[tuple[float, float], ...],
        batch: Any,
        failures: list[Any],
    ) -> None:
        """Send a loaded batch: the object itself, no slot."""
        wid = self.spec.worker_id
        self.pool.results.put(ThreadBatch(epoch, idx, wid, work, spans, batch, failures))

    # -- a batch loaded by one thread (iterable datasets, `__getitems__`) ---------------------

    def run_task(self, msg: BatchTask) -> None:
        epoch, idx, seed, index = msg
        wid, pool = self.spec.worker_id, self.pool
        t0 = time.perf_counter()
        pool.status.begin(wid, epoch, idx)
        error, self.fetcher_error = self.fetcher_error, None  # reported once
        try:
            self.blocked.begin()
            stop = None if self.spec.iterable else pool.status.abandoned(epoch)
            batch, failures = fetch_stream(
                self.fetcher, error, self.spec.on_error, index, seed, stop
            )
            sampled = self.blocked.end()
        except StopIteration as exc:
            if self.spec.iterable:  # the stream is over
                pool.results.put(StreamEnd(epoch, idx, wid))
            else:  # from a map-style __getitem__: an error of its batch (see _loop.py)
                self.failed(exc, epoch, idx)
            return
        except Abandoned:
            self.blocked.end()
            pool.results.put(GaveUp(epoch, idx, wid))
            return
        except BaseException as exc:
            self.failed(exc, epoch, idx)
            return
        finally:
            pool.status.end(wid)
        busy = time.perf_counter() - t0
        spans = () if sampled is None else (sampled,)
        self.done(epoch, idx, ((wid, busy),), spans, batch, failures)


class ThreadPool:
    """Worker threads with the same interface as :class:`stoker.workers.WorkerPool`.

    Args:
        specs: one :class:`WorkerSpec` per worker.
        payload: ``(dataset, collate_fn, worker_init_fn)``.
    """

    kind: Final = "thread"

    def __init__(
        self, specs: list[WorkerSpec], payload: tuple[Any, ...], capacity: int | None = None
    ) -> None:
        _patches.acquire()  # released by shutdown()
        self.specs = specs
        self.dataset, self.collate_fn, self.worker_init_fn = payload
        self.tasks: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.ctrl: list[queue.SimpleQueue[Any]] = [queue.SimpleQueue() for _ in specs]
        self.results: queue.SimpleQueue[Reply] = queue.SimpleQueue()
        self.capacity = max(len(specs), capacity or 0)
        self.status = LocalStatus(self.capacity)
        self.board = Board()
        self.span_gate = [0.0]  # the threads take turns timing spans (see BlockedSampler)
        self.retired: set[int] = set()
        self.closed = False
        self.processes: list[threading.Thread] = [None] * len(specs)  # type: ignore[list-item]
        self._reported: set[int] = set()
        try:
            for spec in specs:
                self._start(spec.worker_id)
        except BaseException:
            self.shutdown()
            raise

    def _start(self, worker_id: int) -> None:
        worker = _ThreadWorker(self, self.specs[worker_id])
        thread = threading.Thread(target=worker.run, name=f"stoker-worker-{worker_id}", daemon=True)
        thread.start()
        self.processes[worker_id] = thread

    def room(self) -> int:
        """Workers :meth:`add` can start now (retiring threads hold their ids until they end)."""
        ended = sum(1 for i in self.retired if not self.processes[i].is_alive())
        return ended + self.capacity - len(self.specs)

    def add(self) -> int:
        """Start one more worker thread; returns its id."""
        reusable = [i for i in sorted(self.retired) if not self.processes[i].is_alive()]
        if reusable:
            worker_id = reusable[0]
            self.retired.discard(worker_id)
        else:
            worker_id = len(self.specs)
            if worker_id >= self.capacity:
                raise RuntimeError(f"the pool holds at most {self.capacity} workers")
            self.specs.append(
                type(self.specs[0])(**{**self.specs[0].__dict__, "worker_id": worker_id})
            )
            self.ctrl.append(queue.SimpleQueue())
            self.processes.append(None)  # type: ignore[arg-type]
        self._start(worker_id)
        return worker_id

    def retire(self, count: int = 1) -> None:
        """Ask the ``count`` threads that come free first to end, ahead of queued tasks."""
        queued = []
        with contextlib.suppress(queue.Empty):
            while True:
                queued.append(self.tasks.get_nowait())
        for msg in [RETIRE] * count + queued:
            self.tasks.put(msg)

    def retired_worker(self, worker_id: int) -> None:
        self.retired.add(worker_id)
        self._reported.add(worker_id)

    @property
    def active(self) -> list[int]:
        return [i for i in range(len(self.processes)) if i not in self.retired]

    def restart(self, worker_id: int) -> None:
        self._reported.discard(worker_id)
        self._start(worker_id)

    def put_task(self, msg: BatchTask) -> None:
        self.tasks.put(msg)

    def send_ctrl(self, worker_id: int, msg: BatchTask | EpochStart) -> None:
        self.ctrl[worker_id].put(msg)

    def drain_tasks(self) -> list[BatchTask]:
        out = []
        with contextlib.suppress(queue.Empty):
            while True:
                msg = self.tasks.get_nowait()
                if msg not in (STOP, RETIRE, HELP):
                    out.append(msg)
        return out

    def receive(self, timeout: float) -> list[Reply]:
        try:
            msgs = [self.results.get(timeout=timeout)]
        except queue.Empty:
            return []
        with contextlib.suppress(queue.Empty):
            while True:
                msgs.append(self.results.get_nowait())
        return msgs

    def dead(self) -> list[tuple[int, int | None, int | None, list[Reply]]]:
        """Threads that ended without being asked (an error escaped the worker loop)."""
        out: list[tuple[int, int | None, int | None, list[Reply]]] = []
        for i, thread in enumerate(self.processes):
            if i in self.retired:
                continue
            if not thread.is_alive() and i not in self._reported:
                self._reported.add(i)
                out.append((i, None, 1, self.receive(0)))
        return out

    def dump_stack(self, worker_id: int) -> str:
        ident = self.processes[worker_id].ident
        frame = sys._current_frames().get(ident) if ident is not None else None
        if frame is None:
            return ""
        return f"Thread stoker-worker-{worker_id}:\n" + "".join(traceback.format_stack(frame))

    def shutdown(self) -> None:
        """Ask every thread to stop; threads stuck in user code are left to finish (daemon)."""
        if self.closed:
            return
        self.closed = True
        _patches.release()
        self.status.give_up_all()  # batches in flight are not wanted: stop at the next sample
        for i in range(len(self.specs)):
            self.tasks.put(STOP)
            self.ctrl[i].put(STOP)
        for thread in self.processes:
            if thread is not threading.current_thread():
                thread.join(timeout=1.0)
