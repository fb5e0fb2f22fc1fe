"""Batches shared by thread workers (stoker.workers._board), and the loader using them."""

from __future__ import annotations

import gc
import threading
import time

import pytest
import torch.utils.data as tud

from stoker.workers import _fetch
from stoker.workers._board import Board, run_length
from stoker.workers._messages import BatchTask

# How long the sharing test's blocked sample waits for the rest of its batch before failing.
RELEASE_WAIT_S = 10.0


def _task(epoch: int, idx: int, size: int) -> BatchTask:
    return BatchTask(epoch, idx, 0, list(range(idx * size, (idx + 1) * size)))


def _never() -> bool:
    return False


def test_runs_come_from_the_oldest_batch_by_epoch_then_index() -> None:
    board = Board()
    board.open(_task(1, 0, 2), _never)
    board.open(_task(0, 5, 2), _never)
    board.open(_task(0, 3, 2), _never)
    keys = []
    while (claimed := board.claim()) is not None:
        keys.append(claimed[0].key)
    assert keys == [(0, 3), (0, 3), (0, 5), (0, 5), (1, 0), (1, 0)]


def test_samples_given_back_by_an_older_batch_are_claimed_before_newer_batches() -> None:
    board = Board()
    board.pace = 1e-4  # whole batches per claim
    board.open(_task(0, 0, 4), _never)
    older, _, _ = board.claim() or (None, 0, 0)  # fully claimed: off the board
    board.open(_task(0, 1, 4), _never)
    board.open(_task(0, 2, 4), _never)
    assert older is not None
    board.give_back(older, 2, 4)  # back on the board, ahead of the newer two
    keys = []
    while (claimed := board.claim()) is not None:
        keys.append((claimed[0].key, claimed[1:]))
    assert keys == [((0, 0), (2, 4)), ((0, 1), (0, 4)), ((0, 2), (0, 4))]


def test_run_length_follows_the_pace(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_fetch, "STOP_CHECK_S", 0.001)
    assert run_length(0.0) == 1  # unknown pace: one sample
    assert run_length(0.002) == 1  # slow samples: one at a time
    assert run_length(1e-5) == 100
    board = Board()
    board.open(_task(0, 0, 8), _never)
    batch, start, stop = board.claim() or (None, 0, 0)
    assert (start, stop) == (0, 1)
    assert batch is not None and not board.finish(batch, 0, ["a"], 0.0004, worker_id=0)
    assert board.pace == pytest.approx(0.0004)
    _, start, stop = board.claim() or (None, 0, 0)
    assert (start, stop) == (1, 3)  # 1 ms at 0.4 ms a sample


def test_the_last_run_to_finish_replies_with_every_part_in_order() -> None:
    board = Board()
    board.open(_task(0, 0, 3), _never)
    runs = [board.claim() for _ in range(3)]
    assert board.claim() is None  # fully claimed: off the board
    done = []
    for batch, start, _stop in reversed(runs):  # type: ignore[misc]
        done.append(board.finish(batch, start, [f"s{start}"], 0.001, worker_id=start))
    assert done == [False, False, True]
    batch = runs[0][0]  # type: ignore[index]
    assert batch.parts == ["s0", "s1", "s2"] and batch.closed
    assert batch.work == {0: 0.001, 1: 0.001, 2: 0.001}


def test_a_closed_batch_replies_once_and_drops_runs_still_loading() -> None:
    board = Board()
    board.open(_task(0, 0, 3), _never)
    first = board.claim()
    assert first is not None
    batch = first[0]
    assert board.close(batch) and not board.close(batch)
    assert board.claim() is None  # its unclaimed samples left the board with it
    assert not board.finish(batch, first[1], ["late"], 0.001, worker_id=1)
    assert batch.parts == [None, None, None]


def test_samples_given_back_by_a_short_run_are_claimed_again_before_the_rest() -> None:
    board = Board()
    board.open(_task(0, 0, 6), _never)
    board.pace = 1e-4  # 10-sample runs: the whole batch in one claim
    batch, start, stop = board.claim() or (None, 0, 0)
    assert batch is not None and (start, stop) == (0, 6)
    assert board.claim() is None
    # The run loaded 2 samples and ended short: the other 4 are claimable again.
    board.give_back(batch, 2, 6)
    assert not board.finish(batch, 0, ["s0", "s1"], 0.02, worker_id=0)  # pace now 5 ms
    runs = []
    while (claimed := board.claim()) is not None:
        runs.append(claimed[1:])
    assert runs == [(2, 3), (3, 4), (4, 5), (5, 6)]  # one at a time at the new pace
    for k, (start, _stop) in enumerate(runs):
        assert board.finish(batch, start, [f"s{start}"], 0.005, worker_id=1) == (k == 3)
    assert batch.parts == [f"s{i}" for i in range(6)]
    board.give_back(batch, 0, 1)  # a closed batch takes nothing back
    assert board.claim() is None


class _Squares(tud.Dataset):
    def __init__(self, slow_from: int, delay_s: float) -> None:
        self.slow_from, self.delay_s = slow_from, delay_s

    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> int:
        if i >= self.slow_from:
            time.sleep(self.delay_s)
        return i * i


@pytest.mark.parametrize("on_error", ["raise", "skip"])
@pytest.mark.measures  # the run's length follows the measured clock
def test_a_run_ends_short_once_it_outlasts_its_limit(on_error: str) -> None:
    from torch.utils.data import default_collate

    fetcher = _fetch.BatchFetcher(
        _Squares(slow_from=2, delay_s=0.01),
        iterable=False,
        auto_collation=True,
        collate_fn=default_collate,
        drop_last=False,
        on_error=on_error,
    )
    # Looks at the clock after samples 1, 2, 4, 8...: 4 samples in (2 slow), 20 ms > 15 ms.
    parts = fetcher.load_run(list(range(10)), seed=0, seconds=0.015)
    assert len(parts) == 4
    if on_error == "skip":
        parts = [loaded[0] for loaded, _failures in parts]
    assert parts == [0, 1, 4, 9]
    assert len(fetcher.load_run(list(range(3)), seed=0, seconds=0.0)) == 1  # one at least
    assert len(fetcher.load_run(list(range(3)), seed=0)) == 3  # no limit


class _NeedsHelp(tud.Dataset):
    """Sample 0 waits until samples 1-3 (its batch's others) were loaded: only a second thread
    loading the same batch lets it finish (a thread holding a batch alone never would)."""

    def __init__(self) -> None:
        self.loaded: dict[int, int] = {}
        self.rest = threading.Event()

    def __len__(self) -> int:
        return 16

    def __getitem__(self, i: int) -> int:
        if i == 0 and not self.rest.wait(RELEASE_WAIT_S):
            raise TimeoutError("no other thread loaded samples 1-3 of batch 0")
        self.loaded[i] = threading.get_ident()
        if all(j in self.loaded for j in (1, 2, 3)):
            self.rest.set()
        return i


def test_thread_workers_share_a_batch_held_up_by_one_slow_sample() -> None:
    import stoker

    dataset = _NeedsHelp()
    loader = stoker.DataLoader(dataset, batch_size=4, num_workers=2, backend="thread")
    t0 = time.monotonic()
    got = [b.tolist() for b in loader]
    assert got == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11], [12, 13, 14, 15]]
    assert time.monotonic() - t0 < RELEASE_WAIT_S
    assert dataset.loaded[0] != dataset.loaded[1]  # batch 0 was loaded by both threads
    stats = loader.stats()
    assert sum(w.batches for w in stats.workers) == 4
    del loader
    gc.collect()
