"""ShardStream: iterate a ShardDataset shard by shard, for storage that prefers sequential reads.

Each epoch the shard order is shuffled (seeded by ``seed`` and the epoch); shards are dealt to
the DataLoader's workers (``torch.utils.data.get_worker_info``), each to the worker with the
fewest samples so far, so workers get balanced whole shards. With fewer shards than workers,
the samples are split into equal contiguous ranges instead. A shuffle buffer mixes samples
across the shards a worker reads; it yields from its first :data:`FIRST_YIELD_SAMPLES` on and
grows to its full size as it yields.

In a distributed job (``stoker.World``: the process group, else torchrun's environment) the
epoch's shard-ordered sample run is first cut into one equal contiguous range per rank (whole
shards where the counts allow), and each rank's range into equal ranges per worker. Every rank
then yields the same number of samples, and its workers the same counts as every other rank's,
so each rank runs the same number of steps: unequal step counts hang DDP at the end of an epoch.
"""

from __future__ import annotations

import os
from bisect import bisect_right
from collections.abc import Iterator
from itertools import accumulate
from typing import Any, Protocol

import numpy as np
import torch.utils.data as tud

from stoker.errors import ConfigError
from stoker.sampling import World
from stoker.sampling._partition import share_size


class ShardSource(Protocol):
    """What a stream reads from: a :class:`~stoker.shards.ShardDataset` (a protocol, so this
    module does not import the dataset that creates streams)."""

    @property
    def shard_sizes(self) -> tuple[int, ...]: ...

    def __len__(self) -> int: ...

    def shard_range(self, shard: int) -> range: ...

    def buffered(self, index: int) -> dict[str, Any]: ...

    def plan(self, shards: list[int]) -> None: ...

    def start_early(self, shards: list[int]) -> None: ...

    def finish(self, sample: dict[str, Any]) -> Any: ...


__all__ = ["FIRST_YIELD_SAMPLES", "ShardStream", "assign_spans", "rank_span", "split_even"]

Span = tuple[int, int, int]  # (shard, start, stop): local sample indices of one shard

# Samples the shuffle buffer holds before it yields its first: it then grows to `buffer_size`
# while it yields (two samples in for each out). Waiting for a full buffer of 1,000 held a
# cold remote epoch's first batch until each worker had downloaded its whole share.
FIRST_YIELD_SAMPLES = 100
# Shards a remote dataset starts downloading in the process that made the stream, as soon as
# it is made and at each set_epoch there: the epoch's first shards in its order, which are the
# first ones its workers read (the deal gives them out in order, one per worker first), so the
# downloads run while workers start and build their own clients.
EARLY_SHARDS = 4


def assign_spans(sizes: list[int], order: list[int], workers: int) -> list[list[Span]]:
    """Deal shards, in ``order``, to ``workers`` as ``(shard, start, stop)`` spans.

    Args:
        sizes: samples per shard.
        order: shard numbers in the order they are dealt.
        workers: number of workers (>= 1).

    Returns:
        Per worker, its spans of local sample indices; together they cover every sample once.
    """
    spans: list[list[Span]] = [[] for _ in range(workers)]
    if len(order) >= workers:
        load = [0] * workers
        for shard in order:
            w = min(range(workers), key=lambda k: (load[k], k))
            spans[w].append((shard, 0, sizes[shard]))
            load[w] += sizes[shard]
        return spans
    # Fewer shards than workers: cut the concatenation into equal contiguous ranges.
    return split_even([(s, 0, sizes[s]) for s in order], workers)


def split_even(spans: list[Span], parts: int) -> list[list[Span]]:
    """Cut the concatenation of ``spans`` into ``parts`` contiguous ranges whose sizes differ
    by at most one (earlier parts are never larger), as lists of spans."""
    out: list[list[Span]] = [[] for _ in range(parts)]
    total = sum(b - a for _, a, b in spans)
    bounds = [total * k // parts for k in range(parts + 1)]
    pos = 0
    for shard, start, stop in spans:
        lo, hi = pos, pos + stop - start
        for k in range(parts):
            a, b = max(lo, bounds[k]), min(hi, bounds[k + 1])
            if a < b:
                out[k].append((shard, start + a - lo, start + b - lo))
        pos = hi
    return out


def rank_span(sizes: list[int], order: list[int], world: World, *, pad: bool) -> list[Span]:
    """This rank's contiguous range of the epoch's run of samples (shards in ``order``).

    Every rank gets ``ceil(total / world_size)`` samples with ``pad`` (the range wraps to the
    start of the run, so at most ``world_size - 1`` samples are read twice per epoch) or
    ``total // world_size`` without it (the last ``total % world_size`` are skipped; with a
    shuffled shard order, different ones each epoch).
    """
    run = [(s, 0, sizes[s]) for s in order if sizes[s] > 0]
    offsets = list(accumulate((sizes[s] for s, _, _ in run), initial=0))
    total = offsets[-1]
    count = share_size(total, world.world_size, pad)  # RankSampler's shares, in spans
    out: list[Span] = []
    pos = world.rank * count
    end = pos + count
    while pos < end:  # positions past the run's end wrap to its start (pad)
        at = pos % total
        i = bisect_right(offsets, at) - 1
        shard, _, stop = run[i]
        first = at - offsets[i]
        take = min(stop - first, end - pos)
        out.append((shard, first, first + take))
        pos += take
    return out


class ShardStream(tud.IterableDataset[Any]):
    """Sequential, shard-shuffled iteration over a :class:`ShardDataset`.

    Create it with :meth:`ShardDataset.stream`. Every sample is yielded exactly once per epoch
    across the workers (and the ranks: see the module docstring for ``pad``). Call
    :meth:`set_epoch` (``stoker.DataLoader`` does, in every worker) for a new order each epoch;
    without it, each ``iter()`` in the same process advances the epoch.

    Raises:
        ConfigError: if ``buffer_size`` is not an int >= 1, ``world`` not a
            :class:`stoker.World` or ``pad`` not a bool.
    """

    #: Takes its rank's share itself, so ``stoker.DataLoader(..., distributed=True)`` accepts it.
    splits_by_rank = True

    def __init__(
        self,
        dataset: ShardSource,
        *,
        shuffle: bool,
        buffer_size: int,
        seed: int,
        world: World | None = None,
        pad: bool = True,
    ) -> None:
        if not isinstance(buffer_size, int) or buffer_size < 1:
            raise ConfigError(f"`buffer_size` must be an int >= 1. Found: {buffer_size!r}.")
        if world is not None and not isinstance(world, World):
            raise ConfigError(
                f"`world` must be a stoker.World or None (this process's). Found: {world!r}."
            )
        if not isinstance(pad, bool):
            raise ConfigError(f"`pad` must be True or False. Found: {pad!r}.")
        self.dataset = dataset
        self.shuffle = shuffle
        self.buffer_size = buffer_size
        self.seed = seed
        self.world = world
        self.pad = pad
        self._epoch: int | None = None
        self._iterations = 0
        self._sent_world: World | None = None
        self._maker = os.getpid()
        self._start_early(0)

    def __getstate__(self) -> dict[str, Any]:
        # Pickled in the main process for spawn workers, which may not see its process group
        # (an `init_process_group` with explicit rank and size leaves no environment behind).
        state = dict(self.__dict__)
        state["_sent_world"] = self.world or World.current()
        return state

    def set_epoch(self, epoch: int) -> None:
        """Fix the epoch that seeds the next iteration's order."""
        self._epoch = epoch
        if os.getpid() == self._maker:  # not in a worker: each plans its own shards
            self._start_early(epoch)

    def _start_early(self, epoch: int) -> None:
        """Start on the epoch's first shards (see :data:`EARLY_SHARDS`; a no-op locally)."""
        world = self.current_world()
        if world.distributed:  # this rank's run of samples starts elsewhere in the order
            first = [shard for shard, _, _ in self._spans(epoch, 0, 1, world)[:EARLY_SHARDS]]
        else:
            first = self._order(epoch)[:EARLY_SHARDS]
        if first:
            self.dataset.start_early(first)

    def _order(self, epoch: int) -> list[int]:
        """The epoch's shard order."""
        count = len(self.dataset.shard_sizes)
        if not self.shuffle:
            return list(range(count))
        return [int(i) for i in np.random.default_rng([self.seed, epoch]).permutation(count)]

    def current_world(self) -> World:
        """The ranks this stream splits over: ``world`` if given, else this process's."""
        if self.world is not None:
            return self.world
        here = World.current()
        if self._sent_world is not None and not here.distributed:
            return self._sent_world  # a spawn worker of a process that had a process group
        return here

    def __len__(self) -> int:
        """Samples this rank yields per epoch."""
        return share_size(len(self.dataset), self.current_world().world_size, self.pad)

    def _spans(self, epoch: int, worker: int, workers: int, world: World) -> list[Span]:
        sizes = list(self.dataset.shard_sizes)
        order = self._order(epoch)
        if not world.distributed:
            return assign_spans(sizes, order, workers)[worker]
        # Equal contiguous ranges per worker: the same counts on every rank, so the same steps.
        return split_even(rank_span(sizes, order, world, pad=self.pad), workers)[worker]

    def __iter__(self) -> Iterator[Any]:
        info = tud.get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        epoch = self._epoch if self._epoch is not None else self._iterations
        self._iterations += 1
        world = self.current_world()
        spans = self._spans(epoch, worker, workers, world)
        self.dataset.plan([shard for shard, _, _ in spans])  # a remote dataset prefetches them
        raw = self._raw(spans)
        if not self.shuffle:
            yield from (self.dataset.finish(s) for s in raw)
            return
        key = (
            [self.seed, epoch, worker]
            if not world.distributed
            else [self.seed, epoch, world.rank, worker]
        )
        rng = np.random.default_rng(key)
        buffer: list[dict[str, Any]] = []
        first = min(self.buffer_size, FIRST_YIELD_SAMPLES)
        grow = True
        for sample in raw:
            # Full buffer: one in, one out. Filling past `first`: two in, one out, so samples
            # flow (and a remote shard's download overlaps the decoding) while it fills.
            if len(buffer) < first or (len(buffer) < self.buffer_size and grow):
                buffer.append(sample)
                grow = False
                continue
            grow = True
            k = int(rng.integers(len(buffer)))
            buffer[k], sample = sample, buffer[k]
            yield self.dataset.finish(sample)
        rng.shuffle(buffer)
        yield from (self.dataset.finish(s) for s in buffer)

    def _raw(self, spans: list[Span]) -> Iterator[dict[str, Any]]:
        for shard, start, stop in spans:
            first = self.dataset.shard_range(shard).start
            for local in range(start, stop):
                yield self.dataset.buffered(first + local)
