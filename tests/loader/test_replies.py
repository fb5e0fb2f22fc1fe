"""The reply handler (stoker.loader._replies) alone: replies booked into an epoch's task book
and delivered in task order, stale and duplicate replies dropped, skips and stream ends
freeing a place for dispatch, failures counted in task order. No loader, no workers."""

from __future__ import annotations

import pytest

from stoker.errors import FailureLimitError
from stoker.faults import FailurePolicy, FailureTally
from stoker.loader._dispatch import TaskBook
from stoker.loader._epoch import EpochContext
from stoker.loader._replies import ReplyHandler
from stoker.sampling._resume import EpochState
from stoker.transport import SlotMap
from stoker.workers._messages import (
    BatchError,
    BatchSkipped,
    GaveUp,
    StreamEnd,
    ThreadBatch,
)

WORK = ((0, 0.01),)


def _handler(on_error: str = "skip", max_failures: int | None = None) -> ReplyHandler:
    tally = FailureTally(FailurePolicy(on_error, max_failures), [])  # type: ignore[arg-type]
    return ReplyHandler(SlotMap(), tally, auto_collation=True, pin_device=None)


def _epoch(tasks: int, epoch: int = 3, workers: int = 2) -> EpochContext:
    ctx = EpochContext(epoch, 99, TaskBook(), EpochState(epoch, None), workers=workers)
    for i in range(tasks):
        ctx.book.issue([2 * i, 2 * i + 1])
    return ctx


def _batch(idx: int, epoch: int = 3, failures: list | None = None) -> ThreadBatch:
    return ThreadBatch(epoch, idx, 0, WORK, (), f"batch {idx}", failures or [])


def _deliver_all(handler: ReplyHandler, ctx: EpochContext) -> list[object]:
    out = []
    while (got := ctx.book.pop()) is not None:
        handler.count_failures(ctx, got)
        out.append(handler.deliver(ctx, got[0], got[1], None))
    return out


def test_batches_arriving_out_of_order_are_delivered_in_task_order() -> None:
    handler, ctx = _handler(), _epoch(3)
    for idx in (2, 0, 1):
        assert handler.take(_batch(idx), ctx, None, None) is False  # nothing freed
    assert _deliver_all(handler, ctx) == ["batch 0", "batch 1", "batch 2"]
    assert ctx.state is not None and ctx.state.delivered == {0, 1, 2}
    assert handler.worker_batches[0] == 3 and handler.worker_busy[0] == pytest.approx(0.03)
    assert handler.tally.samples == 6


def test_replies_of_another_epoch_and_duplicates_are_dropped() -> None:
    handler, ctx = _handler(), _epoch(2)
    handler.take(_batch(0, epoch=2), ctx, None, None)  # an abandoned epoch's
    handler.take(_batch(0), ctx, None, None)
    handler.take(_batch(0), ctx, None, None)  # a duplicate after a restart
    assert ctx.book.outstanding == 2 and list(ctx.book.pending()) == [1]
    assert _deliver_all(handler, ctx) == ["batch 0"]


def test_a_skipped_batch_frees_a_place_and_its_failures_count_in_task_order() -> None:
    handler, ctx = _handler(), _epoch(2)
    failure = ([4], "ValueError", "bad", None)
    assert handler.take(_batch(1, failures=[failure]), ctx, None, None) is False
    assert handler.take(BatchSkipped(3, 0, 1, [failure]), ctx, None, None) is True
    assert _deliver_all(handler, ctx) == ["batch 1"]
    assert [f.worker_id for f in handler.tally.log] == [1, 0]  # the skipped task came first


def test_the_failure_limit_releases_the_batch_and_raises() -> None:
    handler, ctx = _handler(max_failures=0), _epoch(1)
    handler.take(_batch(0, failures=[([0], "ValueError", "bad", None)]), ctx, None, None)
    got = ctx.book.pop()
    with pytest.raises(FailureLimitError):
        handler.count_failures(ctx, got)


def test_a_stream_end_retires_the_stream_and_keeps_its_position() -> None:
    handler, ctx = _handler(), _epoch(1)
    assert handler.take(StreamEnd(3, 0, 1, {"at": 7}), ctx, None, None) is True
    assert ctx.active == [True, False] and ctx.book.outstanding == 0
    assert ctx.state is not None and ctx.state.worker_states == {1: {"at": 7}}


def test_a_batch_to_fast_forward_is_dropped_again() -> None:
    handler, ctx = _handler(), _epoch(2)
    ctx.fast_forward.add(0)
    assert handler.take(_batch(0), ctx, None, None) is True
    handler.take(_batch(1), ctx, None, None)
    assert _deliver_all(handler, ctx) == ["batch 1"] and not ctx.fast_forward


def test_an_error_reply_raises_at_delivery_with_the_workers_id() -> None:
    from stoker.workers._errors import pack_exception

    handler, ctx = _handler(on_error="raise"), _epoch(1)
    try:
        raise KeyError("missing")
    except KeyError as exc:
        packed = pack_exception(exc, "loading the samples at indices", inline=True)
    handler.take(BatchError(3, 0, 1, packed), ctx, None, None)
    with pytest.raises(KeyError) as info:
        _deliver_all(handler, ctx)
    assert any("worker 1" in note.lower() for note in getattr(info.value, "__notes__", []))


def test_a_batch_given_up_outside_a_handover_is_a_bug_not_a_silent_loss() -> None:
    handler, ctx = _handler(), _epoch(1)
    with pytest.raises(RuntimeError, match="gave up batch 0"):
        handler.take(GaveUp(3, 0, 1), ctx, None, None)
