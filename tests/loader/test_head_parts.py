"""The head start's batch loaded in parts side by side (stoker.loader._head_parts): real forks
and memory files. Split only where the samples come out as one worker loads them, one after
another; a helper that moves the random generators, fails or hangs leaves its part to the
child; no helper outlives the child (the conftest's leak check: processes, fds, memory)."""

from __future__ import annotations

import gc
import os
import time
from typing import Any

import pytest
import torch
from torch.utils.data import Dataset

import stoker
import stoker.loader._head as head_mod
import stoker.loader._head_parts as parts_mod
from stoker.loader._head_parts import HEAD_MIN_PART, part_count, split

HANG_GUARD_S = 120
PARTS_NOTE = "in 2 parts side by side"
HEAD_NOTE = "first batch loaded beside the backend probe"
# Each sample's CPU work: a batch of 16 takes 32 ms, far over the probe's limit for loading in
# the main process; work, not a wait, so that the probe keeps processes (threads would share
# the random generators: draws would not repeat).
SAMPLE_S = 0.002
BATCH = 16
# Seconds a test waits for a stopped process to vanish.
GONE_S = 10.0

pytestmark = pytest.mark.timeout(HANG_GUARD_S)


@pytest.fixture(autouse=True)
def two_parts_for_every_slow_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every probe's warm-up starts a head start, which splits every batch in two (whatever
    the cores, which the forks inherit)."""
    monkeypatch.setattr(head_mod, "HEAD_MIN_BATCH_S", 0.0)
    monkeypatch.setattr(parts_mod, "HEAD_SPLIT_MIN_S", 0.0)
    monkeypatch.setattr(parts_mod, "usable_cores", lambda: 2)


def _spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


class Recorded(Dataset[tuple[int, torch.Tensor, int]]):
    """Index, a tensor made from it (a torch draw where ``draws_from`` says so), and the pid
    of the process that loaded it. In a helper (a process whose parent is not the test's:
    the head start's child forks them) ``pid_file`` gets its pid and ``in_helpers`` ("fail",
    "hang") happens."""

    def __init__(
        self,
        n: int = 64,
        draws_from: int | None = None,
        in_helpers: str | None = None,
        pid_file: str | None = None,
    ) -> None:
        self.n = n
        self.draws_from = draws_from
        self.in_helpers = in_helpers
        self.pid_file = pid_file
        self.main = os.getpid()

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> tuple[int, torch.Tensor, int]:
        pid = os.getpid()
        if pid != self.main and os.getppid() != self.main:
            if self.pid_file is not None:
                with open(self.pid_file, "a") as f:
                    f.write(f"{pid}\n")
            if self.in_helpers == "fail":
                raise RuntimeError(f"sample {index} fails in a helper")
            if self.in_helpers == "hang":
                time.sleep(3600)
        _spin(SAMPLE_S)
        value = torch.arange(4, dtype=torch.float32) + index
        if self.draws_from is not None and index >= self.draws_from:
            value = value + torch.rand(4)
        return index, value, pid


def _loader(dataset: Any, **kwargs: Any) -> stoker.DataLoader[Any]:
    kwargs.setdefault("num_workers", 2)
    kwargs.setdefault("batch_size", BATCH)
    kwargs.setdefault("multiprocessing_context", "fork")
    kwargs.setdefault("backend", "auto")  # (the probe, and so the head start, need auto)
    kwargs.setdefault("generator", torch.Generator().manual_seed(3))  # the same seeds each time
    return stoker.DataLoader(dataset, **kwargs)


def _values(batches: list[Any]) -> list[Any]:
    return [[b[0].tolist(), b[1].tolist()] for b in batches]


def _notes(loader: Any) -> str:
    return " | ".join(loader.stats().notes)


def _gone(pids: list[int]) -> bool:
    """Whether every pid has vanished (waits up to GONE_S)."""
    end = time.monotonic() + GONE_S
    while time.monotonic() < end:
        alive = []
        for pid in pids:
            try:
                os.kill(pid, 0)
                alive.append(pid)
            except ProcessLookupError:
                pass
        if not alive:
            return True
        time.sleep(0.02)
    return False


def test_split_cuts_contiguous_parts_longest_first() -> None:
    assert split(list(range(10)), 3) == [[0, 1, 2, 3], [4, 5, 6], [7, 8, 9]]
    assert split([5, 6], 1) == [[5, 6]]


def test_part_count_follows_the_cores_and_leaves_no_part_too_small(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(parts_mod, "usable_cores", lambda: 16)
    assert part_count(64) == parts_mod.HEAD_MAX_PARTS
    assert part_count(2 * HEAD_MIN_PART) == 2
    assert part_count(HEAD_MIN_PART - 1) == 1
    monkeypatch.setattr(parts_mod, "usable_cores", lambda: 1)
    assert part_count(64) == 1


def test_a_batch_that_draws_on_no_shared_generator_loads_in_parts_as_a_worker_would() -> None:
    split_loader = _loader(Recorded(), shuffle=True)
    got = list(split_loader)
    assert PARTS_NOTE in _notes(split_loader)
    # Two processes loaded the first batch (the child and its helper), neither the main one.
    first_pids = set(got[0][2].tolist())
    assert len(first_pids) == 2 and os.getpid() not in first_pids
    expected = list(_loader(Recorded(), shuffle=True, backend="process"))
    assert _values(got) == _values(expected)
    assert len(set(expected[0][2].tolist())) == 1  # (a worker loads a batch alone)


@pytest.mark.parametrize("draws_from", [3, 10])
def test_a_part_whose_samples_draw_on_torchs_generator_is_loaded_by_the_child_itself(
    draws_from: int,
) -> None:
    """The first batch holds indices 0-15: three to pace, then parts 3-9 and 10-15. From 3,
    the helper's draws start from the seeded state where a worker's start after seven draws:
    its samples would differ; from 10 they would not, but its part moved the generators."""
    got = list(_loader(Recorded(draws_from=draws_from)))
    plain = list(_loader(Recorded(draws_from=draws_from), backend="process"))
    assert _values(got) == _values(plain)
    assert len(set(got[0][2].tolist())) == 1


def test_samples_that_draw_from_the_start_are_not_split(tmp_path: Any) -> None:
    pid_file = str(tmp_path / "helpers")
    loader = _loader(Recorded(draws_from=0, pid_file=pid_file))
    got = list(loader)
    assert PARTS_NOTE not in _notes(loader) and HEAD_NOTE in _notes(loader)
    assert _values(got) == _values(list(_loader(Recorded(draws_from=0), backend="process")))
    assert not os.path.exists(pid_file)  # no helper was forked


def test_a_helper_that_fails_leaves_its_part_to_the_child() -> None:
    loader = _loader(Recorded(in_helpers="fail"))
    got = list(loader)
    assert HEAD_NOTE in _notes(loader) and PARTS_NOTE not in _notes(loader)
    assert [i for b in got for i in b[0].tolist()] == list(range(64))
    assert len(set(got[0][2].tolist())) == 1


def test_a_stuck_helper_is_given_up_and_does_not_outlive_the_batch(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    monkeypatch.setattr(parts_mod, "HELPER_WAIT_S", 0.3)
    pid_file = tmp_path / "helpers"
    loader = _loader(Recorded(in_helpers="hang", pid_file=str(pid_file)))
    got = list(loader)
    assert HEAD_NOTE in _notes(loader) and PARTS_NOTE not in _notes(loader)
    assert [i for b in got for i in b[0].tolist()] == list(range(64))
    helpers = [int(line) for line in pid_file.read_text().split()]
    assert helpers and _gone(helpers)


def test_a_child_stopped_while_its_helper_loads_takes_the_helper_with_it(
    tmp_path: Any,
) -> None:
    pid_file = tmp_path / "helpers"
    loader = _loader(Recorded(in_helpers="hang", pid_file=str(pid_file)))
    it = iter(loader)
    end = time.monotonic() + GONE_S
    while not pid_file.exists() and time.monotonic() < end:
        time.sleep(0.01)
    helpers = [int(line) for line in pid_file.read_text().split()]
    del it, loader
    gc.collect()
    assert helpers and _gone(helpers)


class CollatesInside(Dataset[torch.Tensor]):
    """Each sample stacks tensors with torch's ``default_collate`` itself, as some datasets
    do: in a worker that stacking goes to its slot arena."""

    def __len__(self) -> int:
        return 64

    def __getitem__(self, index: int) -> torch.Tensor:
        from torch.utils.data import default_collate

        _spin(SAMPLE_S)
        rows = [torch.full((256,), float(index * 10 + k)) for k in range(4)]
        return default_collate(rows)


def test_a_helper_whose_samples_collate_inside_leaves_the_childs_batch_intact() -> None:
    loader = _loader(CollatesInside())
    got = [b.tolist() for b in loader]
    assert PARTS_NOTE in _notes(loader)
    assert got == [b.tolist() for b in _loader(CollatesInside(), backend="process")]
