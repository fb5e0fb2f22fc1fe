"""ShardStream: iterate a ShardDataset shard by shard, for storage that prefers sequential reads.

Each epoch the shard order is shuffled (seeded by ``seed`` and the epoch); shards are dealt to
the DataLoader's workers (``torch.utils.data.get_worker_info``), each to the worker with the
fewest samples so far, so workers get balanced whole shards. With fewer shards than workers,
the samples are split into equal contiguous ranges instead. A shuffle buffer mixes samples
across the shards a worker reads.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np
import torch.utils.data as tud

from stoker.errors import ConfigError

if TYPE_CHECKING:
    from stoker.shards._dataset import ShardDataset

__all__ = ["ShardStream", "assign_spans"]


def assign_spans(
    sizes: list[int], order: list[int], workers: int
) -> list[list[tuple[int, int, int]]]:
    """Deal shards, in ``order``, to ``workers`` as ``(shard, start, stop)`` spans.

    Args:
        sizes: samples per shard.
        order: shard numbers in the order they are dealt.
        workers: number of workers (>= 1).

    Returns:
        Per worker, its spans of local sample indices; together they cover every sample once.
    """
    spans: list[list[tuple[int, int, int]]] = [[] for _ in range(workers)]
    if len(order) >= workers:
        load = [0] * workers
        for shard in order:
            w = min(range(workers), key=lambda k: (load[k], k))
            spans[w].append((shard, 0, sizes[shard]))
            load[w] += sizes[shard]
        return spans
    # Fewer shards than workers: cut the concatenation into equal contiguous ranges.
    total = sum(sizes[s] for s in order)
    bounds = [total * w // workers for w in range(workers + 1)]
    pos = 0
    for shard in order:
        lo, hi = pos, pos + sizes[shard]
        for w in range(workers):
            a, b = max(lo, bounds[w]), min(hi, bounds[w + 1])
            if a < b:
                spans[w].append((shard, a - lo, b - lo))
        pos = hi
    return spans


class ShardStream(tud.IterableDataset[Any]):
    """Sequential, shard-shuffled iteration over a :class:`ShardDataset`.

    Create it with :meth:`ShardDataset.stream`. Every sample is yielded exactly once per epoch
    across the workers. Call :meth:`set_epoch` (``stoker.DataLoader`` does, in every worker) for
    a new order each epoch; without it, each ``iter()`` in the same process advances the epoch.

    Raises:
        ConfigError: if ``buffer_size`` is not an int >= 1.
    """

    def __init__(
        self, dataset: ShardDataset, *, shuffle: bool, buffer_size: int, seed: int
    ) -> None:
        if not isinstance(buffer_size, int) or buffer_size < 1:
            raise ConfigError(f"`buffer_size` must be an int >= 1. Found: {buffer_size!r}.")
        self.dataset = dataset
        self.shuffle = shuffle
        self.buffer_size = buffer_size
        self.seed = seed
        self._epoch: int | None = None
        self._iterations = 0

    def set_epoch(self, epoch: int) -> None:
        """Fix the epoch that seeds the next iteration's order."""
        self._epoch = epoch

    def __len__(self) -> int:
        return len(self.dataset)

    def _spans(self, epoch: int, worker: int, workers: int) -> list[tuple[int, int, int]]:
        sizes = list(self.dataset.shard_sizes)
        order = list(range(len(sizes)))
        if self.shuffle:
            order = [
                int(i) for i in np.random.default_rng([self.seed, epoch]).permutation(len(sizes))
            ]
        return assign_spans(sizes, order, workers)[worker]

    def __iter__(self) -> Iterator[Any]:
        info = tud.get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        epoch = self._epoch if self._epoch is not None else self._iterations
        self._iterations += 1
        raw = self._raw(self._spans(epoch, worker, workers))
        if not self.shuffle:
            yield from (self.dataset.finish(s) for s in raw)
            return
        rng = np.random.default_rng([self.seed, epoch, worker])
        buffer: list[dict[str, Any]] = []
        for sample in raw:
            if len(buffer) < self.buffer_size:
                buffer.append(sample)
                continue
            k = int(rng.integers(len(buffer)))
            buffer[k], sample = sample, buffer[k]
            yield self.dataset.finish(sample)
        rng.shuffle(buffer)
        yield from (self.dataset.finish(s) for s in buffer)

    def _raw(self, spans: list[tuple[int, int, int]]) -> Iterator[dict[str, Any]]:
        for shard, start, stop in spans:
            first = self.dataset.shard_range(shard).start
            for local in range(start, stop):
                yield self.dataset.raw(first + local)
