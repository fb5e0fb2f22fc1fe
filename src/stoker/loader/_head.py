"""The epoch's first batch, loaded while the backend probe runs (``backend="auto"`` with
``num_workers=N``; under ``num_workers="auto"`` the main process loads it where it can,
:mod:`stoker.loader._main_first`).

With ``backend="auto"`` the first ``iter()`` probes the dataset in a forked child before a
worker starts (:mod:`stoker.autotune._probe`), and the workers started once it answered: the
first batch came after the probe, the pool's start and the batch's own loading, one after the
other (2-core VM, medians: jpeg 1,111 ms against 466 ms for torch's ``num_workers=0``, large
614 against 56). Now the loader forks, right after the probe, a second child that loads the
batch the epoch starts with as a worker would (the same indices, seed and collation); where
the probe's first two samples show batches taking :data:`HEAD_MIN_BATCH_S` or more, ``iter()``
returns without waiting for the probe's answer, else the child is stopped unused (forked only
once the probe found batches slow, it started after the probe's first two samples: 150 ms of
heavytail's first batch, whose first sample is a slow one). The child keeps the training process's
priority, not the workers' lower one: the training loop waits for its batch (the probe
discounts the time its own samples wait for a core, so sharing the cores with it does not
change its answer).
The first ``next()`` returns that batch (through :mod:`stoker.transport._handoff`); the second
takes the probe's answer, which has come meanwhile, and starts the workers from batch 1. Once it
has marked slow batches, the probe goes on at the lowest priority (:data:`~stoker.autotune.
_probe.PROBE_NICE_AFTER_MARK`): the rest of its measurement, threads that load at once, took a
core from the child (heavytail's first batch, medians of 7: 505 -> 451 ms). Where the batch's
samples leave the global random generators alone, the child loads it in parts side by side, one
per usable core (:mod:`stoker.loader._head_parts`).

The batch is used only where it is the one a worker would load: the child names the indices
and seed it drew before it loads, and the iterator compares them with its own first task (a
sampler with entropy of its own, or a changed generator, makes the workers load it instead);
a child that fails, meets a failed sample, or takes longer than :data:`HEAD_DEADLINE_S` leaves
the batch to the workers too, whose error then carries its type and traceback. A loader's
``timeout`` bounds the wait for the child's batch as it bounds the wait for a worker's. Not
tried with a ``worker_init_fn`` (workers run it before loading; the child would not), a
resumed epoch, an iterable dataset or a datapipe, or where there is no ``fork`` or
``memfd_create``. Loading that batch in the main process instead is not an option: what
reading opens there (an h5py file, an LMDB environment) the forked workers would inherit.
"""

from __future__ import annotations

import contextlib
import gc
import os
import pickle
import select
import signal
import socket
import threading
import time
import weakref
from typing import Any

import torch.utils.data as tud

from stoker.loader._head_parts import Helpers, die_with_parent, load_in_parts, part_count
from stoker.sampling._seeding import batch_seed, seed_all
from stoker.transport._handoff import open_arena, pack, unpack

__all__ = ["HEAD_DEADLINE_S", "HEAD_MIN_BATCH_S", "HeadStart", "wait_for_slow"]

# A batch the probe's warm-up sees taking this long or more is taken from the head start, the
# workers starting at the next batch: below it the child is stopped, and the workers start at
# iter() (or the main process loads), so that the batches after the first are not held up by
# a pool that starts a batch late.
HEAD_MIN_BATCH_S = 0.025
# Longest the iterator waits for the child to name the batch it loads (it does so before
# loading, milliseconds after its start), and for the batch itself before a worker loads it.
HEAD_CLAIM_S = 2.0
HEAD_DEADLINE_S = 10.0
_PROTOCOL = 5
# Largest message the child sends (a first batch of about 100,000 indices); a longer one is
# cut short and read as no message (the workers load the batch).
_MSG_BYTES = 1 << 20


class HeadStart:
    """A forked child loading the epoch's first batch (the parent's handle on it).

    Made by :meth:`start`; the iterator asks :meth:`claims` whether the child loads its first
    task, then :meth:`take` for the batch, and :meth:`close` in any case.
    """

    def __init__(self, pid: int, sock: socket.socket) -> None:
        self.pid = pid
        self._sock = sock
        self.started = time.monotonic()
        self.parts = 1  # parts the batch taken was loaded in side by side (_head_parts)
        # Bytes the batch taken holds in its memory file, header included, as a worker's
        # slot would (0: none taken, or no tensor in it): the workers' first slot size.
        self.slot_bytes = 0
        # Messages read ahead (poll_slow), in order, with the descriptors they passed.
        self._inbox: list[tuple[tuple[Any, ...], list[int]]] = []
        self._gone = False  # the child's end of the socket is closed
        self._reap = weakref.finalize(self, _end_child, pid, sock, self._inbox)

    @staticmethod
    def eligible(loader: Any) -> bool:
        """Whether a head start can load ``loader``'s next first batch as a worker would."""
        dataset = loader.dataset
        return (
            hasattr(os, "fork")
            and hasattr(os, "memfd_create")
            and hasattr(socket, "send_fds")
            and not isinstance(dataset, (tud.IterableDataset, tud.MapDataPipe))
            and loader.worker_init_fn is None
            and getattr(loader, "_resume_state", None) is None
        )

    @classmethod
    def start(cls, loader: Any) -> HeadStart | None:
        """Fork the child (it starts loading at once); None if it cannot be started."""
        try:
            parent_sock, child_sock = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        except OSError:
            return None
        main_thread = threading.current_thread() is threading.main_thread()
        try:
            pid = os.fork()
        except OSError:
            parent_sock.close()
            child_sock.close()
            return None
        if pid == 0:  # pragma: no cover - child
            parent_sock.close()
            _child(loader, child_sock, main_thread)
        child_sock.close()
        return cls(pid, parent_sock)

    def claims(self, index: Any, seed: int) -> bool:
        """Whether the child loads the task with ``index`` and ``seed`` (the epoch's first).
        Closes the child when it does not."""
        msg = self._receive(HEAD_CLAIM_S)
        claim: tuple[Any, ...] = msg[0] if msg is not None else ()
        if len(claim) == 3 and claim[0] == "claim" and claim[2] == seed:
            with contextlib.suppress(Exception):  # an index that cannot be pickled
                if claim[1] == pickle.dumps(index, protocol=_PROTOCOL):
                    return True
        self.close()
        return False

    def take(self, limit_s: float = 0.0) -> Any:
        """The batch (views of the child's memory file); None when the child gave none by
        :data:`HEAD_DEADLINE_S` after its start (or within ``limit_s`` seconds, if given),
        failed, or met a failed sample. Closes the child, except after a batch: it exits on
        its own then, and waiting for it to (tearing down its memory took 16 ms of large's
        first batch) is left to a later :meth:`close`."""
        batch = None
        try:
            left = self.started + HEAD_DEADLINE_S - time.monotonic()
            if limit_s > 0:
                left = min(left, limit_s)
            msg = self._receive(max(0.0, left))
            if msg is None:
                return None
            found, fds = msg
            if len(found) != 6 or found[0] != "batch" or len(fds) != 1:
                for fd in fds:
                    os.close(fd)
                return None
            slot, offset, parts = found[1], found[2], found[4]
            self.parts = parts if isinstance(parts, int) and parts >= 1 else 1
            # (the data ends where pack() put the header)
            self.slot_bytes = offset if slot is not None and isinstance(offset, int) else 0
            try:
                batch = unpack(fds[0], *found[1:4])
            except Exception:  # (a worker loads the batch again, and raises what it raises)
                return None
            finally:
                os.close(fds[0])
            return batch
        finally:
            if batch is None:
                self.close()

    def fileno(self) -> int:
        """The socket's descriptor (readable when the child sent something or is gone)."""
        return self._sock.fileno()

    def poll_slow(self, min_s: float) -> bool | None:
        """Read what the child sent so far (kept for :meth:`claims` and :meth:`take`): True
        once it sent a batch that took ``min_s`` or more to load, False once it cannot (a
        quicker batch, a failure, its exit), None while it loads."""
        while self._fetch(0.0):
            pass
        for msg, _ in self._inbox:
            if msg[:1] == ("batch",):
                return len(msg) == 6 and isinstance(msg[5], float) and msg[5] >= min_s
            if msg[:1] != ("claim",):
                return False
        return False if self._gone else None

    def _receive(self, timeout: float) -> tuple[Any, list[int]] | None:
        """The child's next message and the descriptors it passed; None on a timeout or
        once the child is gone."""
        if not self._inbox and not self._fetch(timeout):
            return None
        return self._inbox.pop(0)

    def _fetch(self, timeout: float) -> bool:
        """Read the child's next message into the inbox; False on a timeout or once the
        child is gone."""
        if self._gone:
            return False
        try:
            if not select.select([self._sock], [], [], timeout)[0]:
                return False
            data, fds, _, _ = socket.recv_fds(self._sock, _MSG_BYTES, 1)
        except OSError:
            self._gone = True
            return False
        if not data:
            self._gone = True
            return False
        try:
            # The child is a fork of this process, started by it: its message is this
            # process's own data, not input from elsewhere.
            msg = pickle.loads(data)
        except Exception:  # cut short: longer than _MSG_BYTES
            msg = ()
        if not isinstance(msg, tuple):
            msg = ()
        self._inbox.append((msg, list(fds)))
        return True

    def close(self) -> None:
        """Stop the child if it still runs, reap it, and drop anything it sent."""
        self._reap()


def wait_for_slow(probe: Any, head: HeadStart, min_s: float) -> bool:
    """Whether batches are slow: the probe's mark, or the head start's batch itself taking
    ``min_s`` or more, whichever comes first; False once the probe answered without a mark.

    The probe's warm-up may begin with a slow sample while the child's batch holds none: on
    heavytail in a shuffled order the child had its batch 70 ms before the probe's mark.
    """
    watch_head = True
    while True:
        ready = select.select(
            [probe.fileno(), *([head.fileno()] if watch_head else [])], [], [], probe.left()
        )[0]
        if not ready or probe.fileno() in ready:
            return bool(probe.wait_slow())  # (past its deadline it stops the child: False)
        slow = head.poll_slow(min_s)
        if slow:
            return True
        watch_head = slow is None


def _end_child(pid: int, sock: socket.socket, inbox: list[tuple[Any, list[int]]]) -> None:
    with contextlib.suppress(OSError):
        os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(OSError):
        os.waitpid(pid, 0)
    for _, fds in inbox:  # read ahead and never taken
        for fd in fds:
            with contextlib.suppress(OSError):
                os.close(fd)
    inbox.clear()
    # A batch sent and never read holds its memory file while the socket lives, and the
    # workers forked since hold the socket: close what is queued.
    with contextlib.suppress(OSError):
        sock.setblocking(False)
        while True:
            data, fds, _, _ = socket.recv_fds(sock, _MSG_BYTES, 1)
            for fd in fds:
                os.close(fd)
            if not data:
                break
    sock.close()


def _child(loader: Any, sock: socket.socket, main_thread: bool) -> None:  # pragma: no cover
    """Load the epoch's first batch as a worker would, send it, and exit (never returns)."""
    code = 0
    helpers: Helpers | None = None
    try:
        if main_thread:  # (from another thread the signal would come when *it* exits)
            die_with_parent()
        gc.freeze()  # inherited objects are never collected here (pages stay shared)
        import torch

        # A forked child must not use the OpenMP pool its parent used (libgomp is not
        # fork-safe); workers load with one thread too.
        torch.set_num_threads(1)
        workers = loader.num_workers
        # The iterator torch's num_workers=0 would make: it draws the base seed and the
        # sampler's first indices as the parent's iterator is about to.
        loader.num_workers = 0
        loader.pin_memory = False
        loader.device = None
        loader._inline_ahead = False
        from stoker.loader._inline import InlineIterator

        it = InlineIterator(loader)
        index = it._next_index()
        seed = batch_seed(it._epoch_seed, 0)
        _send(sock, ("claim", pickle.dumps(index, protocol=_PROTOCOL), seed))
        from torch.utils.data._utils import worker as torch_worker

        torch_worker._worker_info = torch_worker.WorkerInfo(
            id=0, num_workers=workers, seed=int(it._base_seed), dataset=loader.dataset
        )
        # Into the hand-off file, as a worker collates into its slot (not the fresh
        # shared-memory segment torch's collate would make in a worker); ordinary memory
        # where no file can be made, copied into one by pack() then.
        from stoker.workers import _collate

        arena = open_arena()
        _collate.install(arena)
        started = time.perf_counter()
        seed_all(seed)
        fetcher, parts = it._fetcher, 1
        failures: list[Any] = []
        # Side by side where the batch's samples allow it (stoker.loader._head_parts).
        count = part_count(len(index)) if fetcher.one_by_one and isinstance(index, list) else 1
        if count > 1:
            samples, parts, helpers = load_in_parts(fetcher.dataset, index, count)
            batch = fetcher.collate_fn(samples)
            del samples
        else:
            batch, failures = fetcher.fetch(index, seed)
        packed = None if failures else pack(batch, arena)
        if packed is None:
            _send(sock, ("failed",))
        else:
            fd, place = packed
            _send(sock, ("batch", *place, parts, time.perf_counter() - started), fd)
    except BaseException:
        code = 1
    finally:
        if helpers is not None:  # after the batch is sent: reaping waits for their exit
            with contextlib.suppress(BaseException):
                helpers.close()
        os._exit(code)


def _send(sock: socket.socket, msg: tuple[Any, ...], fd: int | None = None) -> None:
    data = pickle.dumps(msg, protocol=_PROTOCOL)
    if fd is None:
        sock.send(data)  # (a packet socket sends a message whole or not at all)
    else:
        socket.send_fds(sock, [data], [fd])
