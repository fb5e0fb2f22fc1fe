"""What the multi-worker iterator does with each worker reply.

A reply is one tuple, its kind first:

* ``"D"``: a batch loaded (its header names the shared-memory slot holding the batch's
  bytes; a thread's reply carries the batch itself);
* ``"X"``: a batch that raised; ``"K"``: a batch of which nothing could be loaded (tolerant
  ``on_error`` policies);
* ``"Z"``: an iterable worker's stream ended; ``"Q"``: a batch given up (a later epoch
  started, or the handover to threads);
* ``"A"``: a worker is ready; ``"R"``: a worker retired; ``"F"``: a worker failed to start
  (its ``worker_init_fn`` raised).

Replies of an abandoned epoch, and duplicates after a restart, are discarded and their slots
released. The rest complete their batch in the task book, which hands batches out (in order
unless ``in_order=False``). A batch is delivered as views of its slot. Its failures (and those
of batches skipped because every sample failed) count against the loader's ``on_error`` limit
when delivery reaches it, so ``loader.failures`` is in task order whichever worker was first.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

from torch.utils.data._utils.pin_memory import pin_memory as _pin_memory

from stoker.faults import FailureTally
from stoker.transport import decode, unlink_owned, warn_no_room
from stoker.workers._errors import unpack_exception
from stoker.workers._loop import NO_ROOM, SPILLED
from stoker.workers._process import worker_pid
from stoker.workers._threads import THREAD_REPLY_FIELDS

__all__ = ["ReplyMixin"]


class ReplyMixin:
    """Reply handling and delivery for :class:`stoker.loader._iterator.MultiWorkerIterator`."""

    # Provided by the iterator (and the handover mixin: _handover, _take_back).
    _pool: Any
    _book: Any
    _backend: str
    _epoch: int
    _workers: Any
    _ready: set[int]
    _slots: Any
    _scaler: Any
    _state: Any
    _handover: str | None
    _fast_forward: set[int]
    _active: list[bool]
    _worker_batches: Any
    _worker_busy: Any
    _tally: FailureTally
    _fallbacks: int
    _warned_no_room: bool
    _spilled: int
    _auto_collation: bool
    _pin_memory: bool
    _pin_memory_device: Any
    # Methods of the iterator and the handover mixin (annotations only: a stub here would
    # shadow the handover mixin's method, which comes later in the iterator's bases).
    _shutdown: Callable[[], None]
    _fill: Callable[[], None]
    _take_back: Callable[[tuple[Any, ...]], None]

    def _handle(self, msg: tuple[Any, ...]) -> None:
        kind = msg[0]
        if kind == "F":
            worker_id, packed = msg[1], msg[2]
            pid = worker_pid(self._workers[worker_id])
            self._shutdown()
            raise unpack_exception(packed, worker_id, pid, None)
        epoch, idx, wid = msg[1], msg[2], msg[3]
        if kind == "A":  # a worker finished its setup (worker_init_fn) and is ready
            self._ready.add(wid)
            return
        if kind == "R":  # a worker retired on request (num_workers="auto")
            pool = self._pool
            if pool is not None:
                if self._backend == "process":
                    self._drop_slots_of(pool, wid)
                pool.retired_worker(wid)
            if self._scaler is not None:
                self._scaler.retired()
            return
        if kind == "D":
            self._slots.forget(msg[6])
            # A batch in a slot its worker just created paid for the slot (file, mapping, the
            # first touch of every page: 40-65 ms for the bench's 40-MB large batches), a
            # one-off cost: neither the spread the prefetch depth is sized to absorb nor
            # blocking that more workers would cover (the spans that came with it).
            fresh_slot = msg[5] is not None and msg[5] not in self._slots
            if msg[5] is not None and epoch == self._epoch:
                # Map the slot now: its worker may leave (and its file go) before delivery.
                msg = (*msg, self._slots.open(msg[5]))
            self._worker_batches[wid] += 1
            # Seconds each worker spent on the batch (threads may share one), and the
            # (running, blocked) spans its workers closed meanwhile.
            work, spans = msg[4]
            for worker, seconds in work:
                self._worker_busy[worker] += seconds
            if self._scaler is not None:
                if not fresh_slot:
                    self._scaler.record_latency(sum(seconds for _, seconds in work))
                    for span in spans:
                        self._scaler.record_blocked(*span)
        if epoch != self._epoch or idx not in self._book.pending():
            self._discard(msg)  # a batch of an abandoned epoch, or a duplicate after a restart
            return
        if kind == "Q":  # given up: only for a later epoch, or for the handover to threads
            if self._handover != "drain":
                raise RuntimeError(f"stoker: a worker gave up batch {idx} of the current epoch")
            self._take_back(msg)
            return
        if idx in self._fast_forward:  # delivered before the checkpoint: drop it again
            self._fast_forward.discard(idx)
            self._discard(msg)
            if kind == "Z":
                self._active[wid] = False
            self._book.skip(idx)
            self._fill()
            return
        if kind == "Z":
            self._active[wid] = False
            if len(msg) > 4 and msg[4] is not None and self._state is not None:
                self._state.worker_states[wid] = msg[4]  # its stream's end
            self._book.skip(idx)
            self._fill()
            return
        if kind == "K":  # every sample failed: its failures count when delivery passes it
            self._book.skip(idx, (msg[4], wid))
            self._fill()
            return
        self._book.complete(idx, (msg, self._book.request(idx)))

    def _count_failures(self, got: tuple[int, Any] | None) -> None:
        """Record the failures of the tasks delivery just passed, in task order: those of
        skipped batches, then those of the batch ``got`` (if any) is about to deliver. The
        list and the limit then do not depend on which worker finished first. If the limit is
        exceeded, the batch is released and not delivered."""
        try:
            for failures, wid in self._book.passed_notes():
                self._tally.record(failures, self._epoch, wid)
            if got is not None:
                msg = got[1][0]
                if msg[0] == "D" and msg[9]:
                    self._tally.record(msg[9], self._epoch, msg[3])
        except BaseException:
            if got is not None:
                self._discard(got[1][0])
            raise

    def _drop_slots_of(self, pool: Any, worker_id: int) -> None:
        """A retired worker left the slots it had handed over: every one of its headers came
        before its goodbye and is mapped, so the files can go (the memory goes with the last
        view)."""
        pid = worker_pid(pool.processes[worker_id])
        if pid is None:
            return
        prefix = f"{pool.prefix}w{worker_id}-{pid}-"
        unlink_owned(prefix, pool.shm_dir)
        if pool.spill_dir is not None:
            unlink_owned(prefix, pool.spill_dir)
        self._slots.forget_prefix(prefix)

    def _discard(self, msg: tuple[Any, ...]) -> None:
        if msg[0] == "D" and msg[5] is not None:
            with contextlib.suppress(OSError):
                self._slots.release(msg[5])

    def _deliver(self, idx: int, reply: tuple[tuple[Any, ...], Any]) -> Any:
        msg, index = reply
        if self._state is not None:
            self._state.delivered.add(idx)
        if msg[0] == "X":
            worker_id = msg[3]
            raise unpack_exception(msg[4], worker_id, worker_pid(self._workers[worker_id]), index)
        slot, payload, fallback = msg[5], msg[7], msg[8]
        if len(msg) > 10 and msg[10] is not None and self._state is not None:
            self._state.worker_states[msg[3]] = msg[10]  # position after this batch
        if fallback in (NO_ROOM, SPILLED) and not self._warned_no_room:
            self._warned_no_room = True
            spill = getattr(self._pool, "spill_dir", None) if fallback == SPILLED else None
            warn_no_room(getattr(self._pool, "shm_dir", ""), len(payload), spill)
        self._fallbacks += fallback in (1, NO_ROOM)
        self._spilled += fallback == SPILLED
        self._tally.delivered(
            len(index) if self._auto_collation and index is not None else 1, msg[9] or ()
        )
        if len(msg) == THREAD_REPLY_FIELDS:  # a thread's batch (the backend may have changed)
            batch = payload
        else:
            batch = decode(payload, slot, self._slots, msg[11] if len(msg) > 11 else None)
        if self._pin_memory:
            batch = _pin_memory(batch, self._pin_memory_device)
        return batch
