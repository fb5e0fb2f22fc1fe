"""The first batch loaded while the backend probe runs (stoker.loader._head): it is the batch a
worker would have loaded, it is used only when the parent's first task is the one the child
loaded, and a child that fails, hangs or is not needed leaves nothing behind (the conftest's
leak check: processes, fds, shared memory)."""

from __future__ import annotations

import gc
import os
import random
import time
from typing import Any

import numpy as np
import pytest
import torch
from _datasets import SampleError
from torch.utils.data import Dataset, Sampler

import stoker
import stoker.loader._head as head_mod
from stoker.loader._head import HeadStart
from stoker.loader._main_first import MainFirst

HANG_GUARD_S = 120
# Each sample's CPU work: a batch of 8 takes about 4 ms, over the probe's limit for loading in
# the main process (so the loader starts workers) and quick for a test.
SPIN_S = 0.0005
HEAD_NOTE = "first batch loaded beside the backend probe"
FALLBACK_NOTE = "the head start gave no first batch"

pytestmark = pytest.mark.timeout(HANG_GUARD_S)
SHIPPED_THRESHOLD_S = head_mod.HEAD_MIN_BATCH_S


@pytest.fixture(autouse=True)
def every_batch_is_slow(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every probe's warm-up starts a head start (the real threshold needs 25 ms batches)."""
    monkeypatch.setattr(head_mod, "HEAD_MIN_BATCH_S", 0.0)


def _spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


class Augmented(Dataset[tuple[int, torch.Tensor, float, float]]):
    """Index, a tensor with a torch draw, a ``random`` draw and a numpy draw; CPU work."""

    def __init__(self, n: int = 64, bad: int | None = None, slow_first_s: float = 0.0) -> None:
        self.n = n
        self.bad = bad
        self.slow_first_s = slow_first_s
        self._pid = -1

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> tuple[int, torch.Tensor, float, float]:
        if self.slow_first_s and self._pid != os.getpid():  # each process's first sample
            self._pid = os.getpid()
            time.sleep(self.slow_first_s)
        _spin(SPIN_S)
        if index == self.bad:
            raise SampleError(f"sample {index} is corrupt")
        return index, torch.rand(3) + index, random.random(), float(np.random.random())


class OwnEntropySampler(Sampler[list[int]]):
    """Batches in an order drawn from the operating system, not from any seeded generator."""

    def __init__(self, n: int, batch: int) -> None:
        self.n = n
        self.batch = batch

    def __len__(self) -> int:
        return self.n // self.batch

    def __iter__(self) -> Any:
        order = sorted(range(self.n), key=lambda _: os.urandom(8))
        for k in range(len(self)):
            yield order[k * self.batch : (k + 1) * self.batch]


def _epoch(loader: Any) -> list[Any]:
    return [[b[0].tolist(), b[1].tolist(), b[2].tolist(), b[3].tolist()] for b in loader]


def _loader(dataset: Any, **kwargs: Any) -> stoker.DataLoader[Any]:
    kwargs.setdefault("num_workers", 2)
    kwargs.setdefault("batch_size", 8)
    kwargs.setdefault("multiprocessing_context", "fork")
    kwargs.setdefault("backend", "auto")  # (the probe runs only for backend="auto")
    return stoker.DataLoader(dataset, **kwargs)


def _notes(loader: Any) -> str:
    return " | ".join(loader.stats().notes)


def test_first_batch_from_the_head_start_is_the_one_a_worker_loads() -> None:
    probed = _loader(Augmented(), shuffle=True, generator=torch.Generator().manual_seed(7))
    got = _epoch(probed)
    assert HEAD_NOTE in _notes(probed)
    plain = _loader(
        Augmented(), shuffle=True, generator=torch.Generator().manual_seed(7), backend="process"
    )
    assert got == _epoch(plain)
    assert HEAD_NOTE not in _notes(plain)
    assert sorted(i for batch in got for i in batch[0]) == list(range(64))


def test_the_global_generators_drive_the_same_first_batch() -> None:
    """No generator: the base seed and the shuffle come from torch's global generator, which
    the child inherits as it stood at ``iter()``."""
    torch.manual_seed(3)
    got = _epoch(_loader(Augmented(), shuffle=True))
    torch.manual_seed(3)
    assert got == _epoch(_loader(Augmented(), shuffle=True, backend="process"))


def test_a_sampler_with_its_own_entropy_gets_its_first_batch_from_a_worker() -> None:
    loader = _loader(Augmented(), batch_size=1, batch_sampler=OwnEntropySampler(64, 8))
    got = _epoch(loader)
    assert sorted(i for batch in got for i in batch[0]) == list(range(64))
    notes = _notes(loader)
    assert HEAD_NOTE not in notes and FALLBACK_NOTE not in notes


def test_a_failed_sample_in_the_first_batch_is_recorded_by_the_worker_that_loads_it() -> None:
    loader = _loader(Augmented(bad=3), on_error="skip")
    got = _epoch(loader)
    assert FALLBACK_NOTE in _notes(loader)
    assert [f.index for f in loader.failures] == [3]
    assert sorted(i for batch in got for i in batch[0]) == [i for i in range(64) if i != 3]


def test_an_error_in_the_first_batch_keeps_its_type() -> None:
    loader = _loader(Augmented(bad=2))
    with pytest.raises(SampleError, match="sample 2 is corrupt"):
        next(iter(loader))


def test_a_head_start_past_its_deadline_is_stopped_and_a_worker_loads_the_batch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(head_mod, "HEAD_DEADLINE_S", 0.05)
    loader = _loader(Augmented(slow_first_s=0.5))
    got = _epoch(loader)
    assert FALLBACK_NOTE in _notes(loader)
    assert [i for batch in got for i in batch[0]] == list(range(64))


def test_the_workers_start_after_the_first_batch_and_a_state_saved_then_resumes_exactly() -> None:
    gen = torch.Generator().manual_seed(11)
    loader = _loader(Augmented(), shuffle=True, generator=gen)
    it = iter(loader)
    first = next(it)
    assert loader.stats().num_workers == 0  # no worker yet: they start at the next batch
    state = loader.state_dict()
    rest = [[b[0].tolist(), b[1].tolist(), b[2].tolist(), b[3].tolist()] for b in it]
    assert loader.stats().num_workers > 0
    resumed = _loader(Augmented(), shuffle=True, generator=torch.Generator())
    resumed.load_state_dict(state)
    assert _epoch(resumed) == rest
    assert sorted(first[0].tolist() + [i for b in rest for i in b[0]]) == list(range(64))


def test_an_epoch_left_after_its_first_batch_does_not_change_the_next() -> None:
    def second_epoch(**kwargs: Any) -> list[Any]:
        loader = _loader(
            Augmented(),
            shuffle=True,
            generator=torch.Generator().manual_seed(5),
            persistent_workers=True,
            **kwargs,
        )
        it = iter(loader)
        next(it)
        del it
        return _epoch(loader)

    assert second_epoch() == second_epoch(backend="process")


def test_no_head_start_with_a_worker_init_fn_or_a_resumed_epoch() -> None:
    loader = _loader(Augmented(), worker_init_fn=_noop)
    assert not HeadStart.eligible(loader)
    assert HEAD_NOTE not in (_epoch(loader) and _notes(loader))
    resumed = _loader(Augmented())
    it = iter(resumed)
    next(it)
    state = resumed.state_dict()
    del it
    fresh = _loader(Augmented())
    fresh.load_state_dict(state)
    assert not HeadStart.eligible(fresh)
    assert len(_epoch(fresh)) == 7


def _noop(worker_id: int) -> None:
    del worker_id


def test_an_iterator_dropped_before_its_first_batch_leaves_no_child() -> None:
    loader = _loader(Augmented(), persistent_workers=True)
    it = iter(loader)
    del it, loader
    gc.collect()  # the conftest then checks that no process or fd is left


@pytest.mark.parametrize("persistent", [False, True])
def test_an_epoch_left_after_its_first_batch_leaves_the_probe_answer_to_the_next(
    persistent: bool,
) -> None:
    """Persistent workers: the kept iterator takes the answer as the next epoch starts its
    workers; else the dropped iterator leaves it to the loader, for the next iter()."""
    loader = _loader(Augmented(), persistent_workers=persistent)
    it = iter(loader)
    next(it)
    del it
    gc.collect()
    assert len(_epoch(loader)) == 8
    notes = loader.stats().notes
    assert notes[0].startswith("backend="), notes  # the probe's answer
    assert (HEAD_NOTE in " | ".join(notes)) == persistent  # (an iterator's notes are its own)


@pytest.mark.measures  # asserts a measured probe decision
def test_cheap_batches_load_in_the_main_process_without_a_head_start(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(head_mod, "HEAD_MIN_BATCH_S", SHIPPED_THRESHOLD_S)
    loader = stoker.DataLoader(list(range(256)), batch_size=4, num_workers="auto")
    assert [int(x) for b in loader for x in b] == list(range(256))
    assert loader.stats().backend == "inline"
    assert HEAD_NOTE not in _notes(loader)


@pytest.mark.measures  # asserts a measured probe decision
def test_a_main_process_answer_after_a_head_start_keeps_the_workers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Batches the warm-up found slow (forced here) but the probe found cheap: the first batch
    came from the head start, and the workers load the rest, as the notes say (with
    num_workers="auto" the main process would load the first batch itself: not here)."""
    monkeypatch.setattr(MainFirst, "eligible", staticmethod(lambda loader: False))
    loader = stoker.DataLoader(list(range(256)), batch_size=4, num_workers="auto")
    assert [int(x) for b in loader for x in b] == list(range(256))
    notes = _notes(loader)
    assert loader.stats().backend == "process"
    assert HEAD_NOTE in notes and "workers all the same" in notes


def test_the_probe_asks_for_a_head_start_once_and_only_for_slow_batches() -> None:
    from torch.utils.data._utils.collate import default_collate

    from stoker.autotune._probe import choose_backend_isolated

    calls: list[float] = []
    for threshold in (0.0, 1e9):
        choose_backend_isolated(
            Augmented(),
            default_collate,
            8,
            False,
            on_slow_batch=(threshold, lambda t=threshold: calls.append(t)),
        )
    assert calls == [0.0]


class StuckAfterTwo(Dataset[int]):
    """Two samples of 2 ms each (a batch of 64 at that pace takes 128 ms), then every sample
    blocks for good: only a mark written after two samples can come."""

    def __init__(self) -> None:
        self.calls = 0

    def __len__(self) -> int:
        return 256

    def __getitem__(self, index: int) -> int:
        self.calls += 1
        time.sleep(0.002 if self.calls <= 2 else 3600)
        return index


def test_the_probe_marks_slow_batches_after_two_samples_not_a_whole_batch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from torch.utils.data._utils.collate import default_collate

    import stoker.autotune._probe as probe_mod

    # A mark that waited for the warm-up's batch would never come: the wait ends at this
    # deadline, with no mark, and the child is stopped.
    monkeypatch.setattr(probe_mod, "PROBE_DEADLINE_S", 5.0)
    probe = probe_mod.ProbeChild.start(StuckAfterTwo(), default_collate, 64, True, 0.025)
    try:
        assert probe.wait_slow()
    finally:
        probe.close()


def test_the_loaders_timeout_bounds_the_wait_for_the_head_starts_batch() -> None:
    from stoker.errors import WorkerTimeoutError

    loader = stoker.DataLoader(StuckAfterTwo(), batch_size=4, num_workers="auto", timeout=0.5)
    it = iter(loader)
    with pytest.raises(WorkerTimeoutError, match=r"first batch \(sample indices \[0, 1, 2, 3\]\)"):
        next(it)
    del it, loader
    gc.collect()


class ProbeWaitsForTheHeadStart(Dataset[int]):
    """In the probe's child (no worker info) the first sample waits, up to ``wait_s`` (under
    the probe's deadline), for the file the head start's child (a worker's info) writes as it
    loads, and says in another file if it waited in vain: a head start forked only after the
    probe's mark would never write it in time."""

    def __init__(self, folder: str, wait_s: float = 5.0) -> None:
        self.folder = folder
        self.wait_s = wait_s
        self.parent = os.getpid()

    def __len__(self) -> int:
        return 64

    def __getitem__(self, index: int) -> int:
        started = os.path.join(self.folder, "head-started")
        if os.getpid() != self.parent:
            if torch.utils.data.get_worker_info() is not None:
                open(started, "a").close()
            elif not os.path.exists(os.path.join(self.folder, "probe-began")):
                open(os.path.join(self.folder, "probe-began"), "a").close()
                end = time.monotonic() + self.wait_s
                while not os.path.exists(started) and time.monotonic() < end:
                    time.sleep(0.005)
                if not os.path.exists(started):
                    open(os.path.join(self.folder, "waited-in-vain"), "a").close()
        time.sleep(0.002)  # a batch of 8 at this pace takes over the shipped threshold
        return index


def test_the_head_start_loads_beside_the_probe_before_it_marks_slow_batches(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    monkeypatch.setattr(head_mod, "HEAD_MIN_BATCH_S", SHIPPED_THRESHOLD_S)
    loader = _loader(ProbeWaitsForTheHeadStart(str(tmp_path)))
    assert [int(x) for b in loader for x in b] == list(range(64))
    assert (tmp_path / "probe-began").exists() and (tmp_path / "head-started").exists()
    assert not (tmp_path / "waited-in-vain").exists()
    assert HEAD_NOTE in _notes(loader)


class RecordsNice(Dataset[int]):
    """Appends ``probe N`` (no worker info: the backend probe's child) or ``loader N`` (the
    head start's child, a worker) to a file, N the nice value it loads at."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.parent = os.getpid()

    def __len__(self) -> int:
        return 64

    def __getitem__(self, index: int) -> int:
        if os.getpid() != self.parent:
            who = "probe" if torch.utils.data.get_worker_info() is None else "loader"
            with open(self.path, "a") as f:
                f.write(f"{who} {os.nice(0)}\n")
        _spin(SPIN_S)
        return index


def test_the_probe_leaves_the_cores_to_the_head_start_once_it_marked_slow_batches(
    tmp_path: Any,
) -> None:
    from stoker.autotune._probe import PROBE_NICE_AFTER_MARK

    path = tmp_path / "nice"
    loader = _loader(RecordsNice(str(path)), worker_nice=0)
    assert [int(x) for b in loader for x in b] == list(range(64))
    assert HEAD_NOTE in _notes(loader)
    seen: dict[str, set[int]] = {"probe": set(), "loader": set()}
    for line in path.read_text().splitlines():
        who, nice = line.split()
        seen[who].add(int(nice))
    mine = os.nice(0)
    assert seen["loader"] == {mine}  # the head start's child (and the workers, at nice 0)
    assert max(seen["probe"]) == min(19, mine + PROBE_NICE_AFTER_MARK)


class ProbeStartsOnASlowSample(Dataset[int]):
    """The probe's child (no worker info) begins with a sample that waits ``wait_s``, then
    says so in a file; elsewhere each sample takes 4 ms (a batch of 8: over the shipped
    threshold)."""

    def __init__(self, folder: str, wait_s: float = 3.0) -> None:
        self.done = os.path.join(folder, "probe-slow-sample-done")
        self.wait_s = wait_s
        self.parent = os.getpid()
        self.probed = False

    def __len__(self) -> int:
        return 64

    def __getitem__(self, index: int) -> int:
        if os.getpid() != self.parent and torch.utils.data.get_worker_info() is None:
            if not self.probed:
                self.probed = True
                time.sleep(self.wait_s)
                open(self.done, "a").close()
        _spin(0.004)
        return index


def test_a_slow_batch_from_the_head_start_does_not_wait_for_the_probes_mark(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    monkeypatch.setattr(head_mod, "HEAD_MIN_BATCH_S", SHIPPED_THRESHOLD_S)
    dataset = ProbeStartsOnASlowSample(str(tmp_path))
    loader = _loader(dataset)
    it = iter(loader)
    first = next(it)
    assert not os.path.exists(dataset.done)  # the probe is still on its first sample
    assert first.tolist() == list(range(8)) and HEAD_NOTE in _notes(loader)
    assert [int(x) for b in it for x in b] == list(range(8, 64))


class Wide(Dataset[torch.Tensor]):
    """16 KiB samples: a batch of 8 takes 128 KiB in a slot."""

    def __len__(self) -> int:
        return 32

    def __getitem__(self, i: int) -> torch.Tensor:
        _spin(SPIN_S)
        return torch.full((4096,), float(i))


def test_the_workers_size_their_first_slot_from_the_head_starts_batch() -> None:
    loader = _loader(Wide())
    it = iter(loader)
    first = next(it)
    rest = list(it)
    assert HEAD_NOTE in _notes(loader)
    # What the batch took in its memory file, header included: what a worker's slot needs.
    told = it._spec_base["slot_bytes"]  # type: ignore[attr-defined]
    assert 8 * 4096 * 4 <= told < 2 * 8 * 4096 * 4
    got = torch.cat([first, *rest])
    assert torch.equal(got[:, 0], torch.arange(32, dtype=torch.float32))
    assert torch.equal(got, got[:, :1].expand(32, 4096))


def test_without_a_head_start_the_workers_learn_the_slot_size_from_their_first_batch() -> None:
    loader = _loader(Wide(), backend="process")
    it = iter(loader)
    assert it._spec_base["slot_bytes"] == 0  # type: ignore[attr-defined]
    assert torch.equal(torch.cat(list(it))[:, 0], torch.arange(32, dtype=torch.float32))
