"""Dispatch and reorder bookkeeping: every task delivered exactly once, in the right order."""

from __future__ import annotations

import re

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch.utils.data import Dataset

import stoker
from stoker.loader._dispatch import TaskBook


@st.composite
def schedules(draw):
    """A run: how many tasks, the in-flight window, and the order replies arrive in."""
    n = draw(st.integers(0, 60))
    window = draw(st.integers(1, 8))
    skips = draw(st.sets(st.integers(0, max(0, n - 1)), max_size=n // 3)) if n else set()
    seed = draw(st.randoms(use_true_random=False))
    return n, window, skips, seed


def _run(
    book: TaskBook, n: int, window: int, skips: set[int], rnd, seen: list[int] | None = None
) -> list[int]:
    """Issue tasks up to the window, answer a random in-flight one, drain; return deliveries.

    Odd skipped tasks carry a note; ``seen`` gets every task delivery passed (noted skips from
    :meth:`TaskBook.passed_notes`, then the delivery) in the order it passed them."""
    delivered: list[int] = []
    inflight: list[int] = []
    seen = [] if seen is None else seen
    while book.issued < n or inflight or book.outstanding:
        while book.issued < n and book.outstanding < window:
            inflight.append(book.issue(request=book.issued))
        if inflight:
            idx = inflight.pop(rnd.randrange(len(inflight)))
            if idx in skips:
                book.skip(idx, ("note", idx) if idx % 2 else None)
            else:
                book.complete(idx, ("reply", idx))
        while True:
            due = book.due()
            got = book.pop()
            assert due == (got is not None)  # due() says what pop() will do, skips passed
            seen.extend(note[1] for note in book.passed_notes())
            if got is None:
                break
            idx, reply = got
            assert reply == ("reply", idx)
            delivered.append(idx)
            seen.append(idx)
    return delivered


@given(schedules())
@settings(max_examples=300, deadline=None)
def test_in_order_delivers_every_task_once_in_index_order(schedule):
    n, window, skips, rnd = schedule
    book: TaskBook = TaskBook(in_order=True)
    seen: list[int] = []
    delivered = _run(book, n, window, skips, rnd, seen)
    assert delivered == [i for i in range(n) if i not in skips]
    assert book.outstanding == 0 and book.waiting == 0 and book.delivered == len(delivered)
    # A skipped task's note comes back where the task stands in the order, not on arrival.
    assert seen == [i for i in range(n) if i not in skips or i % 2]


@given(schedules())
@settings(max_examples=300, deadline=None)
def test_out_of_order_delivers_every_task_exactly_once(schedule):
    n, window, skips, rnd = schedule
    book: TaskBook = TaskBook(in_order=False)
    seen: list[int] = []
    delivered = _run(book, n, window, skips, rnd, seen)
    assert sorted(delivered) == [i for i in range(n) if i not in skips]
    assert sorted(seen) == [i for i in range(n) if i not in skips or i % 2]
    assert book.outstanding == 0


def test_reorder_buffer_holds_early_replies_until_their_turn():
    book: TaskBook = TaskBook(in_order=True)
    for i in range(3):
        book.issue(i)
    book.complete(2, "c")
    book.complete(1, "b")
    assert book.pop() is None and book.waiting == 2 and book.outstanding == 3
    book.complete(0, "a")
    assert [book.pop(), book.pop(), book.pop(), book.pop()] == [(0, "a"), (1, "b"), (2, "c"), None]


def test_answering_a_task_twice_is_an_error():
    book: TaskBook = TaskBook()
    idx = book.issue()
    book.complete(idx, "x")
    with pytest.raises(KeyError):
        book.complete(idx, "y")


class _Indexed(Dataset):
    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.tensor([i])


@given(
    size=st.integers(0, 200),
    batch_size=st.integers(1, 40),
    workers=st.integers(1, 3),
    drop_last=st.booleans(),
    shuffle=st.booleans(),
    in_order=st.booleans(),
)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")
def test_real_workers_deliver_what_torch_single_process_delivers(
    size, batch_size, workers, drop_last, shuffle, in_order
):
    ds = _Indexed(size)
    kwargs = {"batch_size": batch_size, "shuffle": shuffle, "drop_last": drop_last}
    try:
        ref = torch.utils.data.DataLoader(ds, generator=torch.Generator().manual_seed(3), **kwargs)
    except ValueError as exc:  # e.g. shuffling an empty dataset: stoker must refuse alike
        with pytest.raises(ValueError, match=re.escape(str(exc))):
            stoker.DataLoader(ds, num_workers=workers, **kwargs)
        return
    want = [b.view(-1).tolist() for b in ref]
    loader = stoker.DataLoader(
        ds,
        num_workers=workers,
        generator=torch.Generator().manual_seed(3),
        in_order=in_order,
        multiprocessing_context="fork",
        **kwargs,
    )
    got = [b.view(-1).tolist() for b in loader]
    del loader
    if in_order:
        assert got == want
    else:
        assert sorted(map(tuple, got)) == sorted(map(tuple, want))
