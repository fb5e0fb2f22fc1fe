"""``num_workers="auto"``'s first batch loaded in the main process (stoker.loader._main_first):
it is the batch a worker would load, the caller's random streams stay where torch's would be,
what the loading opens on the dataset lands on a copy, and what it leaves open anywhere else
keeps the loader in the main process, with a warning that names it. Each test is checked by
the conftest for leaked processes, fds and shared memory."""

from __future__ import annotations

import os
import random
import re
import threading
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from _datasets import SampleError
from torch.utils.data import Dataset

import stoker
from stoker._introspect.platform import usable_cores
from stoker.loader._main_first import MainFirst, _Snapshot

pytestmark = pytest.mark.timeout(120)
MAIN_NOTE = "first batch loaded in the main process"
# Each sample's CPU work: a batch of 8 takes about 4 ms, over the probe's limit for loading in
# the main process (so the probe would answer workers; no test here depends on its answer).
SPIN_S = 0.0005
# A module-level cache of open files, as datasets keep them (functools.lru_cache and the like).
_OPEN: dict[str, Any] = {}
_THREADS: list[tuple[threading.Thread, threading.Event]] = []


def _spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


class Drawn(Dataset[tuple[int, int, torch.Tensor, float, float]]):
    """Index, the loading process's pid, and a draw from each global generator."""

    def __init__(self, n: int = 64, bad: int | None = None) -> None:
        self.n = n
        self.bad = bad

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> tuple[int, int, torch.Tensor, float, float]:
        _spin(SPIN_S)
        if index == self.bad:
            raise SampleError(f"sample {index} is corrupt")
        return index, os.getpid(), torch.rand(2), random.random(), float(np.random.random())


class OpensOnSelf(Drawn):
    """Opens its file on first use and keeps it on ``self`` (the pattern the copy absorbs)."""

    def __init__(self, path: Path) -> None:
        super().__init__()
        self.path = str(path)
        self.fh: Any = None

    def __getitem__(self, index: int) -> Any:
        if self.fh is None:
            self.fh = open(self.path, "rb")
        self.fh.seek(index)
        return (*super().__getitem__(index), self.fh.read(1)[0])


class OpensInModuleCache(Drawn):
    """Keeps its file open in a module-level cache, which forked workers would share."""

    def __init__(self, path: Path) -> None:
        super().__init__()
        self.path = str(path)

    def __getitem__(self, index: int) -> Any:
        fh = _OPEN.get(self.path)
        if fh is None:
            fh = _OPEN[self.path] = open(self.path, "rb")
        return (*super().__getitem__(index), os.pread(fh.fileno(), 1, index)[0])


class StartsAThread(Drawn):
    """Starts a helper thread on first use, kept in a module-level list."""

    def __getitem__(self, index: int) -> Any:
        if not _THREADS:
            stop = threading.Event()
            thread = threading.Thread(target=stop.wait, name="prefetcher", daemon=True)
            thread.start()
            _THREADS.append((thread, stop))
        return super().__getitem__(index)


class CopyRecurses(Drawn):
    """``copy.copy`` recurses forever here (``__getattr__`` reads an attribute it forwards)."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = Drawn()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class Stream(torch.utils.data.IterableDataset[int]):
    def __iter__(self) -> Any:
        return iter(range(8))


@pytest.fixture(autouse=True)
def _close_cached() -> Any:
    yield
    for fh in _OPEN.values():
        fh.close()
    _OPEN.clear()
    for thread, stop in _THREADS:
        stop.set()
        thread.join()
    _THREADS.clear()


@pytest.fixture
def data_file(tmp_path: Path) -> Path:
    path = tmp_path / "data.bin"
    path.write_bytes(bytes(range(256)))
    return path


def _auto(dataset: Any, **kwargs: Any) -> stoker.DataLoader[Any]:
    kwargs.setdefault("batch_size", 8)
    kwargs.setdefault("multiprocessing_context", "fork")
    return stoker.DataLoader(dataset, num_workers="auto", **kwargs)


def _workers(dataset: Any, **kwargs: Any) -> stoker.DataLoader[Any]:
    kwargs.setdefault("batch_size", 8)
    kwargs.setdefault("multiprocessing_context", "fork")
    return stoker.DataLoader(dataset, num_workers=2, backend="process", **kwargs)


def _content(batch: Any) -> list[Any]:
    """A batch without its pids (column 1)."""
    return [x.tolist() for k, x in enumerate(batch) if k != 1]


def _notes(loader: Any) -> str:
    return " | ".join(loader.stats().notes)


def test_the_first_batch_comes_from_the_main_process_and_is_the_one_a_worker_loads() -> None:
    loader = _auto(Drawn(), shuffle=True, generator=torch.Generator().manual_seed(7))
    batches = list(loader)
    assert set(batches[0][1].tolist()) == {os.getpid()}
    assert MAIN_NOTE in _notes(loader)
    plain = list(_workers(Drawn(), shuffle=True, generator=torch.Generator().manual_seed(7)))
    assert [_content(b) for b in batches] == [_content(b) for b in plain]
    assert sorted(i for b in batches for i in b[0].tolist()) == list(range(64))


def test_the_callers_random_streams_stand_where_workers_leave_them() -> None:
    """No generator: the base seed and the shuffle are drawn from torch's global generator,
    as torch draws them; the batch's own draws are put back."""
    after = []
    for make in (_auto, _workers):
        torch.manual_seed(5)
        random.seed(5)
        np.random.seed(5)
        it = iter(make(Drawn(), shuffle=True))
        first = _content(next(it))
        after.append((first, torch.rand(3).tolist(), random.random(), np.random.random()))
        del it
    assert after[0] == after[1]


def test_a_file_the_dataset_opens_on_itself_lands_on_a_copy(data_file: Path) -> None:
    dataset = OpensOnSelf(data_file)
    loader = _auto(dataset)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        it = iter(loader)
        first = next(it)
        assert dataset.fh is None  # (the copy opened it, and closed it when dropped)
        rest = list(it)
    assert set(first[1].tolist()) == {os.getpid()}
    assert "left" not in _notes(loader)
    got = [i for b in [first, *rest] for i in b[0].tolist()]
    assert got == list(range(64))
    assert [v for b in [first, *rest] for v in b[5].tolist()] == list(range(64))
    if dataset.fh is not None:  # (the probe may keep the main process: it opened it then)
        dataset.fh.close()


def test_a_file_opened_by_a_dataset_inside_a_subset_lands_on_a_copy_too(data_file: Path) -> None:
    """random_split's Subset, and a ConcatDataset, around a dataset that opens on first use:
    the datasets they hold are copied as well."""
    inner = [OpensOnSelf(data_file), OpensOnSelf(data_file)]
    dataset = torch.utils.data.Subset(torch.utils.data.ConcatDataset(inner), list(range(96)))
    loader = _auto(dataset)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        it = iter(loader)
        first = next(it)
        assert [d.fh for d in inner] == [None, None]
        rest = list(it)
    assert set(first[1].tolist()) == {os.getpid()}
    assert [i for b in [first, *rest] for i in b[0].tolist()] == [*range(64), *range(32)]
    for d in inner:  # (the probe may keep the main process: they opened them then)
        if d.fh is not None:
            d.fh.close()


def test_a_copy_shares_what_is_not_a_dataset_and_stops_at_its_depth() -> None:
    from stoker.loader._main_first import DATASET_DEPTH, copy_datasets

    data = [1, 2, 3]
    base = torch.utils.data.TensorDataset(torch.arange(3))
    nested: Any = base
    for _ in range(DATASET_DEPTH + 1):
        nested = torch.utils.data.Subset(nested, [0, 1, 2])
    nested.data = data
    dup = copy_datasets(nested)
    assert dup is not nested and dup.data is data and dup.indices is nested.indices
    chain = [nested, dup]
    for _ in range(DATASET_DEPTH):
        chain = [chain[0].dataset, chain[1].dataset]
        assert chain[0] is not chain[1]
    assert chain[0].dataset is chain[1].dataset  # (below the depth: shared)


def test_a_file_left_open_in_a_module_cache_keeps_the_loading_in_the_main_process(
    data_file: Path,
) -> None:
    loader = _auto(OpensInModuleCache(data_file))
    with pytest.warns(RuntimeWarning, match=f"descriptor .*{data_file.name}.*worker_init_fn"):
        epochs = [list(loader) for _ in range(2)]
    for batches in epochs:
        assert {p for b in batches for p in b[1].tolist()} == {os.getpid()}
        assert [v for b in batches for v in b[5].tolist()] == list(range(64))
    stats = loader.stats()
    assert stats.backend == "inline"
    assert "forked workers would share" in " | ".join(stats.notes)
    assert loader._iterator is None  # (the first epoch's iterator is not kept for workers)


def test_a_thread_the_loading_leaves_running_keeps_it_in_the_main_process() -> None:
    loader = _auto(StartsAThread())
    with pytest.warns(RuntimeWarning, match="thread 'prefetcher'"):
        batches = list(loader)
    assert {p for b in batches for p in b[1].tolist()} == {os.getpid()}
    assert loader.stats().backend == "inline"


@pytest.mark.measures  # the probe's answer (workers, for 4 ms batches) decides the next epoch
def test_an_epoch_left_after_the_first_batch_leaves_the_next_as_with_workers() -> None:
    got = []
    for make in (_auto, _workers):
        loader = make(Drawn(), shuffle=True, generator=torch.Generator().manual_seed(3))
        it = iter(loader)
        first = _content(next(it))
        del it
        got.append((first, [_content(b) for b in loader]))
    assert got[0] == got[1]


def test_a_failed_sample_in_the_first_batch_is_loaded_again_and_recorded_once() -> None:
    loader = _auto(Drawn(bad=3), on_error="skip")
    batches = list(loader)
    assert [f.index for f in loader.failures] == [3]
    assert sorted(i for b in batches for i in b[0].tolist()) == [i for i in range(64) if i != 3]
    assert "the main process gave no first batch" in _notes(loader) or (
        loader.stats().backend == "inline"  # (the probe kept the main process: it logged there)
    )


def test_an_error_in_the_first_batch_keeps_its_type() -> None:
    with pytest.raises(SampleError, match="sample 0 is corrupt"):
        list(_auto(Drawn(bad=0)))


def test_a_dataset_that_cannot_be_copied_gets_its_first_batch_from_elsewhere() -> None:
    loader = _auto(CopyRecurses())
    batches = list(loader)
    assert "the main process gave no first batch" in _notes(loader)
    assert sorted(i for b in batches for i in b[0].tolist()) == list(range(64))


def test_a_state_saved_after_the_main_process_first_batch_resumes_exactly() -> None:
    gen = torch.Generator().manual_seed(11)
    loader = _auto(Drawn(), shuffle=True, generator=gen)
    it = iter(loader)
    head = [_content(next(it)) for _ in range(3)]
    state = loader.state_dict()
    rest = [_content(b) for b in it]
    resumed = _workers(Drawn(), shuffle=True, generator=torch.Generator())
    resumed.load_state_dict(state)
    assert [_content(b) for b in resumed] == rest
    full = [
        _content(b)
        for b in _workers(Drawn(), shuffle=True, generator=torch.Generator().manual_seed(11))
    ]
    assert head + rest == full


def test_only_auto_loaders_that_may_stay_in_the_main_process_load_it_there() -> None:
    assert MainFirst.eligible(_auto(Drawn()))
    assert not MainFirst.eligible(_workers(Drawn()))  # (asked for workers)
    assert not MainFirst.eligible(_auto(Drawn(), timeout=5))
    assert not MainFirst.eligible(_auto(Drawn(), worker_init_fn=lambda i: None))
    assert not MainFirst.eligible(_auto(Stream()))


def test_the_snapshot_names_what_was_opened_since(data_file: Path) -> None:
    snap = _Snapshot()
    assert snap.left_open() == ""
    with open(data_file, "rb"):
        left = snap.left_open()
    assert "descriptor" in left and str(data_file) in left
    assert snap.left_open() == ""


@pytest.mark.measures  # the probe's answer for cheap batches: the main process
def test_a_main_process_answer_goes_on_in_the_same_epoch_and_the_next() -> None:
    loader = _auto(list(range(256)), batch_size=4)
    it = iter(loader)
    first = next(it)
    epochs = [[first.tolist(), *[b.tolist() for b in it]], [b.tolist() for b in loader]]
    want = [b.tolist() for b in torch.utils.data.DataLoader(list(range(256)), batch_size=4)]
    assert epochs == [want, want]
    stats = loader.stats()
    assert stats.backend == "inline" and stats.notes[0].startswith("backend=inline")
    assert loader._iterator is None


class Waits(Dataset[tuple[int, int, float]]):
    """Each sample waits ``wait_s`` (storage latency); ``draws``: and draws from torch's
    global generator."""

    def __init__(self, wait_s: float = 0.01, draws: bool = False) -> None:
        self.wait_s = wait_s
        self.draws = draws

    def __len__(self) -> int:
        return 64

    def __getitem__(self, index: int) -> tuple[int, int, float]:
        time.sleep(self.wait_s)
        return index, os.getpid(), float(torch.rand(1)) if self.draws else 0.0


@pytest.mark.skipif(usable_cores() < 2, reason="one usable core: the batch loads in one part")
def test_a_slow_first_batch_loads_in_parts_side_by_side_from_the_main_process() -> None:
    loader = _auto(Waits(), batch_size=16)
    it = iter(loader)
    first = next(it)
    assert os.getpid() in first[1].tolist()  # (the other part came from a helper it forked)
    assert re.search(
        r"first batch loaded in the main process in [2-4] parts side by side", _notes(loader)
    )
    got = [first[0].tolist(), *(b[0].tolist() for b in it)]
    assert got == [list(range(k, k + 16)) for k in range(0, 64, 16)]


def test_samples_that_draw_from_the_global_generators_load_in_one_part() -> None:
    """The parts would not see the state the samples before them left: one after another,
    as a worker loads them, and the batch is the worker's."""
    got = []
    for make in (_auto, _workers):
        loader = make(Waits(draws=True), batch_size=8, generator=torch.Generator().manual_seed(2))
        got.append([_content(b) for b in loader])
        if make is _auto:
            assert "side by side" not in _notes(loader)
    assert got[0] == got[1]


@pytest.mark.measures  # the probe's answer for cheap batches: the main process
def test_a_state_loaded_after_an_epoch_left_at_its_first_batch_resumes_exactly() -> None:
    """The epoch left before the answer takes it at the next iter(): the state loaded since
    is the next epoch's, and the main process's iterator must not consume it."""

    def make() -> stoker.DataLoader[Any]:
        return _auto(list(range(64)), batch_size=4, shuffle=True, generator=torch.Generator())

    saved = make()
    saved.generator.manual_seed(9)
    it = iter(saved)
    for _ in range(3):
        next(it)
    state = saved.state_dict()
    rest = [b.tolist() for b in it]
    loader = make()
    it = iter(loader)
    next(it)
    del it
    loader.load_state_dict(state)
    assert [b.tolist() for b in loader] == rest
    assert loader.stats().backend == "inline"


def test_a_thread_that_ends_while_another_starts_is_still_seen() -> None:
    """Threads are compared as objects: an ended thread's ident may be taken by a new one."""
    snap = _Snapshot()
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait, name="late")
    thread.start()
    try:
        assert "thread 'late'" in snap.left_open()
    finally:
        stop.set()
        thread.join()
    assert snap.left_open() == ""


def test_what_was_left_open_a_moment_is_not_kept_against_the_workers(data_file: Path) -> None:
    first = MainFirst()
    first._before = _Snapshot()
    fh = open(data_file, "rb")
    first._left = first._before.opened()
    assert first.left and first.still_left() == first.left
    fh.close()
    assert first.still_left() == ""
