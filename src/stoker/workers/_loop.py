"""The code that runs inside a worker process.

A worker takes a task (``B``: fetch and collate the samples of one batch), records it in the
shared status table, reseeds ``torch``/``random``/``numpy`` from the task's seed, collates
straight into a shared-memory slot, and sends a small header back (or ``Q``: it gave the batch
up, its epoch abandoned by the loop). Control messages (``E``: a
new epoch, with the dataset attributes the main process changed; ``S``: stop) come on its own
control pipe. When the main process dies the worker unlinks the pool's shared memory and
exits, even while user code blocks (a watcher thread, and ``PR_SET_PDEATHSIG`` on Linux).
``SIGUSR1`` makes it write every thread's Python stack to its stack file (hang reports).
"""

from __future__ import annotations

import contextlib
import faulthandler
import glob
import os
import pickle
import signal
import threading
import time
from dataclasses import dataclass
from typing import Any

import cloudpickle
from torch.utils.data._utils import worker as _torch_worker

from stoker._introspect.platform import set_parent_death_signal
from stoker.sampling._seeding import WorkerSeeding
from stoker.transport import SlotArena, encode, open_private_file
from stoker.transport._namespace import MARKER
from stoker.workers import _collate
from stoker.workers._blocked import BlockedSampler
from stoker.workers._epoch_sync import apply_changes
from stoker.workers._errors import pack_exception
from stoker.workers._fetch import Abandoned, BatchFetcher, SkipBatch, fetch_stream
from stoker.workers._malloc import settle_malloc
from stoker.workers._messages import (
    BatchError,
    BatchSkipped,
    BatchTask,
    EpochStart,
    GaveUp,
    Ready,
    Reply,
    Retired,
    SlotBatch,
    StartFailed,
    StreamEnd,
    from_wire,
    to_wire,
)
from stoker.workers._queue import TaskQueue
from stoker.workers._status import StatusTable
from stoker.workers._thread_caps import cap_threads

__all__ = ["RETIRE", "STOP", "WorkerSpec", "worker_main"]

STOP = b"S"
# Taken from the shared queue by whichever worker is idle first: that worker exits.
RETIRE = b"R"
# How often a worker checks that the main process is still alive.
PARENT_POLL_S = 0.25
_PROTOCOL = 5
# Where a failure happened, as a worker's error says.
_LOADING = "loading the samples at indices"
# Sent by the kernel to a worker when the main process (thread) that started it dies.
PARENT_DEATH_SIGNAL = signal.SIGUSR2


# A data reply's fallback field: the batch crossed the pipe for want of shared memory
# (NO_ROOM), or went to a slot in the spill directory (SPILLED); 1: over the slot budget.
NO_ROOM = 2
SPILLED = 3


@dataclass(frozen=True)
class WorkerSpec:
    """Everything a worker needs besides the dataset (small, picklable)."""

    worker_id: int
    num_workers: int
    seed: int  # torch's per-worker seed: base seed + worker id
    shm_dir: str  # directory of the pool's shared-memory files
    slot_prefix: str  # file-name prefix of the pool's shared-memory files
    slot_budget: int
    threads: int
    iterable: bool  # iterable dataset: tasks come on the control pipe
    auto_collation: bool
    drop_last: bool
    on_error: str = "raise"
    pdeathsig: bool = True
    shm_require: bool = False  # no room for a slot is an error, not the pipe (shm="require")
    spill_dir: str | None = None  # private directory under the temp dir for slots (see SlotArena)
    nice: int = 0  # added to the process's nice value at start (see WORKER_NICE)
    # Bytes a batch took in a slot before this worker started (the head start's batch; 0:
    # unknown): its first batch collates straight into a slot of that size.
    slot_bytes: int = 0


def _cleanup_pool_files(prefixes: list[str]) -> None:
    """The main process died: unlink the pool's files, then its private directories (the
    last worker to get here succeeds)."""
    for prefix in prefixes:
        marker = os.path.join(os.path.dirname(prefix), MARKER)
        for path in [*glob.glob(glob.escape(prefix) + "*"), marker]:
            with contextlib.suppress(OSError):
                os.unlink(path)
        with contextlib.suppress(OSError):
            os.rmdir(os.path.dirname(prefix))


def _watch_parent(ppid: int, prefix: list[str]) -> None:
    while True:
        time.sleep(PARENT_POLL_S)
        if os.getppid() != ppid:
            _cleanup_pool_files(prefix)
            os._exit(1)


def _set_pdeathsig(ppid: int, prefix: list[str]) -> None:
    """Get :data:`PARENT_DEATH_SIGNAL` when the parent dies: unlink the pool's files, exit.

    A signal of its own, not SIGTERM: the kernel may send it while ``getppid()`` still names
    the dying parent, so the handler cannot tell a parent's death from a polite SIGTERM.
    """

    def on_parent_death(signum: int, frame: Any) -> None:
        _cleanup_pool_files(prefix)
        os._exit(1)

    signal.signal(PARENT_DEATH_SIGNAL, on_parent_death)
    set_parent_death_signal(PARENT_DEATH_SIGNAL)
    if os.getppid() != ppid:  # the parent died before prctl took effect
        on_parent_death(PARENT_DEATH_SIGNAL, None)


def _lower_priority(nice: int) -> None:
    """Add ``nice`` to this process's nice value (inherited from the training process), so that
    the training step's threads take a core from the workers as soon as they wake."""
    if nice > 0 and hasattr(os, "nice"):
        with contextlib.suppress(OSError):
            os.nice(nice)


def _fallback_code(enc: Any, arena: SlotArena, short: int) -> int:
    """A data reply's fallback field (see :data:`NO_ROOM`)."""
    if enc.fallback:
        return NO_ROOM if arena.short > short else 1
    return SPILLED if enc.slot is not None and arena.sealed_spilled else 0


class _Worker:
    def __init__(
        self,
        spec: WorkerSpec,
        payload: Any,
        queue: TaskQueue,
        status: StatusTable,
        ctrl: Any,
        out: Any,
    ) -> None:
        self.spec = spec
        if isinstance(payload, bytes):
            payload = cloudpickle.loads(payload)
        self.dataset, self.collate_fn, self.worker_init_fn = payload
        self.queue = queue
        self.status = status
        self.ctrl = ctrl
        self.out = out
        self.epoch = -1
        self.fetcher: Any = None
        self.fetcher_error: BaseException | None = None
        self.arena = SlotArena(
            spec.slot_prefix,
            spec.worker_id,
            spec.slot_budget,
            directory=spec.shm_dir,
            require=spec.shm_require,
            spill_directory=spec.spill_dir,
            expect=spec.slot_bytes,
        )
        self.blocked = BlockedSampler()
        self.seeding: WorkerSeeding  # made by setup(), which seeds the generators
        self.task = (-1, -1)  # (epoch, index) of the task being loaded

    def send(self, msg: Reply) -> None:
        self.out.send_bytes(pickle.dumps(to_wire(msg), protocol=_PROTOCOL))

    def setup(self) -> bool:
        spec = self.spec
        _torch_worker._worker_info = _torch_worker.WorkerInfo(
            id=spec.worker_id, num_workers=spec.num_workers, seed=spec.seed, dataset=self.dataset
        )
        self.seeding = WorkerSeeding(spec.seed)
        _collate.install(self.arena)
        if not spec.iterable:
            self.fetcher = self._new_fetcher()
        if self.worker_init_fn is not None:
            try:
                self.worker_init_fn(spec.worker_id)
            except BaseException as exc:
                self.send(
                    StartFailed(spec.worker_id, pack_exception(exc, "running `worker_init_fn`"))
                )
                return False
            self.seeding.adopt()
        self.send(Ready(spec.worker_id))
        self.arena.prepare()  # (while the main process starts the others and the epoch)
        return True

    # -- epochs --------------------------------------------------------------------------

    def start_epoch(self, msg: EpochStart) -> None:
        epoch, changes, set_epoch, states = msg
        self.epoch = epoch
        if changes:
            apply_changes(self.dataset, cloudpickle.loads(changes))
        if set_epoch is not None:
            fn = getattr(self.dataset, "set_epoch", None)
            if callable(fn):
                fn(set_epoch)
        if self.spec.iterable:
            self.fetcher = None
            self.fetcher_error = None
            try:
                if states and self.spec.worker_id in states:  # resume where it stood
                    self.dataset.load_state_dict(states[self.spec.worker_id])
                self.fetcher = self._new_fetcher()
            except Exception as exc:
                self.fetcher_error = exc

    def _new_fetcher(self) -> BatchFetcher:
        spec = self.spec
        return BatchFetcher(
            self.dataset,
            iterable=spec.iterable,
            auto_collation=spec.auto_collation,
            collate_fn=self.collate_fn,
            drop_last=spec.drop_last,
            on_error=spec.on_error,
            reseed=self._reseed,
        )

    def _reseed(self, seed: int) -> None:
        """Seed the generators again for the task being loaded."""
        self.seeding.before_batch(seed, *self.task)

    def _dataset_state(self) -> Any:
        """An iterable dataset's position (for resume), if it can tell."""
        if not self.spec.iterable:
            return None
        fn = getattr(self.dataset, "state_dict", None)
        return fn() if callable(fn) else None

    def catch_up(self, epoch: int) -> bool:
        """Apply control messages until epoch ``epoch`` has started; False on stop."""
        while self.epoch != epoch:
            raw = self.ctrl.recv_bytes()
            if raw == STOP:
                return False
            msg = from_wire(pickle.loads(raw))
            assert isinstance(msg, EpochStart)  # the control pipe's only other kind is a task
            self.start_epoch(msg)
        return True

    def run_task(self, msg: BatchTask) -> None:
        epoch, idx, seed, index = msg
        wid = self.spec.worker_id
        t0 = time.perf_counter()
        self.status.begin(wid, epoch, idx)
        self.task = (epoch, idx)
        self.seeding.before_batch(seed, epoch, idx)
        arena = self.arena
        # A failed __iter__ is reported once; the stream then counts as over for this epoch.
        error, self.fetcher_error = self.fetcher_error, None
        try:
            arena.begin()
            self.blocked.begin()
            stop = None if self.spec.iterable else self.status.abandoned(epoch)
            batch, failures = fetch_stream(
                self.fetcher, error, self.spec.on_error, index, seed, stop
            )
            short = arena.short
            enc = encode(batch, arena)
            del batch
            sampled = self.blocked.end()
        except StopIteration as exc:
            if self.spec.iterable:  # the stream is over
                self.send(StreamEnd(epoch, idx, wid, self._dataset_state()))
                return
            # From a map-style dataset's __getitem__: an error of its batch. Raised again in
            # the main process it ends the loop there, as it does with torch's loaders.
            arena.current = None
            self.send(BatchError(epoch, idx, wid, pack_exception(exc, _LOADING)))
            return
        except Abandoned:
            arena.current = None
            self.blocked.end()
            self.send(GaveUp(epoch, idx, wid))
            return
        except SkipBatch as skip:
            arena.current = None
            self.send(BatchSkipped(epoch, idx, wid, skip.failures))
            return
        except BaseException as exc:  # sys.exit() in a dataset too: see pack_exception
            arena.current = None
            self.send(BatchError(epoch, idx, wid, pack_exception(exc, _LOADING)))
            return
        finally:
            self.status.end(wid)
        busy = time.perf_counter() - t0
        self.send(
            SlotBatch(
                epoch,
                idx,
                wid,
                work=((wid, busy),),
                spans=() if sampled is None else (sampled,),
                slot=enc.slot,
                retired=arena.take_retired(),
                payload=enc.payload,
                fallback=_fallback_code(enc, arena, short),
                failures=failures,
                position=self._dataset_state(),
            )
        )

    def loop(self) -> None:
        iterable = self.spec.iterable
        while True:
            t0 = time.perf_counter()
            raw = self.ctrl.recv_bytes() if iterable else self.queue.get()
            self.blocked.waited(time.perf_counter() - t0)
            if raw == STOP:
                return
            if raw == RETIRE:
                self.send(Retired(self.epoch, self.spec.worker_id))
                return
            msg = from_wire(pickle.loads(raw))
            if isinstance(msg, EpochStart):
                self.start_epoch(msg)
                continue
            assert isinstance(msg, BatchTask)  # the main process sends nothing else
            if msg.epoch != self.epoch and not self.catch_up(msg.epoch):
                return
            self.run_task(msg)


def worker_main(
    spec: WorkerSpec,
    payload: Any,
    queue: TaskQueue,
    status: StatusTable,
    ctrl: Any,
    out: Any,
    stack_path: str,
) -> None:
    """Entry point of a worker process."""
    ppid = os.getppid()
    pool_files = [os.path.join(spec.shm_dir, spec.slot_prefix)]
    if spec.spill_dir is not None:
        pool_files.append(os.path.join(spec.spill_dir, spec.slot_prefix))
    # Ctrl-C is the main process's to handle; it then stops the workers.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    threading.Thread(
        target=_watch_parent,
        args=(ppid, pool_files),
        daemon=True,
        name="stoker-parent",
    ).start()
    # Made by the main process; lives as long as this process.
    stack_file = os.fdopen(open_private_file(stack_path, os.O_WRONLY | os.O_APPEND), "w")
    faulthandler.register(signal.SIGUSR1, file=stack_file, all_threads=True)
    with contextlib.suppress(Exception):
        from torch.utils.data._utils import signal_handling

        signal_handling._set_worker_signal_handlers()
    if spec.pdeathsig:  # after torch's handlers, which include a SIGTERM one
        _set_pdeathsig(ppid, pool_files)
    cap_threads(spec.threads)
    _lower_priority(spec.nice)
    settle_malloc()  # see workers._malloc: no fault-bound first epoch
    status.hello(spec.worker_id)
    worker: _Worker | None = None
    try:
        worker = _Worker(spec, payload, queue, status, ctrl, out)
        if worker.setup():
            worker.loop()
    except (EOFError, BrokenPipeError, KeyboardInterrupt):
        pass
    except BaseException as exc:
        with contextlib.suppress(Exception):
            out.send_bytes(
                pickle.dumps(
                    to_wire(StartFailed(spec.worker_id, pack_exception(exc, "starting"))),
                    _PROTOCOL,
                )
            )
    finally:
        if worker is not None:
            worker.arena.close()
