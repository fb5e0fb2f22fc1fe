"""Helpers shared by the measurement scripts."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

import torch

from stoker.bench._workloads import consume


def endless_sampler(dataset: Any) -> torch.utils.data.RandomSampler:
    """Random indices with replacement, seeded, effectively without end."""
    return torch.utils.data.RandomSampler(
        dataset, replacement=True, num_samples=10**9, generator=torch.Generator().manual_seed(0)
    )


def rate(make: Callable[[], Iterable[Any]], seconds: float, warmup: int = 4) -> float:
    """Samples per second of the iterable ``make()`` builds, after ``warmup`` batches."""
    loader = make()
    it = iter(loader)
    for _ in range(warmup):
        consume(next(it))
    samples = 0
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        samples += consume(next(it))
    result = samples / (time.perf_counter() - t0)
    del it, loader
    return result
