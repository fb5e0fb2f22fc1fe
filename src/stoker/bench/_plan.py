"""How long and how often the bench measures, and the sampler every contender shares."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Protocol

import torch
import torch.utils.data as tud

from stoker.bench._contenders import ContenderSpec
from stoker.errors import ConfigError

__all__ = ["Plan", "Progress", "Report", "SeededSampler"]

Report = Callable[[str, int], None]
"""``report(message, steps)``: the harness finished ``steps`` more steps."""


class Progress(Protocol):
    """Receives the bench's progress (the CLI draws a progress bar with it)."""

    def start(self, total: int) -> None:
        """The run has ``total`` steps (timed runs, grid points, ideal measurements)."""

    def advance(self, message: str, steps: int = 1) -> None:
        """``steps`` more steps are done; ``message`` says what just happened (may be "")."""


@dataclass(frozen=True)
class Plan:
    """How long and how often to measure.

    Attributes:
        repeats: timed runs per contender (>= 1).
        run_s: target seconds of a time-bounded run.
        warmup_s: seconds of warm-up for iterable datasets (map-style datasets warm up with
            one complete batch per worker instead).
        grid_run_s: target seconds of a grid-search run.
        ideal_s: seconds of single-process measurement for the ideal.
        grid_workers: torch ``num_workers`` values the grid tries.
        grid_prefetch: torch ``prefetch_factor`` values the grid tries.
        grid_note: how the grid was reduced, if it was.
        stoker_workers: stoker's ``num_workers``.
        cores: usable cores.
        multiprocessing_context: start method for every loader with workers (``None``: default).
        stoker_auto: also measure stoker with ``num_workers="auto"`` (full mode).
        stoker_watched: also measure stoker wrapped in ``stoker.watch`` (full mode).
        auto_settle_s: warm-up seconds of the ``num_workers="auto"`` contender, in which its
            controller settles (its timed runs then measure where it settled; how fast it
            gets there is measured by the ramp runs).
        ramp_s: seconds of each ramp run of ``num_workers="auto"`` (from 1 worker and from
            16; 0 skips them).
        fill_s: seconds at the start of each time-bounded run's epoch that are not timed:
            the loader fills its empty pipeline then (how soon it delivers shows in the first
            batch's latency). A training epoch lasts minutes, where the fill hardly counts;
            in a 3 s run timed from ``iter()`` it weighs about 100 times more. Measured on
            the bench's heavytail, 2 cores: torch with 8 workers (first batch 0.43 s, all 8
            finishing together) read 1,180 samples/s timed from ``iter()`` and 1,451 with
            ``fill_s=0.5`` (full benches, 5 repeats).
    """

    repeats: int
    run_s: float
    warmup_s: float
    grid_run_s: float
    ideal_s: float
    grid_workers: tuple[int, ...]
    grid_prefetch: tuple[int, ...]
    grid_note: str
    stoker_workers: int
    cores: int
    multiprocessing_context: str | None = None
    stoker_auto: bool = False
    stoker_watched: bool = False
    auto_settle_s: float = 3.0
    ramp_s: float = 0.0
    fill_s: float = 0.0

    def __post_init__(self) -> None:
        if self.repeats < 1:
            raise ConfigError(f"`repeats` must be >= 1. Found: {self.repeats!r}.")
        for name in (
            "run_s",
            "warmup_s",
            "grid_run_s",
            "ideal_s",
            "auto_settle_s",
            "ramp_s",
            "fill_s",
        ):
            if getattr(self, name) < 0:
                raise ConfigError(f"`{name}` must be >= 0. Found: {getattr(self, name)!r}.")

    def grid(self) -> list[ContenderSpec]:
        specs = [ContenderSpec("torch", 0, roles=("torch-other",))]
        for nw in self.grid_workers:
            if nw > 0:
                specs += [
                    ContenderSpec("torch", nw, pf, True, roles=("torch-other",))
                    for pf in self.grid_prefetch
                ]
        return specs


class SeededSampler(tud.Sampler[int]):
    """Random indices (without replacement within each pass over the dataset).

    The n-th ``iter()`` draws from a generator seeded with ``(seed, n)``, so every contender
    sees the same sequence for its warm-up and for its timed run. The first ``iter()`` (the
    warm-up) yields ``first_samples`` indices, later ones ``num_samples``; ``len()`` is the
    length of the next ``iter()``.

    Args:
        n: dataset length (>= 1).
        num_samples: indices each ``iter()`` after the first yields.
        seed: base seed.
        first_samples: indices the first ``iter()`` yields. Default ``num_samples``.
    """

    def __init__(self, n: int, num_samples: int, seed: int, first_samples: int | None = None):
        if n < 1:
            raise ConfigError(f"the dataset must hold at least one sample. Found: {n!r}.")
        self.n, self.num_samples, self.seed = n, num_samples, seed
        self.first_samples = num_samples if first_samples is None else first_samples
        self._iters = 0

    def __len__(self) -> int:
        return self.first_samples if self._iters == 0 else self.num_samples

    def __iter__(self) -> Iterator[int]:
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + self._iters)
        left = len(self)
        self._iters += 1
        while left > 0:
            perm = torch.randperm(self.n, generator=gen)[:left].tolist()
            left -= len(perm)
            yield from perm
