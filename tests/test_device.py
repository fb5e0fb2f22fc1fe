"""device= on a CPU-only machine, and the device stage's ordering logic.

The CUDA parts (side stream, events, record_stream, cudaHostRegister) need a GPU: their tests
are marked `gpu` and skip here (tests/test_device_gpu.py).
"""

from __future__ import annotations

import gc
import multiprocessing
import os
import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch

import stoker
from stoker import device as device_mod
from stoker.device import DeviceStage, resolve_device


def test_cpu_device_is_a_no_op():
    assert resolve_device(None) is None
    assert resolve_device("cpu") is None
    loader = stoker.DataLoader(list(range(6)), batch_size=2, device="cpu")
    assert [b.tolist() for b in loader] == [[0, 1], [2, 3], [4, 5]]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only error")
def test_cuda_without_a_gpu_is_a_clear_error():
    with pytest.raises(stoker.ConfigError, match="CUDA is not available"):
        stoker.DataLoader([1, 2], device="cuda")


def test_bad_device_names_the_value():
    with pytest.raises(stoker.ConfigError, match="`device` must be"):
        stoker.DataLoader([1, 2], device="gpu-please")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only warning")
def test_pin_memory_without_accelerator_warns_once(monkeypatch):
    monkeypatch.setattr(device_mod, "_warned_pin", False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        stoker.DataLoader([1, 2], pin_memory=True)
        stoker.DataLoader([1, 2], pin_memory=True)
    ours = [w for w in caught if "stoker: `pin_memory=True`" in str(w.message)]
    assert len(ours) == 1 and "Drop `pin_memory`" in str(ours[0].message)


class _Source:
    """Host batches 0..n-1; batch `bad` raises."""

    def __init__(self, n: int, bad: int | None = None) -> None:
        self.n, self.bad, self.i = n, bad, 0
        self.pulled: list[int] = []

    def pull(self) -> tuple[int, int]:
        if self.i >= self.n:
            raise StopIteration
        i = self.i
        self.i += 1
        self.pulled.append(i)
        if i == self.bad:
            raise ValueError(f"batch {i}")
        return i, i


def _stage(src: _Source, depth: int) -> tuple[DeviceStage, list[str]]:
    log: list[str] = []

    def issue(host: int) -> list[int]:
        log.append(f"issue {host}")
        return [host]

    def complete(handle: list[int]) -> int:
        log.append(f"hand {handle[0]}")
        return handle[0] * 10

    return DeviceStage(src.pull, issue, complete, lambda h: True, lambda h: None, depth=depth), log


@pytest.mark.parametrize("depth", [1, 2, 3])
def test_stage_delivers_in_order_and_copies_ahead(depth):
    src = _Source(5)
    stage, log = _stage(src, depth)
    out = []
    while True:
        try:
            out.append(stage.next())
        except StopIteration:
            break
    assert out == [0, 10, 20, 30, 40]
    first_hand = log.index("hand 0")
    assert log[:first_hand] == [f"issue {i}" for i in range(min(depth, 5))]


def test_stage_raises_a_loader_error_in_its_turn():
    src = _Source(5, bad=2)
    stage, _ = _stage(src, depth=3)
    assert [stage.next(), stage.next()] == [0, 10]
    with pytest.raises(ValueError, match="batch 2"):
        stage.next()


def test_in_flight_batches_are_not_counted_as_delivered():
    src = _Source(6)
    stage, _ = _stage(src, depth=2)
    stage.next()
    assert stage.in_flight == [1, 2]


class _SlowCopies:
    """Copies that complete only when :meth:`wait` is called on them (a GPU queue behind the
    consumer's work); a handle is (epoch, host batch)."""

    def __init__(self) -> None:
        self.done: set[tuple[int, int]] = set()
        self.epoch = 0

    def issue(self, host: int) -> tuple[int, int]:
        return (self.epoch, host)

    def complete(self, handle: tuple[int, int]) -> int:
        return handle[1]

    def finished(self, handle: tuple[int, int]) -> bool:
        return handle in self.done

    def wait(self, handle: tuple[int, int]) -> None:
        self.done.add(handle)


def _slow_stage(
    copies: _SlowCopies, n: int, pending: list[tuple[int, int]] | None = None
) -> DeviceStage:
    src = _Source(n)
    return DeviceStage(
        src.pull, copies.issue, copies.complete, copies.finished, copies.wait, pending=pending
    )


def test_the_next_epoch_keeps_host_batches_whose_copies_are_still_running():
    copies = _SlowCopies()
    first = _slow_stage(copies, 3)
    assert [first.next(), first.next(), first.next()] == [0, 1, 2]
    with pytest.raises(StopIteration):
        first.next()
    # No copy has completed: every host batch (its slot) must outlive the epoch.
    assert sorted(first.pending()) == [(0, 0), (0, 1), (0, 2)]
    copies.epoch = 1
    second = _slow_stage(copies, 2, pending=first.pending())
    copies.done.add((0, 0))
    assert second.next() == 0
    # The completed copy is let go; the others are still held, beside the new epoch's.
    assert sorted(second.pending()) == [(0, 1), (0, 2), (1, 0), (1, 1)]


def test_close_waits_for_every_copy_in_flight_then_lets_go():
    copies = _SlowCopies()
    stage = _slow_stage(copies, 10, pending=[(9, 9)])
    stage.next()  # batch 0 handed over, 1 and 2 copied ahead
    assert sorted(stage.pending()) == [(0, 0), (0, 1), (0, 2), (9, 9)]
    stage.close()
    assert copies.done == {(0, 0), (0, 1), (0, 2), (9, 9)}
    assert stage.pending() == [] and stage.in_flight == []


class _Event:
    """A copy's event; freeing it in a forked child would run CUDA there (an abort)."""

    freed = 0

    def __del__(self) -> None:
        _Event.freed += 1


def _report_from_fork(child: Callable[[], str]) -> str:
    """Run ``child()`` in a forked child (which never returns into pytest); its report."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.write(write, child().encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write)
    with os.fdopen(read) as pipe:
        report = pipe.read()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    return report


def test_a_forked_child_neither_waits_on_nor_frees_an_inherited_stages_copies():
    waited: list[object] = []
    src = _Source(10)
    stage = DeviceStage(
        src.pull,
        lambda host: (host, _Event()),
        lambda handle: handle[0],
        lambda handle: False,
        waited.append,
    )
    stage.next()
    held = [stage]
    del stage

    def child() -> str:
        _Event.freed = 0
        held[0].close()
        held.clear()  # its last reference in the child, as a collection there would drop it
        gc.collect()
        return f"{len(waited)} {_Event.freed}"

    assert _report_from_fork(child) == "0 0"  # nothing waited on, no event freed
    stage = held[0]
    stage.close()  # in the process that made it: every copy in flight is waited on
    assert len(waited) == 3


def test_a_forked_child_never_collects_garbage_it_inherited_once_stages_were_made():
    # A cycle holding a CUDA object (here its stand-in), garbage in the parent but not yet
    # collected when a loader forks: collecting it in the child would free it there.
    DeviceStage(_Source(2).pull, lambda host: (host, None), lambda h: h[0], lambda h: True, None)
    thresholds = gc.get_threshold()
    gc.set_threshold(1_000_000)  # no automatic collection before the fork; still enabled
    try:
        cycle: list[object] = [_Event()]
        cycle.append(cycle)
        del cycle

        def child() -> str:
            _Event.freed = 0
            gc.collect()
            return f"{_Event.freed} {int(gc.isenabled())}"

        report = _report_from_fork(child)
        assert gc.isenabled()  # the parent's collector runs again after the fork
    finally:
        gc.set_threshold(*thresholds)
    assert report == "0 1"  # nothing freed there, and its collector on for its own objects
    _Event.freed = 0
    gc.collect()
    assert _Event.freed >= 1  # the parent collects it as usual


class _Loading(_Source):
    """Host batches that finish loading only when the test says so: ``loaded`` of them."""

    def __init__(self, n: int) -> None:
        super().__init__(n)
        self.loaded = 0

    def pull(self) -> tuple[int, int]:
        assert self.i < self.loaded or self.i >= self.n, f"batch {self.i} pulled before it loaded"
        return super().pull()

    def ready(self) -> bool:
        return self.i < self.loaded or self.i >= self.n


def test_stage_copies_ahead_only_the_batches_that_have_loaded():
    src = _Loading(5)
    stage, log = _stage(src, depth=2)
    stage._ready = src.ready
    src.loaded = 1
    assert stage.next() == 0  # batch 1 is still loading: not waited for
    assert src.pulled == [0] and stage.in_flight == []
    src.loaded = 3
    assert stage.next() == 10
    assert stage.in_flight == [2]  # copied ahead as soon as it had loaded
    src.loaded = 5
    assert [stage.next(), stage.next(), stage.next()] == [20, 30, 40]
    assert log.index("issue 4") < log.index("hand 3")
    with pytest.raises(StopIteration):
        stage.next()


def test_stage_raises_an_error_of_ready_in_its_turn():
    src = _Source(4)
    stage, _ = _stage(src, depth=2)

    def ready() -> bool:
        raise OSError("the workers' pipe broke")

    stage._ready = ready
    assert stage.next() == 0
    with pytest.raises(OSError, match="pipe broke"):
        stage.next()


class _HeldBack(torch.utils.data.Dataset):
    """Samples from ``free`` on wait for ``release`` (a process-shared event), and raise if it
    never comes."""

    def __init__(self, n: int, free: int, release: Any) -> None:
        self.n, self.free, self.release = n, free, release

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        if i >= self.free and not self.release.wait(10):
            raise RuntimeError(f"sample {i} was loaded before the test released it")
        return i


def _copy_stage(it: Any) -> DeviceStage:
    """A stage over a real iterator's host batches, copying nothing (no GPU here)."""
    return DeviceStage(
        it._next_host,
        lambda host: host,
        lambda handle: handle,
        lambda handle: True,
        lambda handle: None,
        ready=it._host_ready,
    )


def test_the_first_batch_on_the_device_does_not_wait_for_the_workers_next_ones():
    release = multiprocessing.get_context("fork").Event()
    ds = _HeldBack(16, free=2, release=release)
    loader = stoker.DataLoader(ds, batch_size=2, num_workers=2, multiprocessing_context="fork")
    it = iter(loader)
    stage = _copy_stage(it)
    try:
        assert stage.next().tolist() == [0, 1]  # batches 1 and 2 are held back meanwhile
        assert stage.in_flight == []
        release.set()
        rest = [stage.next().tolist() for _ in range(7)]
        assert rest == [[i, i + 1] for i in range(2, 16, 2)]
        with pytest.raises(StopIteration):
            stage.next()
    finally:
        release.set()
        it._shutdown()


def test_auto_workers_first_batch_on_the_device_starts_no_worker():
    ds = torch.utils.data.TensorDataset(torch.arange(40.0))
    loader = stoker.DataLoader(ds, batch_size=4, num_workers="auto")
    it = iter(loader)
    stage = _copy_stage(it)
    try:
        (first,) = stage.next()
        assert first.tolist() == [0.0, 1.0, 2.0, 3.0]
        # Loaded in the main process; the probe and the workers wait for the next call.
        assert stage.in_flight == [] and it._pool is None and it._deferred is not None
        rest = [stage.next()[0].tolist() for _ in range(9)]
        assert rest == [[float(i) for i in range(j, j + 4)] for j in range(4, 40, 4)]
        with pytest.raises(StopIteration):
            stage.next()
    finally:
        it._shutdown()
