"""device= on a CPU-only machine, and the device stage's ordering logic.

The CUDA parts (side stream, events, record_stream, cudaHostRegister) need a GPU: their tests
are marked `gpu` and skip here (tests/test_device_gpu.py).
"""

from __future__ import annotations

import warnings

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

    return DeviceStage(src.pull, issue, complete, lambda h: True, depth=depth), log


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
