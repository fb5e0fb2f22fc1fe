"""Synthetic iterables with exact timings, driven by a fake clock (no sleeping)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch


class FakeClock:
    """A clock that only moves when told to."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def producer(clock: FakeClock, waits: Sequence[float], batch: int = 4) -> Iterator[torch.Tensor]:
    """Yields ``len(waits)`` batches; producing batch ``i`` takes ``waits[i]`` seconds."""
    for i, w in enumerate(waits):
        clock.advance(w)
        yield torch.full((batch, 3), float(i))


def consume(iterable, clock: FakeClock, computes: Sequence[float] | float) -> list:
    """Iterates ``iterable``, spending ``computes[i]`` seconds on batch ``i``."""
    out = []
    for i, b in enumerate(iterable):
        out.append(b)
        clock.advance(computes if isinstance(computes, float) else computes[i])
    return out


class SlowStart:
    """An iterable whose ``iter()`` takes ``iter_s`` (workers starting), then yields as
    :func:`producer` does."""

    def __init__(self, clock: FakeClock, iter_s: float, waits: Sequence[float]) -> None:
        self.clock, self.iter_s, self.waits = clock, iter_s, waits

    def __iter__(self) -> Iterator[torch.Tensor]:
        self.clock.advance(self.iter_s)
        return producer(self.clock, self.waits)
