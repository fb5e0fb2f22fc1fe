"""torch's rules for datapipes, kept in stoker's workers: one shared seed per epoch, and sharding.

torch seeds the random pipes of an ``IterDataPipe`` (``shuffle()``) in every worker from one
seed per epoch, drawn in the main process from the loader's ``generator`` (or the global
generator), so that a shuffle before ``sharding_filter()`` orders the stream identically in
every worker and each worker keeps a disjoint share of it; and it shards the graph over the
workers before ``worker_init_fn`` runs. stoker's workers do the same: the dataset they get
is :class:`SeededDatapipe`, which applies the epoch's seed whenever an epoch's iteration
starts, and the seed of each later epoch reaches persistent workers as a changed attribute.
A datapipe's order is therefore torch's for the same seed and ``num_workers``; stoker's
per-batch reseeding of the global generators does not touch the pipes' own generators.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from torch.utils.data import IterDataPipe, MapDataPipe
from torch.utils.data.dataloader import _sharding_worker_init_fn
from torch.utils.data.datapipes.datapipe import _IterDataPipeSerializationWrapper
from torch.utils.data.graph_settings import apply_random_seed

__all__ = ["SeededDatapipe", "next_epoch_seed", "seeded_per_epoch", "sharding_worker_init"]


class SeededDatapipe(_IterDataPipeSerializationWrapper):
    """torch's serialization wrapper of an ``IterDataPipe`` that seeds the graph's random pipes
    from :attr:`shared_seed` each time iteration starts.

    Args:
        datapipe: the pipe (not wrapped).
        seed: the first epoch's shared seed.
    """

    def __init__(self, datapipe: IterDataPipe[Any], seed: int) -> None:
        super().__init__(datapipe)
        # (epoch turn, seed): the turn makes each epoch's value differ from the last one even
        # when the seed repeats, so persistent workers are sent it (see workers._epoch_sync).
        self.shared_seed: tuple[int, int] = (0, int(seed))

    def __iter__(self) -> SeededDatapipe:
        rng = torch.Generator()
        rng.manual_seed(self.shared_seed[1])
        apply_random_seed(self._datapipe, rng)
        self._datapipe_iter = iter(self._datapipe)
        return self

    def __getstate__(self) -> Any:
        return super().__getstate__(), self.shared_seed

    def __setstate__(self, state: Any) -> None:
        wrapped, self.shared_seed = state
        super().__setstate__(wrapped)
        self._datapipe_iter = None


def seeded_per_epoch(dataset: Any, seed: int | None) -> Any:
    """The dataset to give the workers: a :class:`SeededDatapipe` for torch's wrapped
    ``IterDataPipe`` (``seed``: the iterator's first shared seed), else ``dataset``."""
    if seed is None or type(dataset) is not _IterDataPipeSerializationWrapper:
        return dataset
    return SeededDatapipe(dataset._datapipe, seed)


def next_epoch_seed(dataset: Any, seed: int | None) -> None:
    """Set the shared seed of the epoch about to start (a no-op for other datasets)."""
    if isinstance(dataset, SeededDatapipe) and seed is not None:
        dataset.shared_seed = (dataset.shared_seed[0] + 1, int(seed))


def sharding_worker_init(
    dataset: Any, worker_init_fn: Callable[[int], None] | None, world_size: int, rank: int
) -> Callable[[int], None] | None:
    """torch's worker init for a datapipe (shard the graph over ranks and workers, then call
    ``worker_init_fn``); ``worker_init_fn`` itself for other datasets."""
    if not isinstance(dataset, (IterDataPipe, MapDataPipe)):
        return worker_init_fn
    return functools.partial(_sharding_worker_init_fn, worker_init_fn, world_size, rank)
