"""What the multi-worker iterator does with each worker reply.

A reply is one of the records of :mod:`stoker.workers._messages`: a batch loaded (in a
shared-memory slot, or a thread's object), a batch that raised or of which nothing could be
loaded, an iterable worker's stream that ended, a batch given up (a later epoch started, or the
handover to threads), or a worker that is ready, retired or failed to start.

Replies of an abandoned epoch, and duplicates after a restart, are discarded and their slots
released. The rest complete their batch in the task book, which hands batches out (in order
unless ``in_order=False``). A batch is delivered as views of its slot. Its failures (and those
of batches skipped because every sample failed) count against the loader's ``on_error`` limit
when delivery reaches it, so ``loader.failures`` is in task order whichever worker was first.
"""

from __future__ import annotations

import collections
import contextlib
from typing import Any

import numpy as np
import torch
from torch.utils._pytree import tree_leaves
from torch.utils.data._utils.pin_memory import pin_memory as _pin_memory

from stoker.autotune._scaling import AutoScaler
from stoker.faults import FailureTally
from stoker.loader._epoch import Arrived, EpochContext
from stoker.loader._stats import WorkerStats
from stoker.loader._switch import Handover
from stoker.transport import SlotMap, decode, unlink_owned, warn_no_room
from stoker.workers import WorkerPool
from stoker.workers._backend import WorkerBackend
from stoker.workers._errors import unpack_exception
from stoker.workers._loop import NO_ROOM, SPILLED
from stoker.workers._messages import (
    BatchError,
    BatchSkipped,
    GaveUp,
    Reply,
    SlotBatch,
    StreamEnd,
    TaskReply,
    ThreadBatch,
)
from stoker.workers._process import worker_pid
from stoker.workers._status import IDLE

__all__ = ["ReplyHandler", "worker_stats"]


class ReplyHandler:
    """Books worker replies into the epoch's task book and turns them into batches.

    Args:
        slots: the shared-memory slots batches are mapped from.
        tally: the loader's failure count (``on_error``).
        auto_collation: batches of samples (False: ``batch_size=None``).
        pin_device: pin delivered batches for this device ("": the default accelerator);
            None: no pinning.

    Attributes:
        worker_batches: batches each worker loaded (by worker id).
        worker_busy: seconds each worker spent loading.
        fallbacks: batches that crossed the pipe for want of a slot.
        spilled: batches delivered from slots in the spill directory.
    """

    def __init__(
        self,
        slots: SlotMap,
        tally: FailureTally,
        *,
        auto_collation: bool,
        pin_device: str | None,
    ) -> None:
        self.slots = slots
        self.tally = tally
        self.worker_batches: collections.Counter[int] = collections.Counter()
        self.worker_busy: collections.defaultdict[int, float] = collections.defaultdict(float)
        self.fallbacks = 0
        self.spilled = 0
        self._warned_no_room = False
        self._auto_collation = auto_collation
        self._pin_device = pin_device

    def take(
        self,
        msg: TaskReply,
        ctx: EpochContext,
        scaler: AutoScaler | None,
        handover: Handover | None,
    ) -> bool:
        """Book a reply to a task; returns whether the task freed a place for dispatch
        (a skip: nothing to deliver). Replies of an abandoned epoch, and duplicates after a
        restart, are discarded and their slots released."""
        mapping = None
        if isinstance(msg, (SlotBatch, ThreadBatch)):
            mapping = self._loaded(msg, ctx.epoch, scaler)
        if msg.epoch != ctx.epoch or msg.idx not in ctx.book.pending():
            self.discard(msg)
            return False
        idx, book = msg.idx, ctx.book
        if isinstance(msg, GaveUp):  # only for a later epoch, or for the handover to threads
            if handover is None or not handover.draining:
                raise RuntimeError(f"stoker: a worker gave up batch {idx} of the current epoch")
            handover.take_back(msg, book.request(idx), ctx.seed)
            return False
        if idx in ctx.fast_forward:  # delivered before the checkpoint: drop it again
            ctx.fast_forward.discard(idx)
            self.discard(msg)
            if isinstance(msg, StreamEnd):
                ctx.active[msg.worker_id] = False
            book.skip(idx)
            return True
        if isinstance(msg, StreamEnd):
            ctx.active[msg.worker_id] = False
            if msg.position is not None and ctx.state is not None:
                ctx.state.worker_states[msg.worker_id] = msg.position  # its stream's end
            book.skip(idx)
            return True
        if isinstance(msg, BatchSkipped):  # its failures count when delivery passes it
            book.skip(idx, (msg.failures, msg.worker_id))
            return True
        book.complete(idx, Arrived(msg, book.request(idx), mapping))
        return False

    def _loaded(self, msg: SlotBatch | ThreadBatch, epoch: int, scaler: AutoScaler | None) -> Any:
        """Record a loaded batch's work; returns its slot's mapping (None: no slot)."""
        mapping = None
        fresh_slot = False
        if isinstance(msg, SlotBatch):
            self.slots.forget(msg.retired)
            # A batch in a slot its worker just created paid for the slot (file, mapping, the
            # first touch of every page), a one-off cost: neither the spread the prefetch
            # depth is sized to absorb nor blocking that more workers would cover.
            fresh_slot = msg.slot is not None and msg.slot not in self.slots
            if msg.slot is not None and msg.epoch == epoch:
                # Map the slot now: its worker may leave (and its file go) before delivery.
                mapping = self.slots.open(msg.slot)
        self.worker_batches[msg.worker_id] += 1
        # Seconds each worker spent on the batch (threads may share one), and the
        # (running, blocked) spans its workers closed meanwhile.
        for worker, seconds in msg.work:
            self.worker_busy[worker] += seconds
        if scaler is not None and not fresh_slot:
            scaler.record_latency(sum(seconds for _, seconds in msg.work))
            for span in msg.spans:
                scaler.record_blocked(*span)
        return mapping

    def count_failures(self, ctx: EpochContext, got: tuple[int, Arrived] | None) -> None:
        """Record the failures of the tasks delivery just passed, in task order: those of
        skipped batches, then those of the batch ``got`` (if any) is about to deliver. The
        list and the limit then do not depend on which worker finished first. If the limit is
        exceeded, the batch is released and not delivered."""
        try:
            for failures, wid in ctx.book.passed_notes():
                self.tally.record(failures, ctx.epoch, wid)
            if got is not None:
                msg = got[1].reply
                if isinstance(msg, (SlotBatch, ThreadBatch)) and msg.failures:
                    self.tally.record(msg.failures, ctx.epoch, msg.worker_id)
        except BaseException:
            if got is not None:
                self.discard(got[1].reply)
            raise

    def drop_slots_of(self, pool: WorkerPool, worker_id: int) -> None:
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
        self.slots.forget_prefix(prefix)

    def delivery_stats(self, ctx: EpochContext) -> dict[str, Any]:
        """The delivery side of ``stats()`` for the epoch ``ctx``: batches and samples
        delivered, waits, the reorder buffer, slots, and failures."""
        return {
            "epoch": max(0, ctx.epoch),
            "batches": ctx.book.delivered,
            "samples": self.tally.samples,
            "wait_s": ctx.wait_s,
            "outstanding": ctx.book.outstanding,
            "reorder_depth": ctx.book.waiting,
            "slots": len(self.slots),
            "slots_in_use": self.slots.busy(),
            "slot_bytes": self.slots.nbytes,
            "fallback_batches": self.fallbacks,
            "spilled_batches": self.spilled,
            "failures": len(self.tally.log),
        }

    def discard(self, msg: Reply) -> None:
        """Release what an undelivered reply holds (its slot)."""
        if isinstance(msg, SlotBatch) and msg.slot is not None:
            with contextlib.suppress(OSError):
                self.slots.release(msg.slot)

    def deliver(
        self, ctx: EpochContext, idx: int, arrived: Arrived, pool: WorkerBackend | None
    ) -> Any:
        """The batch of task ``idx``, as views of its slot (or a thread's object), pinned if
        asked; a batch that raised raises here, with its worker's id and pid."""
        msg, index = arrived.reply, arrived.request
        if ctx.state is not None:
            ctx.state.delivered.add(idx)
        if isinstance(msg, BatchError):
            wid = msg.worker_id
            pid = worker_pid(pool.processes[wid]) if pool is not None else None
            raise unpack_exception(msg.error, wid, pid, index)
        self.tally.delivered(
            len(index) if self._auto_collation and index is not None else 1, msg.failures or ()
        )
        if isinstance(msg, ThreadBatch):  # (the backend may have changed since it was asked)
            batch = msg.batch
        else:  # views of its slot
            batch = decode(msg.payload, msg.slot, self.slots, arrived.mapping)
            if isinstance(msg, SlotBatch):
                self._note_slot(msg, ctx, pool, batch)
        if self._pin_device is not None:
            batch = _pin_memory(batch, self._pin_device)
        return batch

    def _note_slot(
        self, msg: SlotBatch, ctx: EpochContext, pool: WorkerBackend | None, batch: Any
    ) -> None:
        """Keep a process worker's stream position; count and warn about batches that found
        no room in shared memory (``batch``, decoded, gives the size the warning states)."""
        if msg.position is not None and ctx.state is not None:
            ctx.state.worker_states[msg.worker_id] = msg.position  # after this batch
        fallback = msg.fallback
        if fallback in (NO_ROOM, SPILLED) and not self._warned_no_room:
            self._warned_no_room = True
            spill = getattr(pool, "spill_dir", None) if fallback == SPILLED else None
            warn_no_room(getattr(pool, "shm_dir", ""), _array_bytes(batch), spill)
        self.fallbacks += fallback in (1, NO_ROOM)
        self.spilled += fallback == SPILLED


def _array_bytes(batch: Any) -> int:
    """Bytes of the tensors and arrays in ``batch`` (what a slot holds; the header's own size is
    a few hundred bytes)."""
    total = 0
    for leaf in tree_leaves(batch):
        if isinstance(leaf, torch.Tensor):
            total += leaf.numel() * leaf.element_size()
        elif isinstance(leaf, np.ndarray):
            total += leaf.nbytes
    return total


def worker_stats(
    worker_id: int,
    handle: Any,
    pool: WorkerBackend | None,
    ctx: EpochContext,
    replies: ReplyHandler,
    elapsed: float,
) -> WorkerStats:
    """One worker's part of ``stats()``: what it loaded, and the batch it loads now."""
    batches, busy_s = replies.worker_batches[worker_id], replies.worker_busy[worker_id]
    alive = pool is not None and not pool.closed and _alive(handle)
    current: tuple[object, ...] | None = None
    since = None
    if alive and pool is not None:
        epoch, task, started = pool.status.task(worker_id)
        if task != IDLE and epoch == ctx.epoch:
            request = ctx.book.request(task)
            current = tuple(request) if isinstance(request, list) else (request,)
            since = started
    return WorkerStats(
        worker_id=worker_id,
        pid=worker_pid(handle),
        alive=alive,
        batches=batches,
        busy_s=busy_s,
        busy_fraction=min(1.0, busy_s / elapsed),
        current_indices=current,
        busy_since=since,
    )


def _alive(proc: Any) -> bool:
    try:
        return bool(proc.is_alive())
    except (ValueError, AttributeError):
        return False
