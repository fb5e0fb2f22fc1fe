"""How long and how often the bench measures, and the sampler every contender shares."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Protocol

import torch
import torch.utils.data as tud

from stoker.bench._contenders import ContenderSpec
from stoker.errors import ConfigError

__all__ = ["Plan", "Progress", "Report", "SeededSampler", "peer_grid"]

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
        warm_up: warm each run's loader (grid, loader-only and training runs) up with an
            epoch before timing it; ``False`` (quick mode): the timed epoch is the loader's
            first, timed after its fill, as a run of a few seconds gets it (a warm-up costs
            each run a loader start and an abandoned epoch: 0.56 s a run for
            ``num_workers="auto"``, 16 s of a 105 s quick bench, scratch tl.py).
        prefetch_everywhere: try every ``grid_prefetch`` at every worker count; ``False``
            (quick mode): the first everywhere, the others only at ``stoker_workers`` (the
            same-workers row takes torch's better one there).
        grid_note: how the grid was reduced, if it was.
        stoker_workers: stoker's ``num_workers``.
        cores: usable cores.
        multiprocessing_context: start method for every loader with workers (``None``: default).
        stoker_auto: also measure stoker with ``num_workers="auto"`` (full mode).
        stoker_watched: also measure stoker wrapped in ``stoker.watch`` (full mode).
        auto_settle_s: warm-up seconds of the ``num_workers="auto"`` contender, in which its
            controller settles (its timed runs then measure where it settled; how fast it
            gets there is measured by the ramp runs); none without ``warm_up``.
        ramp_s: seconds of each ramp run of ``num_workers="auto"`` (from 1 worker and from
            16; 0 skips them).
        train_shapes: the ``train`` family's step shapes (``"gpu"``, ``"cpu"``; empty: none).
        train_run_s: target seconds of a timed training-step run.
        train_min_steps: steps a timed training-step run (and the fed-from-memory reference)
            takes at least, whatever ``train_run_s`` says: a rate read from a few slow steps
            is noise (jpeg's and shards' steps ran 7 to 10 to a 1.5 s window, heavytail's
            a batch with a 150 ms wait in one of two).
        peers: optional libraries whose grids run beside torch's (those installed).
        peer_threads: SPDL thread counts its grid tries.
        peer_prefetch: torchdata.nodes prefetch factors its grid tries (with torch's worker
            counts from 1).
        references: also time torch with no workers and torch's seed recipe (where neither
            is torch's grid best, quick mode leaves them out to finish in time).
        train_roles: the roles whose contenders feed the training step (None: every role
            the loader-only table shares with the train family; quick mode: auto and torch's
            best, since each train run starts a loader).
        fill_s: seconds at the start of each time-bounded run's epoch that are not timed:
            the loader fills its empty pipeline then (how soon it delivers shows in the first
            batch's latency). A training epoch lasts minutes, where the fill hardly counts
            (figures: benchmarks/README.md, "stoker bench").
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
    train_shapes: tuple[str, ...] = ()
    train_run_s: float = 1.0
    train_min_steps: int = 0
    peers: tuple[str, ...] = ()
    peer_threads: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
    peer_prefetch: tuple[int, ...] = (2, 4)
    references: bool = True
    train_roles: frozenset[str] | None = None
    prefetch_everywhere: bool = True
    warm_up: bool = True

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
            "train_run_s",
            "train_min_steps",
        ):
            if getattr(self, name) < 0:
                raise ConfigError(f"`{name}` must be >= 0. Found: {getattr(self, name)!r}.")

    def grid(self) -> list[ContenderSpec]:
        """torch's grid, then each installed peer's with no more points (its own knobs)."""
        specs = [ContenderSpec("torch", 0, roles=("torch-other",))]
        for nw in self.grid_workers:
            if nw > 0:
                specs += [
                    ContenderSpec("torch", nw, pf, True, roles=("torch-other",))
                    for k, pf in enumerate(self.grid_prefetch)
                    if k == 0 or self.prefetch_everywhere or nw == self.stoker_workers
                ]
        budget = len(specs)
        for library in self.peers:
            grid = peer_grid(library, self.grid_workers, self.peer_prefetch, self.peer_threads)
            specs += grid[:budget]
        return specs


def peer_grid(
    library: str, workers: tuple[int, ...], prefetch: tuple[int, ...], threads: tuple[int, ...]
) -> list[ContenderSpec]:
    """A peer's grid: SPDL over its thread counts, torchdata.nodes over worker processes
    (torch's worker counts from 1) x prefetch factors."""
    if library == "spdl":
        return [ContenderSpec("spdl", n, roles=("optional",)) for n in threads]
    if library == "torchdata":
        return [
            ContenderSpec("torchdata", nw, pf, roles=("optional",))
            for nw in workers
            if nw > 0
            for pf in prefetch
        ]
    raise ConfigError(f"no grid for library {library!r}: pick spdl or torchdata.")


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
        skip_first: start at the second pass (the first ``iter()`` is the timed one).
    """

    def __init__(
        self,
        n: int,
        num_samples: int,
        seed: int,
        first_samples: int | None = None,
        skip_first: bool = False,
    ):
        if n < 1:
            raise ConfigError(f"the dataset must hold at least one sample. Found: {n!r}.")
        self.n, self.num_samples, self.seed = n, num_samples, seed
        self.first_samples = num_samples if first_samples is None else first_samples
        self._skip = int(skip_first)
        self.passes = 0  # iter() calls so far

    def __len__(self) -> int:
        return self.first_samples if self.passes + self._skip == 0 else self.num_samples

    def __iter__(self) -> Iterator[int]:
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + self.passes + self._skip)
        left = len(self)
        self.passes += 1
        while left > 0:
            perm = torch.randperm(self.n, generator=gen)[:left].tolist()
            left -= len(perm)
            yield from perm
