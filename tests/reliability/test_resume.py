"""Exact mid-epoch resume: ``loader.state_dict()`` / ``loader.load_state_dict()``.

Promises (issue 4): for map-style datasets with a sampler whose order comes from its
``generator`` (or a sampler that implements ``state_dict``), a loader resumed from a checkpoint
delivers exactly the batches the interrupted one had not delivered yet, with the same contents
and random draws, then the following epochs as an uninterrupted run would: across persistent
workers, across epochs, twice within an epoch, at the end of an epoch, with ``in_order=False``,
and with a different ``num_workers`` (0, 1, 2, 3) or backend (process, thread) after the
resume. Iterable datasets without
``state_dict`` fast-forward with a warning.

The reference is an uninterrupted run. Between epochs stoker follows torch's rule: a loader
with persistent workers (stoker's default with ``num_workers > 0``) takes its seed from the
``generator`` once, a non-persistent one (``num_workers=0`` included) takes one per epoch. So the
first epoch is the same for every configuration, and a resumed epoch is exact for any
``num_workers``; the epochs after it follow the resumed loader's own rule (``reference(True)``
for persistent loaders, ``reference(False)`` for ``num_workers=0``). Every checkpoint goes through
``torch.save``/``torch.load`` as bytes, as a real checkpoint would. A Hypothesis state machine
interleaves iterating, checkpointing, killing the loader and resuming in a new one.
"""

from __future__ import annotations

import io
import warnings
from collections import Counter
from typing import Any

import pytest
import torch
import torch.utils.data as tud
from _faulty import RandomDataset
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
)

import stoker

pytestmark = [
    pytest.mark.timeout(240),
    pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning"),
]

N = 30
BATCH = 4  # 8 batches per epoch, the last one of 2 samples
SEED = 11
EPOCHS = 4

Batch = tuple[tuple[int, int], ...]


def _loader(workers: int, in_order: bool = True, **kwargs: Any) -> stoker.DataLoader:
    if workers:
        kwargs.setdefault("multiprocessing_context", "fork")
    kwargs.setdefault("shuffle", True)
    kwargs.setdefault("generator", torch.Generator().manual_seed(SEED))
    return stoker.DataLoader(
        kwargs.pop("dataset", RandomDataset(N)),
        batch_size=BATCH,
        num_workers=workers,
        in_order=in_order,
        **kwargs,
    )


def _rows(batch: Any) -> Batch:
    return tuple(zip(batch[0].tolist(), batch[1].tolist(), strict=True))


def _checkpoint(loader: stoker.DataLoader) -> dict[str, Any]:
    """``loader.state_dict()`` after a round trip through ``torch.save`` bytes."""
    buf = io.BytesIO()
    torch.save({"loader": loader.state_dict()}, buf)
    return torch.load(io.BytesIO(buf.getvalue()), weights_only=False)["loader"]


def _take(it: Any, k: int) -> list[Batch]:
    return [_rows(next(it)) for _ in range(k)]


_REFERENCE: dict[bool, list[list[Batch]]] = {}


def reference(persistent: bool = True) -> list[list[Batch]]:
    """Batches of an uninterrupted run, per epoch (computed once per rule).

    ``persistent=True``: a loader with persistent workers (``num_workers=1``);
    ``persistent=False``: ``num_workers=0``.
    """
    if persistent not in _REFERENCE:
        loader = _loader(1 if persistent else 0)
        _REFERENCE[persistent] = [[_rows(b) for b in loader] for _ in range(EPOCHS)]
        del loader
    return _REFERENCE[persistent]


def indices(batches: list[Batch]) -> list[list[int]]:
    return [[i for i, _ in b] for b in batches]


def test_reference_is_a_real_shuffle() -> None:
    for persistent in (True, False):
        ref = reference(persistent)
        assert len(ref[0]) == 8
        for epoch in ref:
            assert Counter(i for b in epoch for i, _ in b) == Counter(range(N))
        assert ref[0] != ref[1], "epochs must differ for the resume tests to mean anything"
    # The first epoch does not depend on the rule; later ones do (as in torch).
    assert reference(True)[0] == reference(False)[0]
    assert reference(True)[1] != reference(False)[1]


# -- explicit cases --------------------------------------------------------------------------


@pytest.mark.parametrize(("before", "after"), [(0, 2), (2, 0), (1, 3), (3, 1), (2, 2), (0, 0)])
def test_mid_epoch_resume_with_another_worker_count(before: int, after: int) -> None:
    ref = reference(after > 0)
    loader = _loader(before)
    it = iter(loader)
    got = _take(it, 3)
    state = _checkpoint(loader)
    del it, loader  # the run dies
    resumed = _loader(after)
    resumed.load_state_dict(state)
    rest = [_rows(b) for b in resumed]
    nxt = [_rows(b) for b in resumed]
    del resumed
    assert got + rest == ref[0]
    assert nxt == ref[1]


@pytest.mark.parametrize(("before", "after"), [("process", "thread"), ("thread", "process")])
def test_mid_epoch_resume_with_another_backend(before: str, after: str) -> None:
    """Batches (sample indices) are exact across backends. The thread backend shares the
    global random generators between threads (documented in ``stoker.workers._threads``),
    so the random draws are compared only where processes produced them."""
    ref = reference()
    loader = _loader(2, backend=before)
    it = iter(loader)
    got = _take(it, 3)
    state = _checkpoint(loader)
    del it, loader
    resumed = _loader(2, backend=after)
    resumed.load_state_dict(state)
    rest = [_rows(b) for b in resumed]
    nxt = [_rows(b) for b in resumed]
    del resumed

    assert indices(got + rest) == indices(ref[0])
    assert indices(nxt) == indices(ref[1])
    if before == "process":
        assert got == ref[0][:3]
    else:
        assert rest == ref[0][3:] and nxt == ref[1]


def test_resume_with_in_order_false_before_and_after() -> None:
    ref = reference()
    loader = _loader(2, in_order=False)
    it = iter(loader)
    got = _take(it, 4)
    state = _checkpoint(loader)
    del it, loader
    resumed = _loader(3, in_order=False)
    resumed.load_state_dict(state)
    rest = [_rows(b) for b in resumed]
    nxt = [_rows(b) for b in resumed]
    del resumed
    assert Counter(got + rest) == Counter(ref[0])
    assert len(got + rest) == len(ref[0])
    assert Counter(nxt) == Counter(ref[1])


def test_resume_in_order_after_an_out_of_order_run() -> None:
    ref = reference()
    loader = _loader(2, in_order=False)
    it = iter(loader)
    got = _take(it, 5)
    state = _checkpoint(loader)
    del it, loader
    resumed = _loader(1, in_order=True)
    resumed.load_state_dict(state)
    rest = [_rows(b) for b in resumed]
    del resumed
    # The batches not yet delivered, in sampler order.
    assert rest == [b for b in ref[0] if b not in got]


def test_resume_twice_within_one_epoch() -> None:
    ref = reference()
    first = _loader(2)
    it = iter(first)
    got = _take(it, 2)
    state = _checkpoint(first)
    del it, first
    second = _loader(1)
    second.load_state_dict(state)
    it = iter(second)
    got += _take(it, 3)
    state = _checkpoint(second)
    del it, second
    third = _loader(3)
    third.load_state_dict(state)
    got += [_rows(b) for b in third]
    nxt = [_rows(b) for b in third]
    del third
    assert got == ref[0]
    assert nxt == ref[1]


def test_checkpoint_of_a_resumed_loader_before_it_iterates() -> None:
    """A job that resumes and is checkpointed (or preempted) again before its first batch:
    the second checkpoint must still know what the first run delivered."""
    ref = reference()
    loader = _loader(2)
    it = iter(loader)
    got = _take(it, 3)
    state = _checkpoint(loader)
    del it, loader
    resumed = _loader(1)
    resumed.load_state_dict(state)
    state = _checkpoint(resumed)  # no batch taken yet
    del resumed
    again = _loader(0)
    again.load_state_dict(state)
    rest = [_rows(b) for b in again]
    del again
    assert got + rest == ref[0]


@pytest.mark.parametrize("after", [0, 2])
def test_checkpoint_at_the_end_of_an_epoch_starts_the_next(after: int) -> None:
    ref = reference()
    loader = _loader(2)
    assert [_rows(b) for b in loader] == ref[0]
    state = _checkpoint(loader)
    del loader
    resumed = _loader(after)
    resumed.load_state_dict(state)
    assert [_rows(b) for b in resumed] == ref[1]  # the saved (persistent) loader's next epoch
    third = [_rows(b) for b in resumed]
    if after:
        assert third == ref[2]
    else:  # num_workers=0 takes its next epochs' seeds from the generator, as torch does
        assert Counter(i for b in third for i, _ in b) == Counter(range(N))
    del resumed


def test_checkpoint_after_the_last_batch_before_stop_iteration() -> None:
    """All batches delivered, ``StopIteration`` not yet seen: the next epoch still follows."""
    ref = reference()
    loader = _loader(2)
    it = iter(loader)
    got = _take(it, len(ref[0]))
    state = _checkpoint(loader)
    del it, loader
    resumed = _loader(1)
    resumed.load_state_dict(state)
    rest = [_rows(b) for b in resumed]
    assert got == ref[0]
    # Either the resumed epoch is the finished one (empty) and the next is epoch 1, or
    # the resume starts epoch 1 at once.
    if rest == []:
        rest = [_rows(b) for b in resumed]
    del resumed
    assert rest == ref[1]


def test_checkpoint_before_the_first_batch() -> None:
    ref = reference()
    loader = _loader(2)
    state = _checkpoint(loader)
    del loader
    resumed = _loader(2)
    resumed.load_state_dict(state)
    assert [_rows(b) for b in resumed] == ref[0]
    del resumed


def test_resume_across_epochs() -> None:
    ref = reference()
    loader = _loader(2)
    for _ in range(2):
        for _ in loader:
            pass
    it = iter(loader)
    got = _take(it, 5)  # inside epoch 2
    state = _checkpoint(loader)
    del it, loader
    resumed = _loader(3)
    resumed.load_state_dict(state)
    rest = [_rows(b) for b in resumed]
    nxt = [_rows(b) for b in resumed]
    del resumed
    assert got + rest == ref[2]
    assert nxt == ref[3]


def test_resume_into_warm_persistent_workers() -> None:
    """``load_state_dict`` on a loader whose persistent workers already ran an epoch."""
    ref = reference()
    source = _loader(2)
    for _ in source:
        pass
    it = iter(source)
    got = _take(it, 3)  # inside epoch 1
    state = _checkpoint(source)
    del it, source
    warm = _loader(2, generator=torch.Generator().manual_seed(SEED + 1))
    for _ in warm:  # its workers are up and have seen an epoch of another order
        pass
    assert warm._iterator is not None
    warm.load_state_dict(state)
    rest = [_rows(b) for b in warm]
    nxt = [_rows(b) for b in warm]
    del warm
    assert got + rest == ref[1]
    assert nxt == ref[2]


def test_breaking_an_epoch_does_not_corrupt_the_next_checkpoint() -> None:
    """An abandoned epoch (early ``break``), then a checkpoint inside the next one.

    As with torch, abandoning an epoch changes what the generator has drawn, so the
    reference is an uninterrupted persistent run with the same early break.
    """
    ref_loader = _loader(1)
    ref_it = iter(ref_loader)
    _take(ref_it, 2)
    del ref_it
    expected = [_rows(b) for b in ref_loader]
    del ref_loader
    loader = _loader(2)
    it = iter(loader)
    _take(it, 2)
    del it  # epoch 0 abandoned
    it = iter(loader)  # epoch 1
    got = _take(it, 3)
    state = _checkpoint(loader)
    del it, loader
    resumed = _loader(0)
    resumed.load_state_dict(state)
    rest = [_rows(b) for b in resumed]
    del resumed
    assert got + rest == expected


class StatefulSampler(tud.Sampler[int]):
    """A sampler whose order comes from its own state (a counter), with ``state_dict``."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.epochs = 0

    def __len__(self) -> int:
        return self.n

    def __iter__(self) -> Any:
        g = torch.Generator().manual_seed(1000 + self.epochs)
        self.epochs += 1
        return iter(torch.randperm(self.n, generator=g).tolist())

    def state_dict(self) -> dict[str, int]:
        return {"epochs": self.epochs}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epochs = state["epochs"]


@pytest.mark.parametrize(("before", "after"), [(0, 2), (2, 1)])
def test_resume_with_a_sampler_that_has_state_dict(before: int, after: int) -> None:
    def make(workers: int) -> stoker.DataLoader:
        return _loader(workers, shuffle=None, sampler=StatefulSampler(N))

    ref_loader = make(after)
    ref = [[_rows(b) for b in ref_loader] for _ in range(3)]
    del ref_loader
    assert ref[1] != ref[2]
    loader = make(before)
    for _ in loader:
        pass
    it = iter(loader)
    got = _take(it, 3)
    state = _checkpoint(loader)
    del it, loader
    resumed = make(after)
    resumed.load_state_dict(state)
    rest = [_rows(b) for b in resumed]
    nxt = [_rows(b) for b in resumed]
    del resumed
    if (before > 0) == (after > 0):
        assert got + rest == ref[1]
        assert nxt == ref[2]
    else:  # the sampler's own state decides the order; the seeds follow each loader's rule
        assert indices(got + rest) == indices(ref[1])
        assert indices(nxt) == indices(ref[2])


class Stream(tud.IterableDataset[int]):
    """Worker ``w`` of ``W`` yields ``range(w, n, W)``; no ``state_dict``."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self) -> Any:
        info = tud.get_worker_info()
        w, nw = (info.id, info.num_workers) if info is not None else (0, 1)
        return iter(range(w, self.n, nw))


def test_iterable_dataset_without_state_dict_fast_forwards_with_a_warning() -> None:
    def make() -> stoker.DataLoader:
        return stoker.DataLoader(
            Stream(40), batch_size=4, num_workers=2, multiprocessing_context="fork"
        )

    ref_loader = make()
    ref = [b.tolist() for b in ref_loader]
    del ref_loader
    loader = make()
    it = iter(loader)
    got = [next(it).tolist() for _ in range(3)]
    state = _checkpoint(loader)
    del it, loader
    resumed = make()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        resumed.load_state_dict(state)
        rest = [b.tolist() for b in resumed]
    del resumed
    assert got + rest == ref, "an iterable dataset's resume repeated or lost items"
    assert any("state_dict" in str(w.message) for w in caught), [str(w.message) for w in caught]


class StatefulStream(tud.IterableDataset[int]):
    """Like :class:`Stream`, and it saves its position: resume jumps, nothing replays."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.pos = 0
        self._resume_at: int | None = None
        self.replayed = 0

    def state_dict(self) -> dict[str, int]:
        return {"pos": self.pos}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self._resume_at = state["pos"]

    def __iter__(self) -> Any:
        info = tud.get_worker_info()
        w, nw = (info.id, info.num_workers) if info is not None else (0, 1)
        items = list(range(w, self.n, nw))
        start, self._resume_at = (self._resume_at or 0), None
        for k in range(start, len(items)):
            self.pos = k + 1
            yield items[k]


@pytest.mark.parametrize("workers", [0, 2])
def test_iterable_dataset_with_state_dict_resumes_where_each_worker_stood(workers: int) -> None:
    def make() -> stoker.DataLoader:
        ctx = {"multiprocessing_context": "fork"} if workers else {}
        return stoker.DataLoader(StatefulStream(40), batch_size=4, num_workers=workers, **ctx)

    ref_loader = make()
    ref = [b.tolist() for b in ref_loader]
    del ref_loader
    loader = make()
    it = iter(loader)
    got = [next(it).tolist() for _ in range(3)]
    state = _checkpoint(loader)
    del it, loader
    resumed = make()
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # no fast-forward
        resumed.load_state_dict(state)
        rest = [b.tolist() for b in resumed]
    del resumed
    assert got + rest == ref


# -- the state machine -----------------------------------------------------------------------


class ResumeMachine(RuleBasedStateMachine):
    """Iterate, checkpoint, kill and resume at random; delivery must match the reference.

    The model is, per epoch, the reference batches not delivered yet (in sampler order). An
    in-order loader must deliver the first of them; an out-of-order one any of them, once.
    A crash takes a checkpoint, lets the doomed loader deliver ``lost`` more batches (lost
    with it: the resumed loader must deliver them again), deletes it, and resumes from the
    checkpoint in a new loader with a random ``num_workers`` of the same persistence class
    (0, or 1..3: the rule between epochs is torch's, see the module docstring) and ``in_order``.
    """

    def __init__(self) -> None:
        super().__init__()
        self.ref = reference()
        self.persistent = True
        self.loader: stoker.DataLoader | None = None
        self.it: Any = None
        self.in_order = True
        self.epoch = 0
        self.remaining: list[Batch] = []
        # Resumed from a checkpoint taken after an epoch's last batch but before its
        # StopIteration: the resumed loader may end that (empty) epoch first, or go on.
        self.may_roll = False
        self.crashes = 0

    @initialize(workers=st.sampled_from([0, 1, 2]), in_order=st.booleans())
    def start(self, workers: int, in_order: bool) -> None:
        self.persistent = workers > 0
        self.ref = reference(self.persistent)
        self.loader = _loader(workers, in_order)
        self.in_order = in_order
        self.remaining = list(self.ref[0])

    def _next(self) -> None:
        """Take one batch (or the end of an epoch) and check it against the model."""
        assert self.loader is not None
        if self.epoch >= EPOCHS - 1:
            return
        if self.it is None:
            self.it = iter(self.loader)
        try:
            batch = _rows(next(self.it))
        except StopIteration:
            self.may_roll = False
            assert self.remaining == [], f"epoch {self.epoch} ended early"
            self.it = None
            self.epoch += 1
            self.remaining = list(self.ref[self.epoch])
            return
        if self.may_roll and not self.remaining:
            self.epoch += 1
            self.remaining = list(self.ref[self.epoch])
        self.may_roll = False
        assert self.remaining, f"a batch beyond the end of epoch {self.epoch}: {batch}"
        if self.in_order:
            assert batch == self.remaining[0], "in-order delivery differs from the reference"
        else:
            assert batch in self.remaining, "a batch that is not due (repeated or foreign)"
        self.remaining.remove(batch)

    @rule(k=st.integers(1, 9))
    def iterate(self, k: int) -> None:
        for _ in range(k):
            self._next()

    @rule()
    def finish_epoch(self) -> None:
        epoch = self.epoch
        while self.epoch == epoch < EPOCHS - 1:
            self._next()

    @rule(
        lost=st.integers(0, 3),
        workers=st.sampled_from([0, 1, 2]),
        in_order=st.booleans(),
    )
    def crash_and_resume(self, lost: int, workers: int, in_order: bool) -> None:
        assert self.loader is not None
        buf = io.BytesIO()
        torch.save({"loader": self.loader.state_dict()}, buf)
        saved = (self.epoch, list(self.remaining), self.may_roll)
        for _ in range(lost):
            self._next()
        self.it = None
        self.loader = None  # the run dies: its workers go with the last reference
        if self.persistent and workers == 0:
            workers = 3
        elif not self.persistent:
            workers = 0
        self.loader = _loader(workers, in_order)
        state = torch.load(io.BytesIO(buf.getvalue()), weights_only=False)["loader"]
        self.loader.load_state_dict(state)
        self.in_order = in_order
        self.epoch, self.remaining, self.may_roll = saved
        self.remaining = list(self.remaining)
        self.may_roll = self.may_roll or not self.remaining
        self.crashes += 1

    @invariant()
    def never_more_than_the_reference(self) -> None:
        assert len(self.remaining) <= len(self.ref[min(self.epoch, EPOCHS - 1)])

    def teardown(self) -> None:
        # Finish the current epoch: whatever is still due must come, and nothing else.
        if self.loader is not None and self.epoch < EPOCHS - 1:
            epoch = self.epoch
            while self.epoch == epoch:
                self._next()
        self.it = None
        self.loader = None


ResumeMachine.TestCase.settings = settings(
    max_examples=15,
    stateful_step_count=8,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestResumeMachine = ResumeMachine.TestCase
