"""The code that runs inside a worker process.

A worker takes a task (``B``: fetch and collate the samples of one batch), reseeds
``torch``/``random``/``numpy`` from the task's seed, collates straight into a shared-memory
slot, and sends a small header back. Control messages (``E``: a new epoch, with the dataset
attributes the main process changed; ``S``: stop) come on its own control pipe. A daemon
thread ends the worker when the main process dies, even while user code blocks.
"""

from __future__ import annotations

import os
import pickle
import signal
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any

import cloudpickle
import torch
from torch.utils.data._utils import fetch as _fetch
from torch.utils.data._utils import worker as _torch_worker

from stoker._epoch_sync import apply_changes
from stoker._seeding import seed_all
from stoker.transport import SlotArena, encode
from stoker.workers import _collate
from stoker.workers._errors import pack_exception

__all__ = ["STOP", "WorkerSpec", "worker_main"]

STOP = b"S"
# How often a worker checks that the main process is still alive.
PARENT_POLL_S = 0.25
_PROTOCOL = 5


@dataclass(frozen=True)
class WorkerSpec:
    """Everything a worker needs besides the dataset (small, picklable)."""

    worker_id: int
    num_workers: int
    seed: int  # torch's per-worker seed: base seed + worker id
    slot_prefix: str
    slot_budget: int
    threads: int
    iterable: bool  # iterable dataset: tasks come on the control pipe
    auto_collation: bool
    drop_last: bool


def _watch_parent(ppid: int) -> None:
    while True:
        time.sleep(PARENT_POLL_S)
        if os.getppid() != ppid:
            os._exit(1)


def _cap_threads(n: int) -> None:
    torch.set_num_threads(n)
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ.setdefault(var, str(n))
    try:
        from threadpoolctl import threadpool_limits

        threadpool_limits(n)
    except Exception:  # optional dependency; absent or a library it cannot drive
        pass
    cv2 = sys.modules.get("cv2")
    if cv2 is not None:
        try:
            cv2.setNumThreads(n)
        except Exception:
            pass


class _Worker:
    def __init__(
        self, spec: WorkerSpec, payload: Any, task_reader: Any, task_lock: Any, ctrl: Any, out: Any
    ) -> None:
        self.spec = spec
        if isinstance(payload, bytes):
            payload = cloudpickle.loads(payload)
        self.dataset, self.collate_fn, self.worker_init_fn = payload
        self.task_reader = task_reader
        self.task_lock = task_lock
        self.ctrl = ctrl
        self.out = out
        self.epoch = -1
        self.fetcher: Any = None
        self.fetcher_error: BaseException | None = None
        self.arena = SlotArena(spec.slot_prefix, spec.worker_id, spec.slot_budget)

    def send(self, msg: tuple[Any, ...]) -> None:
        self.out.send_bytes(pickle.dumps(msg, protocol=_PROTOCOL))

    def setup(self) -> bool:
        spec = self.spec
        _torch_worker._worker_info = _torch_worker.WorkerInfo(
            id=spec.worker_id, num_workers=spec.num_workers, seed=spec.seed, dataset=self.dataset
        )
        seed_all(spec.seed)
        _collate.install(self.arena)
        if not spec.iterable:
            self.fetcher = _fetch._MapDatasetFetcher(
                self.dataset, spec.auto_collation, self.collate_fn, spec.drop_last
            )
        if self.worker_init_fn is not None:
            try:
                self.worker_init_fn(spec.worker_id)
            except BaseException as exc:
                self.send(("F", spec.worker_id, pack_exception(exc, "running `worker_init_fn`")))
                return False
        return True

    def start_epoch(self, msg: tuple[Any, ...]) -> None:
        _, epoch, changes, set_epoch = msg
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
                self.fetcher = _fetch._IterableDatasetFetcher(
                    self.dataset, self.spec.auto_collation, self.collate_fn, self.spec.drop_last
                )
            except Exception as exc:
                self.fetcher_error = exc

    def catch_up(self, epoch: int) -> bool:
        """Apply control messages until epoch ``epoch`` has started; False on stop."""
        while self.epoch != epoch:
            raw = self.ctrl.recv_bytes()
            if raw == STOP:
                return False
            self.start_epoch(pickle.loads(raw))
        return True

    def run_task(self, msg: tuple[Any, ...]) -> None:
        _, epoch, idx, seed, index = msg
        t0 = time.perf_counter()
        seed_all(seed)
        arena = self.arena
        try:
            if self.fetcher_error is not None:
                # Reported once; the worker then counts as exhausted for this epoch.
                error, self.fetcher_error = self.fetcher_error, None
                raise error
            if self.fetcher is None:
                raise StopIteration
            arena.begin()
            batch = self.fetcher.fetch(index)
            enc = encode(batch, arena)
            del batch
        except StopIteration:
            self.send(("Z", epoch, idx, self.spec.worker_id))
            return
        except Exception as exc:
            arena.current = None
            self.send(
                (
                    "X",
                    epoch,
                    idx,
                    self.spec.worker_id,
                    pack_exception(exc, "loading the samples at indices"),
                )
            )
            return
        busy = time.perf_counter() - t0
        self.send(
            (
                "D",
                epoch,
                idx,
                self.spec.worker_id,
                busy,
                enc.slot,
                arena.take_retired(),
                enc.payload,
                enc.fallback,
            )
        )

    def loop(self) -> None:
        iterable = self.spec.iterable
        while True:
            if iterable:
                raw = self.ctrl.recv_bytes()
            else:
                with self.task_lock:
                    raw = self.task_reader.recv_bytes()
            if raw == STOP:
                return
            msg = pickle.loads(raw)
            if msg[0] == "E":
                self.start_epoch(msg)
                continue
            if msg[1] != self.epoch and not self.catch_up(msg[1]):
                return
            self.run_task(msg)


def worker_main(
    spec: WorkerSpec, payload: Any, task_reader: Any, task_lock: Any, ctrl: Any, out: Any
) -> None:
    """Entry point of a worker process."""
    # Ctrl-C is the main process's to handle; it then stops the workers.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    threading.Thread(
        target=_watch_parent, args=(os.getppid(),), daemon=True, name="stoker-parent-watch"
    ).start()
    try:
        from torch.utils.data._utils import signal_handling

        signal_handling._set_worker_signal_handlers()
    except Exception:
        pass
    _cap_threads(spec.threads)
    worker: _Worker | None = None
    try:
        worker = _Worker(spec, payload, task_reader, task_lock, ctrl, out)
        if worker.setup():
            worker.loop()
    except (EOFError, BrokenPipeError, KeyboardInterrupt):
        pass
    except BaseException as exc:
        try:
            out.send_bytes(
                pickle.dumps(
                    ("F", spec.worker_id, pack_exception(exc, "starting")), protocol=_PROTOCOL
                )
            )
        except Exception:
            pass
    finally:
        if worker is not None:
            worker.arena.close()
