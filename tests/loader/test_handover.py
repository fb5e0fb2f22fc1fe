"""Processes first, threads once the training loop leaves the GIL free (stoker.loader._switch): real
worker processes hand over to real threads mid-epoch without losing, repeating or reordering
a batch, and a loop that holds the GIL keeps its processes."""

from __future__ import annotations

import statistics
import time

import pytest
import torch
from torch.utils.data import Dataset
from torch.utils.data._utils.collate import default_collate

import stoker
from _machine import measures_the_machine
from stoker.autotune import _gil, _scaling
from stoker.autotune._gil import GilMeter
from stoker.autotune._probe import choose_backend
from stoker.loader import _head, _switch
from stoker.loader._main_first import MainFirst


class Waiting(Dataset):
    """Each sample waits 4 ms without the GIL (storage-like) and is a small tensor."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        time.sleep(0.004)
        return torch.full((64,), float(i))


class GilBound(Dataset):
    def __len__(self) -> int:
        return 10_000

    def __getitem__(self, i: int) -> int:
        return sum(range(20_000)) + i


def _spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        sum(range(100))


@pytest.fixture
def quick(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_scaling, "CONTROL_INTERVAL_S", 0.05)
    monkeypatch.setattr(_gil, "READING_WAKEUPS", 5)
    monkeypatch.setattr(_switch, "HANDOVER_READINGS", 3)


@measures_the_machine
def test_the_probe_says_when_threads_were_chosen_to_cover_waits() -> None:
    detail: dict[str, object] = {}
    backend, _ = choose_backend(Waiting(10_000), default_collate, 8, False, detail=detail)
    assert backend == "thread" and detail.get("waits") is True
    detail = {}
    backend, _ = choose_backend(GilBound(), default_collate, 8, False, detail=detail)
    assert backend == "process" and "waits" not in detail


@measures_the_machine
def test_the_gil_meter_reads_a_free_gil_low_and_a_held_one_high() -> None:
    meter = GilMeter(period_s=0.005, wakeups=5)
    meter.start()
    try:
        time.sleep(0.3)
        free = meter.readings()
        _spin(0.6)  # the main thread runs Python without a pause: the sentinel waits for it
        held = meter.readings()[len(free) + 1 :]  # the reading that straddles both is left out
    finally:
        meter.close()
    assert free and held, (free, held)
    assert max(free) < 0.5 < min(held), (free, held)


@pytest.mark.measures  # a real GIL meter must finish readings in the window
def test_a_disturbance_takes_out_the_readings_it_touched_and_the_next() -> None:
    meter = GilMeter(period_s=0.05, wakeups=2)  # a reading every 0.1 s or more
    meter.start()
    try:
        time.sleep(0.45)
        before = meter.readings()
        since = time.perf_counter() - 0.15
        meter.disturb(since)
        kept = meter.readings()
        time.sleep(0.15)  # the reading under way ends in this time (or later), and is skipped
        after = meter.readings()
        time.sleep(0.25)
        later = meter.readings()
    finally:
        meter.close()
    assert len(before) >= 2 and len(before) - 2 <= len(kept) < len(before), (before, kept)
    assert after == kept
    assert len(later) > len(kept)  # readings go on after the one skipped


@measures_the_machine
def test_processes_hand_over_to_threads_mid_epoch_without_losing_a_batch(quick: None) -> None:
    # Batches of 16 arrive at a pace a training loop would take them (the main process's own
    # work receiving hundreds of tiny batches a second from processes would read as a busy GIL).
    n, bs = 1200, 16
    loader = stoker.DataLoader(Waiting(n), batch_size=bs, num_workers="auto")
    kept = []
    for epoch in range(3):  # the handover comes in the first epoch or the next (persistent)
        seen = []
        for batch in loader:
            seen.extend(int(v) for v in batch[:, 0])
            if epoch == 0:
                kept.append(batch)  # views of process workers' slots stay valid after they go
        assert seen == list(range(n)), f"epoch {epoch}"
    stats = loader.stats()
    assert stats.backend == "thread", stats.notes
    notes = " | ".join(stats.notes)
    assert "processes first" in notes and "handing over to threads" in notes, notes
    assert "process workers ->" in notes, notes
    for k, batch in enumerate(kept):
        expected = torch.arange(k * bs, (k + 1) * bs, dtype=torch.float32)
        assert torch.equal(batch[:, 0], expected) and torch.equal(batch[:, -1], expected)
    del loader


@measures_the_machine
def test_a_loop_that_holds_the_gil_keeps_its_processes(quick: None) -> None:
    n = 600
    loader = stoker.DataLoader(Waiting(n), batch_size=8, num_workers="auto")
    seen = []
    for batch in loader:
        seen.extend(int(v) for v in batch[:, 0])
        _spin(0.01)  # a training step in pure Python
    assert seen == list(range(n))
    stats = loader.stats()
    notes = " | ".join(stats.notes)
    assert stats.backend == "process" and "holds the GIL" in notes, notes
    del loader


@measures_the_machine
def test_a_loop_that_launches_small_ops_keeps_its_processes(quick: None) -> None:
    # A GPU-like step: about 2 ms of small torch ops (each gives the GIL up, so the GIL reads
    # free), then a 20 ms device wait; thread workers would take the GIL from every launch.
    n = 600
    loader = stoker.DataLoader(Waiting(n), batch_size=8, num_workers="auto")
    x = torch.zeros(16)
    seen = []
    for batch in loader:
        seen.extend(int(v) for v in batch[:, 0])
        end = time.perf_counter() + 0.002
        while time.perf_counter() < end:
            x.add_(1.0)
        time.sleep(0.02)
    assert seen == list(range(n))
    stats = loader.stats()
    notes = " | ".join(stats.notes)
    assert stats.backend == "process" and "launches ops" in notes, notes
    del loader


@measures_the_machine
def test_a_step_computing_on_intra_op_threads_keeps_its_processes(quick: None) -> None:
    # A CPU training step: matrix products on torch's intra-op threads (they release the GIL
    # for milliseconds) while the samples wait: processes below the step's priority leave it
    # its cores, where threads would share them.
    if torch.get_num_threads() < 2:
        pytest.skip("needs torch's intra-op threads on two cores")
    n = 600
    loader = stoker.DataLoader(Waiting(n), batch_size=8, num_workers="auto")
    a = torch.randn(768, 768)
    seen = []
    for batch in loader:
        seen.extend(int(v) for v in batch[:, 0])
        a @ a  # about 10 ms on two cores
    assert seen == list(range(n))
    stats = loader.stats()
    notes = " | ".join(stats.notes)
    assert stats.backend == "process" and "more cores" in notes and "processes stay" in notes
    del loader


@measures_the_machine
def test_the_meter_leaves_out_the_loops_cpu_spent_in_stoker() -> None:
    whole = GilMeter(period_s=0.005, wakeups=5)
    # Every CPU second of this thread said to be stoker's own: the loop's share reads 0.
    without = GilMeter(period_s=0.005, wakeups=5, own_cpu=lambda spent: spent)
    whole.start()
    without.start()
    try:
        _spin(0.5)
    finally:
        whole.close()
        without.close()
    assert whole.loop_cpu() and without.loop_cpu()
    assert max(without.loop_cpu()) < 0.1 < 0.5 < statistics.median(whole.loop_cpu()), (
        whole.loop_cpu(),
        without.loop_cpu(),
    )


class Slow(Dataset):
    """Each sample waits 10 ms: a process worker is mid-batch when the handover comes."""

    def __len__(self) -> int:
        return 160

    def __getitem__(self, i: int) -> torch.Tensor:
        time.sleep(0.01)
        return torch.full((4,), float(i))


@pytest.mark.measures  # the real probe must choose threads to cover waits
def test_the_handover_takes_back_queued_batches_and_those_being_loaded(
    quick: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Waiting for the processes' batches in flight to be delivered held the threads back
    (0.4 s on the bench's heavytail): the handover takes back the tasks no process started,
    the processes give up the batches they load at their next sample, and threads load both;
    the batches the processes finished are delivered from their slots."""
    monkeypatch.setattr(_switch, "HANDOVER_READINGS", 10**6)  # decided below, not by the meter
    # The pool must run from iter() on (no first batch loaded beside the probe first, nor in
    # the main process before it).
    monkeypatch.setattr(_head, "HEAD_MIN_BATCH_S", float("inf"))
    monkeypatch.setattr(MainFirst, "eligible", staticmethod(lambda loader: False))
    # Four batches in flight per process: tasks stay queued behind the ones being loaded
    # however late the processes start (one CI run had none queued with the tuned depth).
    loader = stoker.DataLoader(Slow(), batch_size=8, num_workers="auto", prefetch_factor=4)
    it = iter(loader)
    try:
        assert it._handover.state == "watch" and it._backend == "process"
        # The pool starts at the watch's size and stays there until it is decided.
        controller = it._scaler.controller
        workers = len(it._pool.active)
        assert workers == _switch.watch_workers(10**6)
        assert controller.min_workers == controller.max_workers == workers
        seen = [int(v) for v in next(it)[:, 0]]
        time.sleep(0.03)  # every process is inside a batch
        given_up: list[int] = []
        handover = it._handover
        take_back = handover.take_back
        monkeypatch.setattr(
            handover,
            "take_back",
            lambda msg, *rest: (given_up.append(msg.idx), take_back(msg, *rest)),
        )
        monkeypatch.setattr(_switch, "HANDOVER_READINGS", 1)
        monkeypatch.setattr(handover.meter, "readings", lambda: [0.0])
        it._watch_gil(None)  # the loop leaves the GIL free: hand over
        assert handover.state == "drain"
        assert handover.handback  # the queued tasks were taken back
        # Not queued, not answered: being loaded (or sent) when it was decided.
        loading = set(it._ctx.book.pending()) - set(handover.handback)
        seen += [int(v) for batch in it for v in batch[:, 0]]
        assert seen == list(range(160))
        assert given_up and set(given_up) <= loading, (given_up, loading)
        assert it._backend == "thread" and not handover.handback
    finally:
        it._shutdown()
    del it, loader
